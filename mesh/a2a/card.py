"""The agent card: what a node publishes about its agent at ``/.well-known/agent-card.json``.

Skills become ``AgentSkill`` entries. A2A has no field for a skill's input/output JSON Schema,
so typed skills publish theirs through the extension ``urn:mesh:skill-schemas:v1`` in
``capabilities.extensions``::

    {"uri": "urn:mesh:skill-schemas:v1",
     "params": {"skills": {"score": {"input": {...JSON Schema...}, "output": {...}}}}}

The agent's instruction never appears in the card.
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

from mesh.agent import Agent
from mesh.skills import Skill

__all__ = [
    "CARD_CACHE_CONTROL",
    "JSON_MODE",
    "SKILL_SCHEMA_EXTENSION",
    "TEXT_MODE",
    "build_card",
    "card_from_dict",
    "card_to_dict",
    "skill_schemas",
]

SKILL_SCHEMA_EXTENSION = "urn:mesh:skill-schemas:v1"
CARD_CACHE_CONTROL = "public, max-age=30"
JSON_MODE = "application/json"
TEXT_MODE = "text/plain"
BEARER_SCHEME = "bearer"


def _agent_skill(skill: Skill) -> AgentSkill:
    modes = [JSON_MODE] if skill.typed else [TEXT_MODE]
    return AgentSkill(
        id=skill.id,
        name=skill.name,
        description=skill.description,
        tags=list(skill.tags),
        examples=list(skill.examples),
        input_modes=modes,
        output_modes=modes,
    )


def build_card(agent: Agent, url: str, *, bearer: bool = False) -> AgentCard:
    """The public card of ``agent`` served at base ``url`` (JSON-RPC at ``url + '/'``).

    ``bearer``: the node requires ``Authorization: Bearer <MESH_TOKEN>`` on JSON-RPC calls;
    the card declares it so any A2A client knows what to send (never the token itself).
    """
    skills = agent.all_skills
    schemas = {
        s.id: {"input": s.input_schema(), "output": s.output_schema()} for s in skills if s.typed
    }
    params = Struct()
    params.update({"skills": schemas})
    extension = AgentExtension(
        uri=SKILL_SCHEMA_EXTENSION,
        description="JSON Schemas of the typed skills' input (data part) and output (artifact).",
        required=False,
        params=params,
    )
    modes = sorted({m for s in skills for m in ([JSON_MODE] if s.typed else [TEXT_MODE])})
    card = AgentCard(
        name=agent.name,
        description=agent.description or agent.name,
        version=agent.version,
        supported_interfaces=[
            AgentInterface(url=url.rstrip("/"), protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, extensions=[extension]),
        default_input_modes=modes,
        default_output_modes=modes,
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
    """The card as the camelCase JSON the well-known route serves."""
    return dict(MessageToDict(card))


def card_from_dict(data: dict[str, Any]) -> AgentCard:
    """Parse card JSON (unknown fields ignored)."""
    card = AgentCard()
    ParseDict(data, card, ignore_unknown_fields=True)
    return card


def skill_schemas(card: AgentCard | dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{skill_id: {"input": schema, "output": schema}}`` from a card's mesh extension, or {}."""
    data = card if isinstance(card, dict) else card_to_dict(card)
    for ext in data.get("capabilities", {}).get("extensions", []) or []:
        if ext.get("uri") == SKILL_SCHEMA_EXTENSION:
            skills = (ext.get("params") or {}).get("skills") or {}
            return {str(k): dict(v) for k, v in skills.items()}
    return {}
