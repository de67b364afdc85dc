"""mesh: run LLM agents as separate services that find each other and delegate over A2A.

    from mesh import Agent, Runner, tool, skill, remote

Everything a user imports is exported here; the modules behind it are private (``mesh._*``, as
httpx does it) and may change between releases. The names are imported lazily: ``import mesh``
stays cheap (the CLI, a node's start-up), and a name's module is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "A2APeer": "mesh._a2a.client",
    "Agent": "mesh._agent",
    "Artifact": "mesh._artifacts",
    "Ask": "mesh._tools",
    "AgentNotFound": "mesh._errors",
    "BreakerBoard": "mesh._resilience",
    "Call": "mesh._models.scripted",
    "CircuitOpen": "mesh._errors",
    "ConfigError": "mesh._errors",
    "Content": "mesh._types",
    "Database": "mesh._sqlite",
    "DeadlineExceeded": "mesh._errors",
    "DiscoveryBackend": "mesh._discovery.base",
    "DiscoveryClient": "mesh._discovery.client",
    "DiscoveryError": "mesh._errors",
    "DiscoveryUnreachable": "mesh._errors",
    "Event": "mesh._events",
    "File": "mesh._artifacts",
    "GeminiModel": "mesh._models.gemini",
    "InMemorySessionStore": "mesh._sessions.memory",
    "Instance": "mesh._discovery.base",
    "MaxModelCallsExceeded": "mesh._errors",
    "MeshError": "mesh._errors",
    "MeshSettings": "mesh._settings",
    "Model": "mesh._models.base",
    "ModelError": "mesh._errors",
    "ModelRateLimited": "mesh._errors",
    "ModelRequest": "mesh._models.base",
    "ModelResponse": "mesh._models.base",
    "ModelSettings": "mesh._settings",
    "Node": "mesh._node",
    "NodeMetrics": "mesh._metrics",
    "NodeSettings": "mesh._settings",
    "Part": "mesh._types",
    "PendingTurn": "mesh._pending",
    "Question": "mesh._asks",
    "Registrar": "mesh._discovery.registrar",
    "Registration": "mesh._discovery.base",
    "RemoteAgent": "mesh._remote",
    "RemoteError": "mesh._errors",
    "ReplayDiverged": "mesh._errors",
    "RetryPolicy": "mesh._resilience",
    "Rule": "mesh._models.scripted",
    "RunObserver": "mesh._runner",
    "RunResult": "mesh._runner",
    "Runner": "mesh._runner",
    "SchemaViolation": "mesh._errors",
    "SessionWaiting": "mesh._errors",
    "Script": "mesh._models.scripted",
    "ScriptedModel": "mesh._models.scripted",
    "Session": "mesh._sessions.base",
    "SessionStore": "mesh._sessions.base",
    "Skill": "mesh._skills",
    "SkillContext": "mesh._skills",
    "SkillInputError": "mesh._errors",
    "SkillOutputError": "mesh._errors",
    "SqliteSessionStore": "mesh._sessions.sqlite",
    "TaskResult": "mesh._a2a.client",
    "Tool": "mesh._tools",
    "ToolContext": "mesh._tools",
    "ToolError": "mesh._errors",
    "TurnSuspended": "mesh._pending",
    "UnknownInstance": "mesh._errors",
    "Usage": "mesh._types",
    "agent_tags": "mesh._a2a.card",
    "call_with_failover": "mesh._resilience",
    "create_app": "mesh._node",
    "create_backend": "mesh._discovery",
    "current_context": "mesh._tools",
    "llm_skill": "mesh._skills",
    "remote": "mesh._remote",
    "resolve_model": "mesh._models",
    "skill": "mesh._skills",
    "skill_schemas": "mesh._a2a.card",
    "tool": "mesh._tools",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from mesh._a2a.card import agent_tags, skill_schemas
    from mesh._a2a.client import A2APeer, TaskResult
    from mesh._agent import Agent
    from mesh._artifacts import Artifact, File
    from mesh._asks import Question
    from mesh._discovery import create_backend
    from mesh._discovery.base import DiscoveryBackend, Instance, Registration
    from mesh._discovery.client import DiscoveryClient
    from mesh._discovery.registrar import Registrar
    from mesh._errors import (
        AgentNotFound,
        CircuitOpen,
        ConfigError,
        DeadlineExceeded,
        DiscoveryError,
        DiscoveryUnreachable,
        MaxModelCallsExceeded,
        MeshError,
        ModelError,
        ModelRateLimited,
        RemoteError,
        ReplayDiverged,
        SchemaViolation,
        SessionWaiting,
        SkillInputError,
        SkillOutputError,
        ToolError,
        UnknownInstance,
    )
    from mesh._events import Event
    from mesh._metrics import NodeMetrics
    from mesh._models import resolve_model
    from mesh._models.base import Model, ModelRequest, ModelResponse
    from mesh._models.gemini import GeminiModel
    from mesh._models.scripted import Call, Rule, Script, ScriptedModel
    from mesh._node import Node, create_app
    from mesh._pending import PendingTurn, TurnSuspended
    from mesh._remote import RemoteAgent, remote
    from mesh._resilience import BreakerBoard, RetryPolicy, call_with_failover
    from mesh._runner import Runner, RunObserver, RunResult
    from mesh._sessions.base import Session, SessionStore
    from mesh._sessions.memory import InMemorySessionStore
    from mesh._sessions.sqlite import SqliteSessionStore
    from mesh._settings import MeshSettings, ModelSettings, NodeSettings
    from mesh._skills import Skill, SkillContext, llm_skill, skill
    from mesh._sqlite import Database
    from mesh._tools import Ask, Tool, ToolContext, current_context, tool
    from mesh._types import Content, Part, Usage
