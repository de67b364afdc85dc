"""Peer connections are checked as they are made, and a peer's card is read within bounds.

``PeerTrust`` checks a URL, then believes its verdict for 30 s; a name can rebind within that
window. So a node's peer client (and a script's ``remote()`` client) connects only to addresses
its networks allow, checked on every connection: here ``bureau.test`` resolves to 127.0.0.1 (a
well-behaved member, in ``127.0.0.1/32``) while the node checks it and reads its card, and to
127.0.0.2 (outside) as soon as the card is served. Names are resolved by the event loop's
``getaddrinfo`` (what the policy check, httpx and the guarded backend all call), which the test
answers for ``*.test`` names; everything else is real: a node served by uvicorn in this process,
raw HTTP servers, the a2a client.

A peer whose card is huge or trickles gets no call (so no token) and costs a bounded time and at
most about the cap in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.credit_bureau import agent as bureau_agent
from mesh import Agent, Rule, Script, remote
from mesh._a2a.card import build_card, card_to_dict
from mesh._a2a.client import MAX_CARD_BYTES, A2APeer, auth_headers
from mesh._errors import RemoteError
from mesh._models.scripted import Call
from mesh._netguard import AddressRefused, create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._node import Node
from mesh._resilience import RetryPolicy
from mesh._settings import NodeSettings
from mesh._tools import ToolContext
from tests.raw_http import Handler, answer, raw_server, trickle
from tests.support import free_port, uvicorn_serving

pytestmark = pytest.mark.integration

TOKEN = "netguard-test-token-3b7d"
CARD_PATH = "/.well-known/agent-card.json"
NAME = "bureau.test"


@contextlib.contextmanager
def fake_dns(monkeypatch: pytest.MonkeyPatch, names: dict[str, str]) -> Iterator[None]:
    """The running loop resolves each name of ``names`` to its address, read at every lookup
    (change it to rebind the name); other names resolve as usual."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def getaddrinfo(host: Any, port: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name in names:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[name], int(port or 0)))]
        return await real(host, port, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    yield


def officer(url: str) -> Agent:
    """A coordinator that asks the credit bureau at ``url`` for a score."""
    return Agent(
        name="test-officer",
        instruction="Score applicants through the credit bureau.",
        tools=[
            remote(
                "credit-bureau",
                skill="score",
                url=url,
                deadline_s=2.0,
                policy=RetryPolicy(attempts=2, initial_delay=0.05, max_delay=0.1),
            )
        ],
        script=Script(
            rules=[
                Rule(
                    when=r"score (?P<applicant_id>APP-\d+)",
                    steps=[
                        [
                            Call(
                                "credit_bureau_score",
                                {"applicant_id": "{applicant_id}", "amount": 1000},
                            )
                        ]
                    ],
                    answer="score {credit_bureau_score.score}",
                    on_error="no score: {error}",
                )
            ],
        ),
    )


@contextlib.asynccontextmanager
async def serving(agent: Agent, tmp: Path) -> AsyncIterator[str]:
    """``agent``'s node, with the mesh token and peers only on 127.0.0.1, in this process."""
    port = free_port()
    settings = NodeSettings(
        port=port,
        data_dir=tmp / "node",
        token=TOKEN,
        peer_networks=NetworkPolicy.parse("127.0.0.1/32"),
        grace_seconds=1,
    )
    node = Node(agent, settings)
    async with uvicorn_serving(
        node.app, port, what="the node", log_level="warning", timeout_graceful_shutdown=2
    ):
        yield settings.url


async def ask(node_url: str, text: str) -> str:
    async with httpx.AsyncClient(timeout=30, headers=auth_headers(TOKEN), trust_env=False) as http:
        peer = A2APeer(http, node_url)
        try:
            result = await peer.send(text)
        finally:
            await peer.aclose()
    assert result.ok, result
    return result.text


def member(card: dict[str, Any], names: dict[str, str]) -> Handler:
    """Serves ``card`` (then closes the connection), and right after rebinds the name."""

    async def handle(target: str, writer: asyncio.StreamWriter) -> None:
        await answer(200 if target == CARD_PATH else 404, json.dumps(card))(target, writer)
        names[NAME] = "127.0.0.2"

    return handle


@contextlib.asynccontextmanager
async def rebinding(names: dict[str, str]) -> AsyncIterator[tuple[Any, Any, str]]:
    """A member on 127.0.0.1 and a recorder on 127.0.0.2 (same port), and the URL naming
    them: ``http://bureau.test:<port>``, the member's until it has served its card."""
    card: dict[str, Any] = {}
    async with raw_server(member(card, names)) as good:
        url = f"http://{NAME}:{good.port}"
        card.update(card_to_dict(build_card(bureau_agent, url, bearer=True)))
        async with raw_server(answer(200, "{}"), host="127.0.0.2", port=good.port) as elsewhere:
            yield good, elsewhere, url


async def test_a_name_rebound_after_the_check_gets_no_connection_from_a_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {NAME: "127.0.0.1"}
    async with rebinding(names) as (good, elsewhere, url):
        with fake_dns(monkeypatch, names):
            async with serving(officer(url), tmp_path) as node:
                said = await ask(node, "score APP-501")
        assert good.requests == [CARD_PATH]  # checked and read once, without the token
        assert names[NAME] == "127.0.0.2"  # ...and then the name moved
        # Without the guard, the call went to 127.0.0.2 with the token.
        assert elsewhere.connections == 0, elsewhere.requests
    assert said.startswith("no score:"), said
    assert "is 127.0.0.2, outside the allowed networks (127.0.0.1/32)" in said, said


async def test_a_name_rebound_after_the_check_gets_no_connection_from_a_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESH_PEER_NETWORKS", "127.0.0.1/32")
    names = {NAME: "127.0.0.1"}
    ctx = ToolContext(agent_name="script", user_id="u", session_id="s", invocation_id="i")
    async with rebinding(names) as (good, elsewhere, url):
        with fake_dns(monkeypatch, names):
            toolset = remote(
                "credit-bureau",
                skill="score",
                url=url,
                deadline_s=2.0,
                policy=RetryPolicy(attempts=2, initial_delay=0.05, max_delay=0.1),
            )
            try:
                (score,) = await toolset.tools(ctx)
                with pytest.raises(RemoteError) as caught:
                    await score.call({"applicant_id": "APP-501", "amount": 1000}, ctx)
            finally:
                await toolset.aclose()
        assert good.requests == [CARD_PATH]
        assert elsewhere.connections == 0, elsewhere.requests
    assert caught.value.reason == "unavailable"
    assert "outside the allowed networks (127.0.0.1/32)" in str(caught.value)


def endless_card(sent: list[int], total: int) -> Handler:
    """The bureau's card (without interfaces: nothing to check them against) whose description
    goes on for ``total`` bytes, chunked (no Content-Length to refuse up front); ``sent`` gets
    the bytes each answer got out before the reader hung up."""
    card = card_to_dict(build_card(bureau_agent, "http://127.0.0.1"))
    del card["supportedInterfaces"]
    card["description"] = "<filler>"
    head, tail = (part.encode() for part in json.dumps(card).split("<filler>"))
    chunk = b"x" * 65536

    async def handle(target: str, writer: asyncio.StreamWriter) -> None:
        if target != CARD_PATH:
            await answer(200, "{}")(target, writer)
            return
        sent.append(0)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for part in [head, *[chunk] * (total // len(chunk)), tail]:
            writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await writer.drain()
            sent[-1] += len(part)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handle


@pytest.mark.parametrize("kind", ["huge", "trickling"])
async def test_a_huge_or_trickling_card_gets_no_token_in_bounded_time_and_memory(
    tmp_path: Path, kind: str
) -> None:
    sent: list[int] = []
    total = 64 * MAX_CARD_BYTES
    handler = endless_card(sent, total) if kind == "huge" else trickle(0.05, 2000)
    async with raw_server(handler) as peer:
        async with serving(officer(peer.url), tmp_path) as node:
            started = time.monotonic()
            async with asyncio.timeout(30):  # without the bounds: forever (trickle), or believed
                said = await ask(node, "score APP-501")
            took = time.monotonic() - started
        # Only cards were asked for: no call, so no token.
        assert set(peer.requests) == {CARD_PATH}, peer.requests
    assert said.startswith("no score:"), said
    assert "cannot read the agent card" in said, said
    # Declaring the tool and calling it read the card once each, 2 s (the deadline) at most.
    assert took < 8, took
    if kind == "huge":
        assert "over 1000000 bytes" in said, said
        # Read up to the cap, then dropped: most of the 64 MB was never sent (what was is the
        # cap plus the sockets' buffers).
        assert sent, sent
        assert max(sent) < 16 * MAX_CARD_BYTES, sent
    else:
        assert "no whole card within 2s" in said, said


async def test_plain_http_goes_only_where_plain_http_may() -> None:
    """A node with a token: http only to loopback and private addresses, checked on connect
    (``plain_http``); https wherever its networks allow. Loopback stands in for both here."""
    async with (
        raw_server(answer(200, "{}"), host="127.0.0.2") as srv,
        create_http_client(
            NetworkPolicy.parse("loopback"),
            timeout=2,
            plain_http=NetworkPolicy.parse("127.0.0.1/32"),
        ) as http,
    ):
        with pytest.raises(httpx.ConnectError) as caught:
            await http.get(f"{srv.url}/x")
        assert srv.connections == 0
        refused = caught.value.__cause__
        assert isinstance(refused, AddressRefused)
        assert refused.allowed == "loopback and 127.0.0.1/32"
        # https may go there: the connection is made (the TLS handshake then fails).
        with pytest.raises(httpx.TransportError):
            await http.get(f"https://127.0.0.2:{srv.port}/x", timeout=0.5)
        assert srv.connections == 1
