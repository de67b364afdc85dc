"""``ModelJudge``: an LLM reads a case's rubric and the mesh's answer, and says pass or fail.

Only with a real model: ``create_judge`` returns None without a Gemini key, and the rubric is
then skipped with a note (a scripted model cannot judge prose).
"""

from __future__ import annotations

import json

from mesh._models.base import Model, ModelRequest
from mesh._types import Content, Part

__all__ = ["JUDGE_MODEL", "ModelJudge", "create_judge"]

#: The model that judges rubrics.
JUDGE_MODEL = "gemini-2.5-flash"

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


class ModelJudge:
    """Judges with ``model`` (temperature 0, JSON answer)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    async def judge(self, rubric: str, question: str, answer: str) -> tuple[bool, str]:
        prompt = f"Request:\n{question}\n\nAnswer:\n{answer}\n\nRubric:\n{rubric}"
        response = await self.model.generate(
            ModelRequest(
                system_instruction=_INSTRUCTION,
                contents=(Content(role="user", parts=(Part(text=prompt),)),),
                response_schema=_SCHEMA,
                temperature=0.0,
            )
        )
        try:
            verdict = json.loads(response.content.text)
            return bool(verdict["passed"]), str(verdict.get("reason") or "")
        except (ValueError, KeyError, TypeError):
            return (
                False,
                f"the judge's answer was not the JSON asked for: {response.content.text!r}",
            )

    async def aclose(self) -> None:
        await self.model.aclose()


def create_judge() -> ModelJudge | None:
    """A judge on Gemini when a key is configured (the environment's), else None."""
    from mesh._agent import Agent
    from mesh._models import gemini_configured, resolve_model

    if not gemini_configured():
        return None
    return ModelJudge(resolve_model(Agent(name="mesh-eval-judge", model=JUDGE_MODEL)))
