"""``/introspect``: what this node is made of, for operators and the registry's page.

    {"agent": {name, description, version, model, tools: [...], skills: [...]},
     "runtime": {mesh_version, python, pid, uptime_s, url, data_dir, store},
     "peers": [...], "policy": {"allow": [...], "otherwise": ...} or null}

``policy`` is the call policy in force for this agent (``MESH_ALLOW``, ``mesh._policy``): its
rules, or null when every admitted caller may call every skill. Never secrets: no keys, no environment. The instruction only with
``MESH_INTROSPECT_INSTRUCTION=1``. A toolset that stands for a peer agent (e.g. ``remote(...)``)
describes itself through ``describe() -> dict`` and is listed under ``peers``.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Protocol, runtime_checkable

from mesh._agent import Agent
from mesh._errors import ConfigError
from mesh._models.base import Model
from mesh._policy import CallPolicy
from mesh._tools import Tool, Toolset, as_tool

__all__ = ["Describable", "describe_agent", "describe_tool", "introspect"]


@runtime_checkable
class Describable(Protocol):
    """Anything that can describe itself for /introspect (remote toolsets, peers)."""

    def describe(self) -> dict[str, Any]: ...


def describe_tool(item: Any) -> dict[str, Any]:
    """One tool: name, description and parameter schema."""
    try:
        t = as_tool(item)
    except ConfigError:
        return {"name": getattr(item, "__name__", type(item).__name__), "kind": "unknown"}
    return {"name": t.name, "description": t.description, "parameters": t.parameters}


def _is_peer(item: Any) -> bool:
    return isinstance(item, Toolset) and not isinstance(item, Tool)


def describe_agent(
    agent: Agent, model: Model | None, *, show_instruction: bool = False
) -> dict[str, Any]:
    tree: dict[str, Any] = {
        "name": agent.name,
        "description": agent.description,
        "version": agent.version,
        "tags": list(agent.tags),
        "model": model.describe() if model is not None else None,
        "max_model_calls": agent.max_model_calls if agent.is_llm else None,
        "tools": [describe_tool(t) for t in agent.tools if not _is_peer(t)],
        "skills": [
            {
                "id": s.id,
                "name": s.name,
                "description": s.description,
                "kind": "text" if not s.typed else ("llm" if s.llm else "function"),
                "tags": list(s.tags),
                "input_schema": s.input_schema(),
                "output_schema": s.output_schema(),
            }
            for s in agent.all_skills
        ],
        "metadata": dict(agent.metadata),
    }
    if show_instruction:
        tree["instruction"] = agent.instruction
    return tree


def introspect(
    agent: Agent,
    model: Model | None,
    runtime: dict[str, Any],
    *,
    show_instruction: bool = False,
    policy: CallPolicy | None = None,
) -> dict[str, Any]:
    """The whole /introspect document."""
    peers: list[dict[str, Any]] = []
    for item in agent.tools:
        if _is_peer(item):
            if isinstance(item, Describable):
                peers.append(item.describe())
            else:
                peers.append({"kind": type(item).__name__})
    return {
        "agent": describe_agent(agent, model, show_instruction=show_instruction),
        "runtime": {
            "python": platform.python_version(),
            "pid": os.getpid(),
            **runtime,
        },
        "peers": peers,
        "policy": policy.describe() if policy is not None else None,
    }
