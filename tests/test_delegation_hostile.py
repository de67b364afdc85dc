"""A peer that answers what no A2A node would: gigabytes, HTML, a JSON-RPC answer without a task,
404/405, an unknown method, an SSE event without end. Discovery names it next to a genuine node
(a real ``mesh serve`` of the credit bureau); the hostile server is a real uvicorn server on
127.0.0.1 serving a copy of the bureau's card, so it passes the name check (as an impostor in an
open registry would: /tmp/attack-scripts/hostile.py).

Before: a 100 MB answer was read whole (the loan officer's RSS 76 -> 442 MB) and the call failed
"returned no task" instead of trying the genuine instance.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mesh._a2a.client import A2APeer
from mesh._errors import RemoteError
from mesh._remote import RemoteAgent, remote
from mesh._resilience import BreakerBoard, RetryPolicy
from mesh._tools import ToolContext
from mesh._tracing import TraceParent
from tests.support import (
    BUREAU_SCORES,
    StaticDiscovery,
    clean_env,
    free_port,
    running,
    uvicorn_serving,
)

pytestmark = pytest.mark.integration

CAP = 1 << 20  # the caller's MESH_MAX_ANSWER_BYTES in these tests
HUGE = 64 << 20  # what the hostile peer offers


@pytest.fixture(scope="module")
def bureau(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("bureau")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "bureau"), "--no-register"]
    with running(argv, name="bureau", tmp=tmp, health=f"{url}/health", env=clean_env()):
        yield url


async def _filler(
    request: Request, state: dict[str, Any], head: bytes, chunk: bytes
) -> AsyncIterator[bytes]:
    """``head``, then ``chunk`` until HUGE bytes or the caller hangs up, counting what went out
    (uvicorn drops what is sent after a disconnect, without telling the generator)."""
    yield head
    while state["sent"] < HUGE and not await request.is_disconnected():
        state["sent"] += len(chunk)
        yield chunk


def _answer(mode: str, state: dict[str, Any], request: Request) -> Response:
    if mode == "huge":
        head = b'{"jsonrpc":"2.0","id":1,"result":{"x":"'
        return StreamingResponse(
            _filler(request, state, head, b" " * 65536), media_type="application/json"
        )
    if mode == "html":
        return Response("<html><body>not an agent</body></html>", media_type="text/html")
    if mode == "no_task":
        return JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {"x": 1}})
    if mode == "unknown_method":
        error = {"code": -32601, "message": "Method not found"}
        return JSONResponse({"jsonrpc": "2.0", "id": 1, "error": error})
    if mode in ("404", "405", "401"):
        return JSONResponse({"detail": "no"}, status_code=int(mode))
    if mode == "sse_huge":  # one event that never ends: one endless data line
        head = b"data: " + b'{"jsonrpc":"2.0","id":1,"result":{"x":"'
        return StreamingResponse(
            _filler(request, state, head, b"x" * 65536), media_type="text/event-stream"
        )
    if mode == "sse_lines":  # one event of endless short data lines, no blank line
        return StreamingResponse(
            _filler(request, state, b"", b"data: xxxxxxxx\n" * 4096), media_type="text/event-stream"
        )
    raise AssertionError(mode)


@contextlib.asynccontextmanager
async def hostile(genuine: str, mode: str) -> AsyncIterator[dict[str, Any]]:
    """A server with a copy of ``genuine``'s card that answers every A2A call per ``mode``."""
    async with httpx.AsyncClient(trust_env=False) as http:
        card = (await http.get(genuine + "/.well-known/agent-card.json")).json()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    card = copy.deepcopy(card)
    for iface in card.get("supportedInterfaces", []):
        iface["url"] = url
    state: dict[str, Any] = {"posts": 0, "sent": 0, "url": url}

    async def card_route(request: Request) -> Response:
        return JSONResponse(card)

    async def rpc(request: Request) -> Response:
        state["posts"] += 1
        await request.body()
        return _answer(mode, state, request)

    app = Starlette(
        routes=[
            Route("/.well-known/agent-card.json", card_route),
            Route("/", rpc, methods=["POST"]),
        ]
    )
    async with uvicorn_serving(
        app, port, what="the hostile peer", log_level="critical", lifespan="off"
    ):
        yield state


