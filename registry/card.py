"""Fetching and validating an instance's agent card at registration.

The registry never trusts what a node says about itself beyond its URL and agent name: it reads
the card from the instance, parses it with the A2A card parser (``mesh.a2a.card``), checks the
name, and derives skills, tags and the typed-skill schemas (extension ``urn:mesh:skill-schemas:v1``).
"""

from __future__ import annotations

from typing import Any

import httpx

from mesh.a2a.card import card_from_dict, card_to_dict, skill_schemas
from registry.store import AgentRecord, SkillRecord

__all__ = ["CardRejected", "agent_record", "fetch_card"]

# A card is a few KB; anything far bigger is not a card.
_MAX_CARD_BYTES = 1_000_000


class CardRejected(Exception):
    """The card could not be fetched or is not acceptable. The message says why."""


async def fetch_card(http: httpx.AsyncClient, base_url: str, card_path: str) -> dict[str, Any]:
    """GET the card JSON from ``base_url + card_path``."""
    url = base_url.rstrip("/") + card_path
    try:
        response = await http.get(url, headers={"A2A-Version": "1.0"})
    except httpx.HTTPError as exc:
        detail = str(exc) or type(exc).__name__
        raise CardRejected(f"could not fetch the agent card from {url}: {detail}") from exc
    if response.status_code != 200:
        raise CardRejected(
            f"could not fetch the agent card from {url}: HTTP {response.status_code}"
        )
    if len(response.content) > _MAX_CARD_BYTES:
        raise CardRejected(f"the agent card at {url} is larger than {_MAX_CARD_BYTES} bytes")
    try:
        data = response.json()
    except ValueError as exc:
        raise CardRejected(f"the agent card at {url} is not JSON") from exc
    if not isinstance(data, dict):
        raise CardRejected(f"the agent card at {url} is not a JSON object")
    return data


def agent_record(data: dict[str, Any], *, expected_name: str, now: float) -> AgentRecord:
    """Validate card JSON and derive the agent record. Raises ``CardRejected``."""
    try:
        card = card_to_dict(card_from_dict(data))
    except Exception as exc:  # protobuf's ParseError and friends: the card does not parse
        raise CardRejected(f"the agent card does not parse as an A2A 1.0 card: {exc}") from exc
    name = card.get("name", "")
    if name != expected_name:
        raise CardRejected(
            f"the agent card names the agent {name!r} but the registration says {expected_name!r}"
        )
    schemas = skill_schemas(card)
    skills = []
    for raw in card.get("skills", []):
        sid = str(raw.get("id", ""))
        if not sid:
            raise CardRejected("the agent card has a skill without an id")
        schema = schemas.get(sid, {})
        skills.append(
            SkillRecord(
                id=sid,
                name=str(raw.get("name", sid)),
                description=str(raw.get("description", "")),
                tags=tuple(str(t) for t in raw.get("tags", [])),
                input_schema=_schema(schema.get("input")),
                output_schema=_schema(schema.get("output")),
            )
        )
    return AgentRecord(
        name=name,
        description=str(card.get("description", "")),
        version=str(card.get("version", "")),
        card=card,
        skills=tuple(skills),
        updated_at=now,
        agent_tags=tuple(agent_tags(card)),
    )


def _schema(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, dict) else None
