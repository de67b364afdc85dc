"""Models: the ``Model`` interface, the offline ``ScriptedModel`` and (lazily) ``GeminiModel``.

``resolve_model`` turns an agent's ``model`` setting into a ``Model``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mesh._models.base import Model, ModelRequest, ModelResponse, ToolDeclaration

if TYPE_CHECKING:
    from mesh._agent import Agent

__all__ = [
    "KEY_VARIABLES",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ToolDeclaration",
    "gemini_configured",
    "resolve_model",
]

log = logging.getLogger("mesh._models")

#: Any of these (non-empty) switches a named model onto Gemini.
KEY_VARIABLES = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
_VERTEX = ("GOOGLE_GENAI_USE_VERTEXAI",)


def gemini_configured(env: Mapping[str, str]) -> bool:
    """Whether ``env`` holds a Gemini API key or selects Vertex AI."""
    return any(env.get(name) for name in KEY_VARIABLES) or _vertex(env)


def _vertex(env: Mapping[str, str]) -> bool:
    return any(env.get(name, "").strip().lower() in {"1", "true", "yes"} for name in _VERTEX)


def resolve_model(agent: Agent, env: Mapping[str, str]) -> Model:
    """The ``Model`` an agent runs on.

    A ``Model`` instance passes through. A model name becomes ``GeminiModel(name)`` when Gemini
    is configured in ``env`` (``GOOGLE_API_KEY``, ``GEMINI_API_KEY`` or
    ``GOOGLE_GENAI_USE_VERTEXAI``); otherwise the agent runs offline on
    ``ScriptedModel(agent.script)`` (an echo script when it has none), and one log line says so.
    """
    if isinstance(agent.model, Model):
        return agent.model
    name = agent.model_name
    if name is not None and gemini_configured(env):
        from mesh._models.gemini import GeminiModel  # imports google.genai: only when needed

        api_key = next((env[k] for k in KEY_VARIABLES if env.get(k)), None)
        base_url = env.get("GOOGLE_GEMINI_BASE_URL") or None
        if _vertex(env):
            project = env.get("GOOGLE_CLOUD_PROJECT") or None
            # Vertex takes either project/location (ADC credentials) or an express-mode key.
            return GeminiModel(
                name,
                vertex=True,
                project=project,
                location=env.get("GOOGLE_CLOUD_LOCATION") or None,
                api_key=None if project else api_key,
            )
        return GeminiModel(name, api_key=api_key, base_url=base_url)
    from mesh._models.scripted import ScriptedModel

    if agent.script is None:
        doing = "echoes each message back (it has no offline script: Agent(script=...))"
    else:
        doing = f"follows its offline script ({len(agent.script.rules)} rules)"
    log.info(
        "%s runs offline: no GOOGLE_API_KEY/GEMINI_API_KEY, so instead of %s it %s; set "
        "GOOGLE_API_KEY for the real model",
        agent.name,
        name or "a Gemini model",
        doing,
    )
    return ScriptedModel(agent.script)
