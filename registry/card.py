"""Fetching and validating an instance's agent card at registration.

The registry never trusts what a node says about itself beyond its URL and agent name: it reads
the card from the instance, parses it with the A2A card parser (``mesh._a2a.card``), checks the
name, and derives skills, tags and the typed-skill schemas (extension ``urn:mesh:skill-schemas:v1``).
With the mesh's trust root (``MESH_KEYS``), the card must also be signed by a key the root
certifies for the agent it names, and name the registered URL among its interfaces
(``check_signature``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from mesh._a2a.card import agent_tags, card_from_dict, card_to_dict, skill_schemas
from mesh._a2a.signing import verify_card
from mesh._errors import PeerRefused
from mesh._keys import TrustRoot
from mesh._netguard import AddressRefused
from mesh._outbound import FetchFailed, bounded_get
from registry.store import AgentRecord, SkillRecord
from registry.wire import card_path_problem

__all__ = [
    "MAX_CONCURRENT_CARD_FETCHES",
    "CardRejected",
    "CardUntrusted",
    "UrlRefused",
    "agent_record",
    "check_signature",
    "fetch_card",
]

log = logging.getLogger("registry.card")

# A card is a few KB; anything far bigger is not a card.
_MAX_CARD_BYTES = 1_000_000
# Registrations fetching (card, /health) at once; more wait their turn (``registry.api``).
MAX_CONCURRENT_CARD_FETCHES = 32


class CardRejected(Exception):
    """The card could not be fetched or is not acceptable. The message says why, in fixed
    words: it never repeats what the fetched URL answered (the registry's log has that)."""

    code = "invalid_card"


class UrlRefused(CardRejected):
    """The URL's host is outside the networks this registry may contact. The message names the
    ``url`` field, the allowed networks and how to widen them."""

    code = "url_refused"


class CardUntrusted(CardRejected):
    """The card is not signed under this registry's trust root (unsigned, another mesh's root,
    altered, expired, signed for another agent) or its signature vouches for another URL."""

    code = "untrusted_card"


def check_signature(data: dict[str, Any], root: TrustRoot, url: str) -> None:
    """``CardUntrusted`` unless the card JSON ``data`` is signed by a key ``root`` certifies for
    the agent it names, and lists ``url`` (the registered URL) among its interfaces."""
    try:
        verify_card(data, root)
    except PeerRefused as exc:
        log.info("card at %s refused: %s", url, exc)
        raise CardUntrusted(
            f"{exc}; this registry accepts only cards signed under the mesh's root: give the "
            "node its keys (`mesh keys issue DIR AGENT`, then MESH_KEYS)"
        ) from None
    interfaces = data.get("supportedInterfaces")
    listed = {
        str(i.get("url", "")).rstrip("/")
        for i in (interfaces if isinstance(interfaces, list) else [])
        if isinstance(i, dict)
    }
    if url.rstrip("/") not in listed:
        raise CardUntrusted(
            f"its signed agent card is that of the instance at "
            f"{', '.join(sorted(listed)) or 'no address'}, not {url}: register the URL the "
            "card names (the node's MESH_PUBLIC_URL)"
        )


async def fetch_card(
    http: httpx.AsyncClient, base_url: str, card_path: str, *, timeout_s: float | None = None
) -> dict[str, Any]:
    """GET the card JSON from ``base_url + card_path``: the whole answer within ``timeout_s``
    (default: the client's own timeout, i.e. the registry's card timeout) and 1 MB.

    Every failure to get a 200 answer (refused connection, timeout, HTTP error, too large) is
    ONE message to the registrant, so the registry cannot be used to tell a closed port from a
    live service; the detail goes to the log."""
    # The API validates card_path already; Consul's service meta is checked only here.
    problem = card_path_problem(card_path)
    if problem:
        raise CardRejected(f"card_path: {problem}")
    url = base_url.rstrip("/") + card_path
    budget = timeout_s if timeout_s is not None else (http.timeout.read or 5.0)
    try:
        response = await bounded_get(
            http,
            url,
            max_bytes=_MAX_CARD_BYTES,
            timeout_s=budget,
            headers={"A2A-Version": "1.0"},
        )
    except FetchFailed as exc:
        log.info("card fetch from %s failed: %s (%s)", url, exc.reason, exc.detail)
        if isinstance(exc.__cause__, AddressRefused):
            allowed = exc.__cause__.allowed
            raise UrlRefused(
                f"url: {base_url} is outside the networks this registry may contact "
                f"({allowed}); the operator can widen them with --allow-networks or "
                "MESH_REGISTRY_ALLOW_NETWORKS (link-local addresses are never allowed)"
            ) from exc
        if exc.reason == "tls":
            raise CardRejected(
                f"could not fetch the agent card from {url}: {exc.detail}; the registry trusts "
                "the CAs of MESH_TLS_CA (else the system's store): serve a certificate from one"
            ) from exc
        raise _unfetchable(url, budget) from exc
    if response.status_code != 200:
        log.info("card fetch from %s failed: HTTP %d", url, response.status_code)
        raise _unfetchable(url, budget)
    try:
        data = json.loads(response.content)
    except ValueError as exc:
        raise CardRejected(f"the agent card at {url} is not JSON") from exc
    if not isinstance(data, dict):
        raise CardRejected(f"the agent card at {url} is not a JSON object")
    return data


def _unfetchable(url: str, timeout_s: float) -> CardRejected:
    return CardRejected(
        f"could not fetch the agent card from {url}: no 200 answer of at most "
        f"{_MAX_CARD_BYTES} bytes within {timeout_s:g}s (unreachable, not 200, too slow or too "
        "large; the registry's log says which)"
    )


def agent_record(data: dict[str, Any], *, expected_name: str, now: float) -> AgentRecord:
    """Validate card JSON and derive the agent record. Raises ``CardRejected``."""
    try:
        card = card_to_dict(card_from_dict(data))
    except Exception as exc:  # protobuf's ParseError and friends: the card does not parse
        # The parser's message quotes the card: log it, answer in fixed words.
        log.info("card for %r does not parse: %s", expected_name, exc)
        raise CardRejected(
            "the agent card does not parse as an A2A 1.0 card (the registry's log says where)"
        ) from exc
    name = card.get("name", "")
    if name != expected_name:
        log.info("card names %r, registration says %r", name, expected_name)
        raise CardRejected(
            f"the agent card names another agent, not {expected_name!r}: register the name the "
            "card has, or serve this agent's card at that URL"
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