def _remote() -> RemoteAgent:
    # Its own breakers: the first call starts at the second instance, the next at the first.
    policy = RetryPolicy(initial_delay=0.01)
    return remote("credit-bureau", skill="score", policy=policy, breakers=BreakerBoard())


def _context() -> ToolContext:
    return ToolContext(
        agent_name="test-caller",
        user_id="u",
        session_id="s",
        invocation_id=TraceParent.new().span_id,
    )


@pytest.mark.parametrize("mode", ["huge", "html", "no_task", "404", "405", "unknown_method"])
async def test_an_answer_that_is_not_an_a2a_answer_fails_over_to_the_genuine_peer(
    bureau: str, mode: str
) -> None:
    async with hostile(bureau, mode) as evil:
        rem = _remote()
        rem.bind(discovery=StaticDiscovery([bureau, evil["url"]]), max_answer_bytes=CAP)  # type: ignore[arg-type]
        try:
            tool = (await rem.tools(_context()))[0]
            # Two calls: the first tries the hostile instance first, the second the bureau.
            for _ in range(2):
                out = await tool.call({"applicant_id": "APP-501", "amount": 1000}, _context())
                assert out["score"] == BUREAU_SCORES["APP-501"]
        finally:
            await rem.aclose()
        assert evil["posts"] == 1
        assert sorted(r["attempts"] for r in rem.describe()["recent"]) == [1, 2]
        assert rem.breakers.get(evil["url"]).failures == 1  # counted against that instance
        # Read within the cap, then dropped: nowhere near the whole answer was taken.
        assert evil["sent"] < HUGE // 4, evil["sent"]


async def test_a_refusal_for_the_token_is_not_failed_over(bureau: str) -> None:
    """401/403 is a node that wants the mesh token: telling the caller is more useful than
    trying every instance with the same missing token."""
    async with hostile(bureau, "401") as evil:
        rem = _remote()
        rem.bind(discovery=StaticDiscovery([bureau, evil["url"]]))  # type: ignore[arg-type]
        try:
            tool = (await rem.tools(_context()))[0]
            with pytest.raises(RemoteError) as info:
                await tool.call({"applicant_id": "APP-501", "amount": 1000}, _context())
        finally:
            await rem.aclose()
    assert info.value.reason == "rejected"
    assert "MESH_TOKEN" in str(info.value)


async def _streamed(peer: A2APeer) -> list[Any]:
    return [
        u async for u in peer.stream({"applicant_id": "APP-501", "amount": 1000}, skill="score")
    ]


@pytest.mark.parametrize("mode", ["huge", "sse_huge", "sse_lines"])
async def test_every_answer_the_sdk_client_reads_is_capped_while_reading(
    bureau: str, mode: str
) -> None:
    """GetTask and CancelTask (a JSON body) and a stream (per event) through the SDK's client."""
    async with (
        hostile(bureau, mode) as evil,
        httpx.AsyncClient(timeout=30, trust_env=False) as http,
    ):
        peer = A2APeer(http, evil["url"], max_answer_bytes=CAP)
        try:
            with pytest.raises(RemoteError) as info:
                await (peer.get_task("t-1") if mode == "huge" else _streamed(peer))
            if mode == "huge":
                evil["sent"] = 0
                with pytest.raises(RemoteError) as cancel:
                    await peer.cancel("t-1")
                assert cancel.value.reason == "unavailable"
        finally:
            await peer.aclose()
    assert info.value.reason == "unavailable"
    assert f"more than {CAP} bytes" in str(info.value)
    assert evil["sent"] < HUGE // 4, evil["sent"]
