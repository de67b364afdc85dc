"""mesh: run LLM agents as separate services that find each other and delegate over A2A.

    from mesh import Agent, Runner, tool, skill, remote

The public names are imported lazily: ``import mesh`` stays cheap (the CLI, a node's start-up),
and a name's module is loaded on first use.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Agent": "mesh.agent",
    "AgentNotFound": "mesh.errors",
    "ConfigError": "mesh.errors",
    "Content": "mesh.types",
    "DiscoveryError": "mesh.errors",
    "Event": "mesh.events",
    "GeminiModel": "mesh.models.gemini",
    "InMemorySessionStore": "mesh.sessions.memory",
    "MaxModelCallsExceeded": "mesh.errors",
    "MeshError": "mesh.errors",
    "Model": "mesh.models.base",
    "ModelError": "mesh.errors",
    "ModelRequest": "mesh.models.base",
    "ModelResponse": "mesh.models.base",
    "Part": "mesh.types",
    "RemoteError": "mesh.errors",
    "Rule": "mesh.models.scripted",
    "RunResult": "mesh.runner",
    "Runner": "mesh.runner",
    "Script": "mesh.models.scripted",
    "ScriptedModel": "mesh.models.scripted",
    "Session": "mesh.sessions.base",
    "SessionStore": "mesh.sessions.base",
    "Skill": "mesh.skills",
    "SkillContext": "mesh.skills",
    "SqliteSessionStore": "mesh.sessions.sqlite",
    "Tool": "mesh.tools",
    "ToolContext": "mesh.tools",
    "ToolError": "mesh.errors",
    "Usage": "mesh.types",
    "llm_skill": "mesh.skills",
    "remote": "mesh.remote",
    "skill": "mesh.skills",
    "tool": "mesh.tools",
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


class _Facade(ModuleType):
    """Importing ``mesh.remote`` makes the import system bind ``mesh.remote`` to that module,
    hiding the function ``remote`` it exports: then ``from mesh import remote`` would give the
    module. Keep the public name bound to the function (``from mesh.remote import ...`` still
    reaches the module)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and _EXPORTS.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade


if TYPE_CHECKING:
    from mesh.agent import Agent
    from mesh.errors import (
        AgentNotFound,
        ConfigError,
        DiscoveryError,
        MaxModelCallsExceeded,
        MeshError,
        ModelError,
        RemoteError,
        ToolError,
    )
    from mesh.events import Event
    from mesh.models.base import Model, ModelRequest, ModelResponse
    from mesh.models.gemini import GeminiModel
    from mesh.models.scripted import Rule, Script, ScriptedModel
    from mesh.remote import remote
    from mesh.runner import Runner, RunResult
    from mesh.sessions.base import Session, SessionStore
    from mesh.sessions.memory import InMemorySessionStore
    from mesh.sessions.sqlite import SqliteSessionStore
    from mesh.skills import Skill, SkillContext, llm_skill, skill
    from mesh.tools import Tool, ToolContext, tool
    from mesh.types import Content, Part, Usage
