"""The rubric judge: a model reads a case's rubric and the mesh's answer, and says pass or fail.

Only with a real model: ``create_judge`` gives a ``ModelJudge`` on Gemini (``gemini-2.5-flash``,
the Gemini model settings of the environment: ``GOOGLE_API_KEY`` or ``GEMINI_API_KEY``, Vertex
AI, ``GOOGLE_GEMINI_BASE_URL``), else an ``Unjudged`` that says why the rubric is skipped: no
key, or ``MESH_MODEL=scripted`` (a scripted model cannot judge prose, and an offline run makes
no model calls).

A verdict is ``(passed, reason)``; ``passed`` is None when the rubric was not judged.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mesh._models.base import Model, ModelRequest
from mesh._types import Content, Part

if TYPE_CHECKING:
    from mesh._settings import ModelSettings

__all__ = ["JUDGE_MODEL", "NO_KEY", "ModelJudge", "Unjudged", "create_judge"]

#: The model that judges rubrics.
JUDGE_MODEL = "gemini-2.5-flash"

#: Why a rubric is skipped when no Gemini key is configured.
NO_KEY = "no Gemini key (set GOOGLE_API_KEY)"
_OFFLINE = (
    f"MESH_MODEL=scripted runs offline (unset it, with a Gemini key set, to judge rubrics with "
    f"{JUDGE_MODEL})"
)

_INSTRUCTION = (
    "You grade an AI agent's answer against a rubric. Read the user's request, the answer and "
    "the rubric; decide whether the answer meets every point of the rubric. Reply with JSON "
    '{"passed": true|false, "reason": "<one sentence>"}.'
)
_SCHEMA = {
    "type": "object",
    "properties": {"passed": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["passed", "reason"],
}
_SHOWN = 200


class ModelJudge:
    """Judges with ``model`` (temperature 0, a JSON verdict). A model error propagates (a
    ``MeshError``); an answer that is not the verdict asked for fails the rubric, saying so."""

    def __init__(self, model: Model) -> None:
        self.model = model

    async def judge(self, rubric: str, question: str, answer: str) -> tuple[bool | None, str]:
        prompt = f"Request:\n{question}\n\nAnswer:\n{answer}\n\nRubric:\n{rubric}"
        response = await self.model.generate(
            ModelRequest(
                system_instruction=_INSTRUCTION,
                contents=(Content(role="user", parts=(Part(text=prompt),)),),
                response_schema=_SCHEMA,
                temperature=0.0,
            )
        )
        text = response.content.text
        try:
            verdict = json.loads(text)
        except ValueError:
            verdict = None
        passed = verdict.get("passed") if isinstance(verdict, dict) else None
        # A string "false" is truthy: only a JSON boolean is a verdict.
        if not isinstance(passed, bool):
            shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
            finish = f", finish reason {response.finish_reason}" if response.finish_reason else ""
            return False, (
                f'the judge\'s answer was not the verdict asked for ({{"passed": true|false, '
                f'"reason": ...}}): {shown!r}{finish}'
            )
        reason = verdict.get("reason")
        return passed, str(reason) if reason else "(the judge gave no reason)"

    async def aclose(self) -> None:
        await self.model.aclose()


class Unjudged:
    """No judge: every rubric is skipped with ``why`` (a note in the report, never a pass)."""

    def __init__(self, why: str) -> None:
        self.why = why

    async def judge(self, rubric: str, question: str, answer: str) -> tuple[bool | None, str]:
        return None, self.why

    async def aclose(self) -> None:
        return None


def create_judge(settings: ModelSettings | None = None) -> ModelJudge | Unjudged:
    """The judge the model ``settings`` allow (None: the environment's): ``JUDGE_MODEL`` on
    Gemini when a key (or Vertex AI) is configured and the run is not offline."""
    from mesh._agent import Agent
    from mesh._models import resolve_model
    from mesh._settings import environment

    settings = settings if settings is not None else environment().models
    if settings.offline:
        return Unjudged(_OFFLINE)
    if not settings.gemini:
        return Unjudged(NO_KEY)
    return ModelJudge(resolve_model(Agent(name="mesh-eval-judge", model=JUDGE_MODEL), settings))
