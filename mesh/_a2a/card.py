"""The agent card: what a node publishes about its agent at ``/.well-known/agent-card.json``.

Skills become ``AgentSkill`` entries. A2A has no field for a skill's input/output JSON Schema,
nor for the agent's own tags, so they travel in the extension ``urn:mesh:skill-schemas:v1`` in
``capabilities.extensions``::

    {"uri": "urn:mesh:skill-schemas:v1",
     "params": {"skills": {"score": {"input": {...JSON Schema...}, "output": {...}}},
                "tags": ["credit", "bureau"]}}

The params are a protobuf ``Struct``: key order and integers do not survive it, so schemas go
out with ``propertyOrdering`` and come back through ``mesh._schema_order.restore``
(``card_to_dict`` and ``skill_schemas`` do it). The agent's instruction never appears in the card.

A skill that may wait for its caller's input (``@skill(asks=True)``) has ``"asks": true`` in its
entry, one whose calls take minutes (``@skill(long_running=True)``) ``"long_running": true``. Every card also declares the extension ``urn:mesh:tasks:v1`` (``mesh._asks``): the node
speaks its shapes of tasks that wait (the question status message, the resume message).
"""

from __future__ import annotations

from typing import Any

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct

from mesh._agent import Agent
from mesh._asks import TASKS_EXTENSION
from mesh._schema_order import restore, with_property_order
from mesh._skills import Skill

__all__ = [
    "CARD_CACHE_CONTROL",
    "JSON_MODE",
    "REST_PREFIX",
    "SKILL_SCHEMA_EXTENSION",
    "TEXT_MODE",
    "agent_tags",
    "build_card",
    "card_from_dict",
    "card_to_dict",
    "interfaces",
    "skill_schemas",
]

SKILL_SCHEMA_EXTENSION = "urn:mesh:skill-schemas:v1"
CARD_CACHE_CONTROL = "public, max-age=30"
JSON_MODE = "application/json"
TEXT_MODE = "text/plain"
BEARER_SCHEME = "bearer"
#: Where a node serves A2A's HTTP+JSON (REST) binding: ``{url}/a2a/rest/message:send``...
#: (JSON-RPC is at ``{url}/``). A prefix, so the REST paths never meet the node's own routes.
REST_PREFIX = "/a2a/rest"


_TASKS = AgentExtension(
    uri=TASKS_EXTENSION,
    description="Tasks that wait for input: the question in the status message (a text part, "
    "and a data part application/schema+json for a structured answer), answered by a message "
    "naming the task.",
    required=False,
)


def _agent_skill(skill: Skill) -> AgentSkill:
    return AgentSkill(
        id=skill.id,
        name=skill.name,
        description=skill.description,
        tags=list(skill.tags),
        examples=list(skill.examples),
        # What the skill takes and answers (mesh._skills: Skill.input_modes, output_modes).
        input_modes=skill.input_modes,
        output_modes=skill.output_modes,
    )


def interfaces(url: str) -> list[AgentInterface]:
    """The interfaces of a node at base ``url``: JSON-RPC first (the SDK's client takes the
    first binding it supports, and every client supports JSON-RPC), then HTTP+JSON."""
    base = url.rstrip("/")
    return [
        AgentInterface(url=base, protocol_binding="JSONRPC", protocol_version="1.0"),
        AgentInterface(
            url=base + REST_PREFIX, protocol_binding="HTTP+JSON", protocol_version="1.0"
        ),
    ]


