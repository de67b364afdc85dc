"""``remote()``'s tools are made once per card read, and follow the next card.

A node's turn asks its toolsets for their tools every turn; a remote skill's tool is made from
the peer's card (its schemas restored from the card's ``Struct``), which ``CardCache`` keeps for
``card_ttl_s``. The tools are kept with the card they were made from: the same objects while
it is the same card, new ones from a card read again (the peer may have changed its schema).
Real nodes on uvicorn, the same address serving one agent and then another.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from mesh._agent import Agent
from mesh._errors import ToolError
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._node import Node
from mesh._remote import RemoteAgent
from mesh._settings import NodeSettings
from mesh._skills import skill
from mesh._tools import ToolContext
from mesh._trust import PeerTrust
from tests.support import free_port, uvicorn_serving

pytestmark = pytest.mark.integration


class Before(BaseModel):
    applicant_id: str
    amount: float


class After(BaseModel):
    applicant_id: str
    amount: float
    months: int


class Score(BaseModel):
    score: int


async def _score_before(req: Before) -> Score:
    """Score an applicant."""
    return Score(score=len(req.applicant_id))


async def _score_after(req: After) -> Score:
    """Score an applicant over some months."""
    return Score(score=len(req.applicant_id) + req.months)


def _bureau(fn: object) -> Agent:
    return Agent(
        name="bureau", description="scores", skills=[skill(fn, id="score", tags=["credit"])]
    )


@contextlib.asynccontextmanager
async def serving(agent: Agent, port: int, data: Path) -> AsyncIterator[None]:
    node = Node(agent, NodeSettings(port=port, data_dir=data, registry=None, grace_seconds=1))
    async with uvicorn_serving(node.app, port, what="the bureau", log_level="warning"):
        yield


def _context() -> ToolContext:
    return ToolContext(agent_name="caller", user_id="u", session_id="s", invocation_id="i-1")


async def test_tools_are_made_once_per_card_and_follow_a_new_card(tmp_path: Path) -> None:
    port = free_port()
    now = [0.0]
    rem = RemoteAgent(None, "score", url=f"http://127.0.0.1:{port}")
    anywhere = NetworkPolicy.parse("any")
    http = create_http_client(anywhere, timeout=10.0)
    # One clock for the card cache and the trust verdict (which holds the card it read).
    rem.bind(http=http, trust=PeerTrust(networks=anywhere, clock=lambda: now[0]))
    rem._cards.clock = lambda: now[0]
    ctx = _context()
    try:
        async with serving(_bureau(_score_before), port, tmp_path / "before"):
            (first,) = await rem.tools(ctx)
            (again,) = await rem.tools(ctx)
            # The same card: the same tool (its parameters too), nothing made again.
            assert again is first
            assert again.parameters is first.parameters
            assert list(first.parameters["properties"]) == ["applicant_id", "amount"]
            assert await first.call({"applicant_id": "a-1", "amount": 5}, ctx) == {"score": 3}
        async with serving(_bureau(_score_after), port, tmp_path / "after"):
            now[0] += 31.0  # past both ttls: the card is read again
            (second,) = await rem.tools(ctx)
            assert second is not first
            assert list(second.parameters["properties"]) == ["applicant_id", "amount", "months"]
            assert second.parameters["required"] == ["applicant_id", "amount", "months"]
            # The new schema checks the arguments on this side: nothing is sent without months.
            with pytest.raises(ToolError, match="months"):
                await second.call({"applicant_id": "a-1", "amount": 5}, ctx)
            answer = await second.call({"applicant_id": "a-1", "amount": 5, "months": 2}, ctx)
            assert answer == {"score": 5}
            (kept,) = await rem.tools(ctx)
            assert kept is second
    finally:
        await rem.aclose()
        await http.aclose()
