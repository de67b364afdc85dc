"""Models: the ``Model`` interface, the offline ``ScriptedModel`` and (lazily) ``GeminiModel``.

``resolve_model`` turns an agent's ``model`` setting into a ``Model``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mesh._errors import ConfigError
from mesh._models.base import Model, ModelRequest, ModelResponse, ToolDeclaration

if TYPE_CHECKING:
    from mesh._agent import Agent
    from mesh._settings import ModelSettings

__all__ = [
    "KEY_VARIABLES",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ToolDeclaration",
    "check_model_choice",
    "gemini_configured",
    "resolve_model",
]

log = logging.getLogger("mesh._models")

#: Any of these (non-empty) switches a named model onto Gemini.
KEY_VARIABLES = ("GOOGLE_API_KEY", "GEMINI_API_KEY")


def _settings(config: ModelSettings | Mapping[str, str] | None) -> ModelSettings:
    from mesh._settings import MeshSettings, ModelSettings, environment

    if isinstance(config, ModelSettings):
        return config
    if config is None:
        return environment().models
    return MeshSettings.from_env(config).models


def gemini_configured(config: ModelSettings | Mapping[str, str] | None = None) -> bool:
    """Whether ``config`` (model settings, or a mapping of variables) holds a Gemini API key or
    selects Vertex AI; None: the process environment's."""
    return _settings(config).gemini


def check_model_choice(agent: Agent, config: ModelSettings | Mapping[str, str] | None) -> None:
    """``ConfigError`` when ``agent`` names a model that would run offline for want of a key
    while a real model is required (``ModelSettings.require``): a production node missing its
    secret must not answer canned text and look healthy."""
    settings = _settings(config)
    name = agent.model_name
    if isinstance(agent.model, Model) or name is None or settings.gemini or settings.offline:
        return
    if settings.require:
        raise ConfigError(
            f"agent {agent.name!r} names the model {name!r} but no GOOGLE_API_KEY (or "
            "GEMINI_API_KEY, GOOGLE_GENAI_USE_VERTEXAI) is set, and a real model is required "
            "(MESH_REQUIRE_MODEL=1, or the node listens beyond loopback): set GOOGLE_API_KEY, "
            "or run it offline on purpose with MESH_MODEL=scripted (mesh serve --offline)"
        )


def resolve_model(agent: Agent, env: ModelSettings | Mapping[str, str] | None = None) -> Model:
    """The ``Model`` an agent runs on.

    A ``Model`` instance passes through. A model name becomes ``GeminiModel(name)`` when Gemini
    is configured (``GOOGLE_API_KEY``, ``GEMINI_API_KEY`` or ``GOOGLE_GENAI_USE_VERTEXAI``) in
    ``env``: model settings, a mapping of variables, or None for the process environment (read
    once, see ``mesh._settings.environment``). Otherwise the agent runs offline on
    ``ScriptedModel(agent.script)`` (an echo script when it has none), and one log line says
    so; unless a real model is required (``check_model_choice``): then ``ConfigError``.
    """
    if isinstance(agent.model, Model):
        return agent.model
    settings = _settings(env)
    check_model_choice(agent, settings)
    name = agent.model_name
    if name is not None and settings.gemini and not settings.offline:
        from mesh._models.gemini import GeminiModel  # imports google.genai: only when needed

        api_key = settings.api_key.get_secret_value() if settings.api_key else None
        if settings.vertex:
            # Vertex takes either project/location (ADC credentials) or an express-mode key.
            return GeminiModel(
                name,
                vertex=True,
                project=settings.project,
                location=settings.location,
                api_key=None if settings.project else api_key,
            )
        return GeminiModel(name, api_key=api_key, base_url=settings.base_url)
    from mesh._models.scripted import ScriptedModel

    if agent.script is None:
        doing = "echoes each message back (it has no offline script: Agent(script=...))"
    else:
        doing = f"follows its offline script ({len(agent.script.rules)} rules)"
    why = "MESH_MODEL=scripted" if settings.offline else "no GOOGLE_API_KEY/GEMINI_API_KEY"
    log.info(
        "%s runs offline: %s, so instead of %s it %s; set GOOGLE_API_KEY for the real model",
        agent.name,
        why,
        name or "a Gemini model",
        doing,
    )
    return ScriptedModel(agent.script)
