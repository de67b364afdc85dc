"""A node's app passes every HTTP request to its gate first (``mesh._gate.GatedApp``): a send
the fast route answers skips FastAPI's per-request machinery (its OpenTelemetry provider check
above all), everything else still reaches FastAPI, and an error the gate raises is answered
with Starlette's 500 as when the gate was a middleware inside FastAPI's error middleware.

The node's real app (its lifespan, its SQLite file) called as ASGI, as the instructions bench
calls it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from mesh._a2a.fastroute import FastRoute
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.node_agents import agent
from tests.test_node_fastpath import _send


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    node = Node(agent, NodeSettings(data_dir=tmp_path, registry=None))
    async with node.app.router.lifespan_context(node.app):
        yield node.app


async def _call(
    app: FastAPI, method: str, path: str, body: bytes = b""
) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"a2a-version", b"1.0"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
    }
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in bodies)


async def test_a_fast_send_skips_fastapis_telemetry_check(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[bool] = []
    telemetry = app._native_telemetry  # type: ignore[attr-defined]
    real = telemetry.enabled

    def enabled() -> bool:
        checks.append(True)
        return bool(real())

    monkeypatch.setattr(telemetry, "enabled", enabled)
    body = json.dumps(_send({"key": "k", "n": 2}, "echo")).encode()
    status, headers, answer = await _call(app, "POST", "/", body)
    assert status == 200
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(answer)).encode()
    task = json.loads(answer)["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert checks == []
    # What the gate passes on is FastAPI's, as before: its routes, its telemetry check.
    status, _, _ = await _call(app, "GET", "/health")
    assert status == 200
    assert checks == [True]
    card, _, _ = await _call(app, "GET", "/.well-known/agent-card.json")
    assert card == 200
    assert len(checks) == 2


async def test_an_error_in_the_gate_is_starlettes_500(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any) -> bool | None:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(FastRoute, "answer", broken)
    body = json.dumps(_send({"key": "k"}, "echo")).encode()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(b"content-length", str(len(body)).encode())],
        "query_string": b"",
    }
    with pytest.raises(RuntimeError, match="broken on purpose"):
        await app(scope, receive, send)
    assert sent[0]["status"] == 500
    assert dict(sent[0]["headers"]) == {
        b"content-length": b"21",
        b"content-type": b"text/plain; charset=utf-8",
    }
    assert sent[1]["body"] == b"Internal Server Error"


async def _slow(app: FastAPI, given: bytes, declared: int) -> asyncio.Task[list[dict[str, Any]]]:
    """A request whose body stops after ``given`` of ``declared`` bytes: its task, which
    returns what the app sent."""
    sent: list[dict[str, Any]] = []
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": given, "more_body": True}
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(b"content-length", str(declared).encode())],
        "query_string": b"",
    }

    async def call() -> list[dict[str, Any]]:
        await app(scope, receive, send)
        return sent

    return asyncio.ensure_future(call())


async def test_bodies_late_by_the_timeout_are_408_in_turn(tmp_path: Path) -> None:
    """The body timeout (one timer for the reads' deadlines): each late body gets its 408 once
    it is late, a request in between is served, and a read cancelled from outside is
    cancelled, not timed out."""
    node = Node(agent, NodeSettings(data_dir=tmp_path, registry=None, body_timeout_s=0.3))
    app = node.app
    async with app.router.lifespan_context(app):
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await _slow(app, b'{"jsonrpc"', 200)
        await asyncio.sleep(0.1)
        second = await _slow(app, b"{", 100)
        cancelled = await _slow(app, b"{", 100)
        body = json.dumps(_send({"key": "k", "n": 2}, "echo")).encode()
        status, _, answer = await _call(app, "POST", "/", body)
        assert status == 200, answer
        cancelled.cancel()
        sent = await first
        first_at = loop.time() - started
        assert sent[0]["status"] == 408
        assert (b"connection", b"close") in sent[0]["headers"]
        assert b"MESH_BODY_TIMEOUT" in sent[1]["body"]
        assert b"(10 bytes did" in sent[1]["body"]
        assert (await second)[0]["status"] == 408
        second_at = loop.time() - started
        assert 0.3 <= first_at < second_at
        assert second_at >= 0.4
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        # Served after them as before.
        status, _, _ = await _call(app, "POST", "/", body)
        assert status == 200