def build_card(agent: Agent, url: str, *, bearer: bool = False) -> AgentCard:
    """The public card of ``agent`` served at base ``url`` (JSON-RPC at ``url + '/'``, REST at
    ``url + REST_PREFIX``).

    ``bearer``: the node requires ``Authorization: Bearer <MESH_TOKEN>`` on JSON-RPC calls;
    the card declares it so any A2A client knows what to send (never the token itself).
    """
    skills = agent.all_skills
    schemas = {
        s.id: {
            "input": with_property_order(s.input_schema() or {}),
            "output": with_property_order(s.output_schema() or {}),
            **({"asks": True} if s.asks else {}),
            **({"long_running": True} if s.long_running else {}),
        }
        for s in skills
        if s.typed
    }
    params = Struct()
    params.update({"skills": schemas, "tags": list(agent.tags)})
    extension = AgentExtension(
        uri=SKILL_SCHEMA_EXTENSION,
        description="JSON Schemas of the typed skills' input (data part) and output "
        "(artifact), and the agent's tags.",
        required=False,
        params=params,
    )
    inputs = sorted({m for s in skills for m in s.input_modes})
    outputs = sorted({m for s in skills for m in s.output_modes})
    card = AgentCard(
        name=agent.name,
        description=agent.description or agent.name,
        version=agent.version,
        supported_interfaces=interfaces(url),
        capabilities=AgentCapabilities(streaming=True, extensions=[extension, _TASKS]),
        default_input_modes=inputs,
        default_output_modes=outputs,
        skills=[_agent_skill(s) for s in skills],
    )
    if bearer:
        card.security_schemes[BEARER_SCHEME].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer", description="the mesh token (MESH_TOKEN)"
                )
            )
        )
        card.security_requirements.append(
            SecurityRequirement(schemes={BEARER_SCHEME: StringList(list=[])})
        )
    return card


def card_to_dict(card: AgentCard) -> dict[str, Any]:
    """The card as camelCase JSON, with the mesh extension's schemas as their models declare
    them (property order, integers; ``propertyOrdering`` kept, for whoever parses it again)."""
    data = dict(MessageToDict(card))
    params = _mesh_params(data)
    if params is not None and isinstance(params.get("skills"), dict):
        rest = {k: v for k, v in params.items() if k != "skills"}
        # The hints stay: this JSON may be parsed into a card again (the registry stores it).
        skills = _restored(params["skills"], keep_hint=True)
        params.clear()
        params.update({"skills": skills, **rest})
    return data


def card_from_dict(data: dict[str, Any]) -> AgentCard:
    """Parse card JSON (unknown fields ignored)."""
    card = AgentCard()
    ParseDict(data, card, ignore_unknown_fields=True)
    return card


def skill_schemas(card: AgentCard | dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{skill_id: {"input": schema, "output": schema}}`` from a card's mesh extension, or {}.

    Schemas come back as declared (see ``mesh._schema_order.restore``), whatever JSON they were
    read from.
    """
    params = _mesh_params(card if isinstance(card, dict) else dict(MessageToDict(card)))
    skills = (params or {}).get("skills")
    return _restored(skills) if isinstance(skills, dict) else {}


def agent_tags(card: AgentCard | dict[str, Any]) -> list[str]:
    """The agent's own tags, from the card's mesh extension (skills carry their own)."""
    params = _mesh_params(card if isinstance(card, dict) else dict(MessageToDict(card)))
    tags = (params or {}).get("tags")
    return [str(t) for t in tags] if isinstance(tags, list) else []


def _mesh_params(data: dict[str, Any]) -> dict[str, Any] | None:
    capabilities = data.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    for ext in extensions if isinstance(extensions, list) else []:
        if isinstance(ext, dict) and ext.get("uri") == SKILL_SCHEMA_EXTENSION:
            params = ext.get("params")
            return params if isinstance(params, dict) else None
    return None


def _restored(skills: dict[str, Any], *, keep_hint: bool = False) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for sid, entry in skills.items():
        if isinstance(entry, dict):
            keys = [*(k for k in ("input", "output") if k in entry), *sorted(entry)]
            out[str(sid)] = {
                k: restore(entry[k], keep_hint=keep_hint)
                if isinstance(entry[k], dict)
                else entry[k]
                for k in dict.fromkeys(keys)
            }
    return out
