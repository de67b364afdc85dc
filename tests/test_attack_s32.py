"""Attack cases (session 32) on this session's changes, each claiming no behaviour change:

* ad353a6 the lingering close (``mesh._one_write``): a connection closed while its request's
  body is still arriving shuts its write side after the answer, swaps in a protocol that drops
  what arrives, and closes at the client's EOF or after ``LINGER_S``; the registry serves with
  the same protocol (fixed by fae40fe and 0ab81fe where it broke);
* 12d3a23 / 8ac99bc the node's metrics (tasks in flight read when scraped; series kept by the
  names given: fixed by 0ab81fe where it broke);
* e166527 ``missing_required`` against the SDK's check;
* 38e94ba / e949920 / 5648fd0 the coordinator's side (status metadata, flat state deltas, the
  request's plain payload): its answers, requests to the peer, session and log lines compared
  with the tree before, over a typed and an LLM hop;
* the specialist's answers and stored tasks compared with the tree before.

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the behaviour of the tree before the commit, ``git archive dc03330``, differs; each says how);
a break fixed since is a passing test that names the commit that broke it and the one that
fixed it.
In-process servers get a short ``LINGER_S`` so that no test waits the full 5 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import mesh._one_write
from tests.registry_support import registry
from tests.support import (
    Proc,
    archived_tree,
    clean_env,
    free_port,
    running,
    wait_until_ok,
)
from tests.test_node_input import _counted
from tests.test_one_write import _post_head, _read_to_close, _Refuser, _serving

# --- ad353a6: the lingering close -----------------------------------------------------------

LOOPS = ["asyncio", "uvloop"]
SHORT_LINGER_S = 3.0


@pytest.fixture
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    # raising=False: the tree before ad353a6 has no LINGER_S (it closed at once).
    monkeypatch.setattr(mesh._one_write, "LINGER_S", SHORT_LINGER_S, raising=False)


def _until(predicate: Any, timeout: float) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` s (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


class _BodyReader:
    """An app that reads its request's whole body as the gate does (receive until no more
    body or a disconnect), notes how that ended and after how long, then answers 200."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, float]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        started = time.monotonic()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        self.ended.append((message["type"], time.monotonic() - started))
        if message["type"] == "http.request":
            body = b"read"
            headers = [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})


# A chunked body whose second chunk size is not hex: uvicorn's parser answers 400 itself (and
# closes) while the app is still reading the body.
_BAD_CHUNKED = (
    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZZ\r\n"
)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_body_the_parser_refuses_midway_tells_the_reading_app_at_once(
    loop: str, short_linger: None
) -> None:
    """Broken by ad353a6 (the connection lingered with the request unfinished: the app
    reading the body heard nothing until the client's EOF or LINGER_S), fixed by fae40fe."""
    app = _BodyReader()
    with (
        _serving(app, loop) as (_, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_BAD_CHUNKED)
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        told = _until(lambda: app.ended, 1.0)
        sock.close()  # the EOF ends a lingering connection: the server stops at once
        assert _until(lambda: app.ended, 2.0)
    assert told, "the app was not told of the close within 1 s"
    assert app.ended[0][0] == "http.disconnect"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_shutdown_does_not_wait_for_a_body_the_parser_refused(
    loop: str, short_linger: None
) -> None:
    """Broken by ad353a6 (protocol.shutdown() closes only a finished answer's connection:
    the shutdown waited LINGER_S), fixed by fae40fe."""
    with (
        _serving(_BodyReader(), loop) as (server, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_BAD_CHUNKED)
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        server.should_exit = True
        closed = _until(lambda: not server.server_state.connections, 1.0)
        sock.close()
        assert closed, "the shutdown still waits for the connection after 1 s"


class _FailsMidAnswer:
    """An app that starts a streamed answer before reading the body, then fails."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("the app fails mid-answer")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_shutdown_does_not_wait_for_an_app_that_failed_mid_answer(
    loop: str, short_linger: None
) -> None:
    """Broken by ad353a6 (an app failing mid-answer while the body still arrived left a
    lingering connection the shutdown waited LINGER_S for), fixed by fae40fe."""
    with (
        _serving(_FailsMidAnswer(), loop) as (server, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, 1_000_000) + b"x" * 10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.1)  # the app has failed
        server.should_exit = True
        closed = _until(lambda: not server.server_state.connections, 1.0)
        sock.close()
        assert closed, "the shutdown still waits for the connection after 1 s"


class _SlowRefuser:
    """Refuses the body before reading it, as the gate's 413 does (a kept-alive answer, no
    ``Connection: close``), after ``delay`` s of work; says when it started."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.started = threading.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import asyncio

        if scope["type"] != "http":
            return
        self.started.set()
        await asyncio.sleep(self.delay)
        body = b'{"error":"body_too_large"}'
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("loop", LOOPS)
def test_a_refusal_answered_during_a_shutdown_does_not_hold_it(
    loop: str, short_linger: None
) -> None:
    """Broken by ad353a6 (kept by fae40fe): uvicorn's shutdown marks a running answer's
    connection not kept alive after its one closing pass, so the refusal's close lingered and
    the shutdown waited LINGER_S (dc03330: closed at once). Fixed by 0ab81fe."""
    app = _SlowRefuser(0.5)
    with (
        _serving(app, loop) as (server, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, 1_000_000) + b"x" * 1000)
        assert app.started.wait(5)
        server.should_exit = True  # the app answers 0.5 s into the shutdown
        assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")
        closed = _until(lambda: not server.server_state.connections, 1.0)
        sock.close()
        assert closed, "the shutdown still waits for the connection 1 s after the answer"


def test_an_app_that_fails_mid_answer_ends_the_clients_read(short_linger: None) -> None:
    """What the client reads is unchanged: the partial stream, then the end of the
    connection (no final chunk)."""
    with (
        _serving(_FailsMidAnswer(), "asyncio") as (_, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, 1_000_000) + b"x" * 10)
        started = time.monotonic()
        try:
            answer = _read_to_close(sock)
        except ConnectionResetError:
            answer = b""
        assert time.monotonic() - started < 1.0
        assert b"0\r\n\r\n" not in answer


# A real node (``mesh serve``): a small in-flight bound and a 1 s body deadline.
HEADERS = {"A2A-Version": "1.0", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def bounded_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("s32-bounded")
    port = free_port()
    argv = ["mesh", "serve", "tests.input_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "node"), "--no-register"]
    url = f"http://127.0.0.1:{port}"
    env = clean_env(MESH_MAX_INFLIGHT_BYTES="1000", MESH_BODY_TIMEOUT="1")
    with running(argv, name="bounded", tmp=tmp, health=f"{url}/health", env=env):
        yield url


def _send_body(text: str = "hi") -> bytes:
    message = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"data": {"key": text}, "mediaType": "application/json"}],
        "metadata": {"skill": "echo"},
    }
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": message}}
    return json.dumps(rpc).encode()


def _task_count(url: str) -> int:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 1}}
    r = httpx.post(url + "/", json=rpc, headers=HEADERS, timeout=10, trust_env=False)
    return int(r.json()["result"].get("totalSize", 0))


def _node_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _bad_chunked_to_node(held: int) -> bytes:
    """A chunked POST / whose first chunk is ``held`` bytes and whose next chunk size is not
    hex: the node holds the first chunk's bytes, then uvicorn's parser answers 400."""
    return (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + f"{held:x}\r\n".encode() + b"{" * held + b"\r\n"
        b"ZZZ\r\n"
    )


def test_a_body_the_parser_refused_frees_what_it_held_at_once(bounded_node: str) -> None:
    """Broken by ad353a6 (the gate held the arrived bytes until the client's EOF or
    LINGER_S: others got 503 busy), fixed by fae40fe."""
    with _node_socket(bounded_node) as sock:
        sock.sendall(_bad_chunked_to_node(900))
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        time.sleep(0.2)
        # 900 bytes held + this one's > 1000, while another request holds some: 503.
        r = httpx.post(bounded_node + "/", content=_send_body(), headers=HEADERS, timeout=10)
    assert r.status_code == 200, r.text


def test_a_body_the_parser_refused_is_not_counted_as_too_slow(bounded_node: str) -> None:
    """Broken by ad353a6 (counted again as a 408 body_timeout once MESH_BODY_TIMEOUT passed
    while the connection lingered), fixed by fae40fe."""
    before = _counted(bounded_node, "body_timeout")
    with _node_socket(bounded_node) as sock:
        sock.sendall(_bad_chunked_to_node(10))
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")
        time.sleep(1.6)  # past the node's 1 s body deadline, before LINGER_S
        assert _counted(bounded_node, "body_timeout") == before


def test_a_request_pipelined_after_a_408_body_never_runs(bounded_node: str) -> None:
    """The 408 closes: what follows on the connection (the rest of the body, then a whole
    SendMessage) is dropped unparsed, never run; the client reads the 408."""
    tasks = _task_count(bounded_node)
    timeouts = _counted(bounded_node, "body_timeout")
    body = _send_body()
    head = (
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with _node_socket(bounded_node) as sock:
        sock.sendall(head + body[:5])
        assert sock.recv(1, socket.MSG_PEEK)  # the 408, once the body is 1 s late
        try:
            sock.sendall(body[5:] + head + body)
            answer = _read_to_close(sock)
        except ConnectionResetError:  # the tree before ad353a6 closed at once
            answer = b"HTTP/1.1 408 (read before the reset)"
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1
    time.sleep(0.3)
    assert _task_count(bounded_node) == tasks
    assert _counted(bounded_node, "body_timeout") == timeouts + 1


def _registry_requests(url: str) -> dict[tuple[str, str], float]:
    """``mesh_registry_requests_total`` by (route, status), but the /metrics reads."""
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    counted = {}
    for line in text.splitlines():
        if line.startswith("mesh_registry_requests_total{") and "/metrics" not in line:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            counted[(labels["route"], labels["status"])] = float(line.rsplit(" ", 1)[1])
    return counted


def test_the_registry_never_runs_a_write_pipelined_after_a_refused_body(tmp_path: Path) -> None:
    """The registry's 403 (wrong token, answered before the body) closes: the rest of the
    body and a whole registration with the right token after it are never run."""
    registration = json.dumps(
        {"instance_id": "pipelined-1", "agent": "echo", "url": "http://127.0.0.1:1"}
    ).encode()

    def post(token: str, body: bytes, length: int | None = None) -> bytes:
        return (
            f"POST /v1/instances HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length or len(body)}\r\n\r\n"
        ).encode() + body

    with registry(tmp_path, token="s3cret") as reg:
        counted = _registry_requests(reg.url)  # the health checks of the start
        with socket.create_connection(("127.0.0.1", reg.port), timeout=10) as sock:
            sock.sendall(post("wrong", b"", 200_000))
            assert sock.recv(1, socket.MSG_PEEK)
            try:
                sock.sendall(b" " * 200_000 + post("s3cret", registration))
                answer = _read_to_close(sock)
            except (ConnectionResetError, BrokenPipeError):
                answer = b"HTTP/1.1 403 (read before the reset)"
        assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
        assert answer.count(b"HTTP/1.1 ") == 1
        time.sleep(0.3)
        # Only the gate's 403 was counted: the pipelined write never reached a route.
        assert _registry_requests(reg.url) == {**counted, ("gate", "403"): 1.0}
        # A refused connection still lingering (its client neither sends nor closes) does not
        # hold the registry's stop (SIGTERM) for LINGER_S.
        with socket.create_connection(("127.0.0.1", reg.port), timeout=10) as sock:
            sock.sendall(post("wrong", b"", 200_000) + b" " * 1000)
            assert sock.recv(65536).startswith(b"HTTP/1.1 403 ")
            started = time.monotonic()
            reg.proc.terminate()
            assert time.monotonic() - started < 3.0


# --- guards: what the lingering close must leave as it was ----------------------------------


def _no_close_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except TimeoutError:
        return True
    finally:
        sock.settimeout(10)


@pytest.mark.parametrize("loop", LOOPS)
def test_keep_alive_after_a_read_answer_is_unchanged(loop: str, short_linger: None) -> None:
    app = _BodyReader()
    with (
        _serving(app, loop) as (server, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        for _ in range(3):
            sock.sendall(_post_head(port, 5) + b"hello")
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert answer.endswith(b"read"), answer
            assert b"connection: close" not in answer.lower()
        assert _no_close_within(sock, 0.3)
        assert len(server.server_state.connections) == 1
    assert [end for end, _ in app.ended] == ["http.request"] * 3


class _Closer:
    """Reads the whole body, then answers with ``Connection: close``: sized, or streamed."""

    def __init__(self, streamed: bool) -> None:
        self.streamed = streamed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if self.streamed:
            headers = [(b"connection", b"close"), (b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for event in (b"data: 1\n\n", b"data: 2\n\n"):
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            headers = [(b"connection", b"close"), (b"content-length", b"2")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("streamed", [False, True], ids=["sized", "chunked"])
@pytest.mark.parametrize("loop", LOOPS)
def test_a_close_after_a_body_read_in_full_is_at_once(
    loop: str, streamed: bool, short_linger: None
) -> None:
    with (
        _serving(_Closer(streamed), loop) as (server, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, 5) + b"hello")
        started = time.monotonic()
        answer = _read_to_close(sock)
        assert time.monotonic() - started < 1.0
        assert _until(lambda: not server.server_state.connections, 1.0)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"0\r\n\r\n" if streamed else b"ok")


def _refused(port: int, sock: socket.socket) -> None:
    sock.sendall(_post_head(port, 1_000_000) + b"x" * 1000)
    assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_resets_while_lingering_is_gone_at_once(
    loop: str, short_linger: None
) -> None:
    with _serving(_Refuser(), loop) as (server, port):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        _refused(port, sock)
        assert len(server.server_state.connections) == 1  # lingering
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # SO_LINGER 0: a reset
        assert _until(lambda: not server.server_state.connections, 1.0)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_half_closes_while_lingering_is_closed_at_once(
    loop: str, short_linger: None
) -> None:
    with (
        _serving(_Refuser(), loop) as (server, port),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, 1_000_000) + b"x" * 1000)
        sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        answer = _read_to_close(sock)
        assert time.monotonic() - started < 1.0
        assert _until(lambda: not server.server_state.connections, 1.0)
    assert answer.startswith(b"HTTP/1.1 413 ") or answer == b""


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _LoopSpy(_Refuser):
    loop: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import asyncio

        type(self).loop = asyncio.get_running_loop()
        await super().__call__(scope, receive, send)


def test_many_lingering_connections_leave_nothing_behind(short_linger: None) -> None:
    """40 refused connections linger at once; once their clients close, no connection, fd or
    live LINGER_S timer is left."""
    app = _LoopSpy()
    with _serving(app, "asyncio") as (server, port):
        fds = _fds()
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        for sock in socks:
            _refused(port, sock)
        assert app.calls == 40
        assert len(server.server_state.connections) == 40
        for sock in socks:
            sock.close()
        assert _until(lambda: not server.server_state.connections, 2.0)
        assert _until(lambda: _fds() <= fds, 2.0), (_fds(), fds)
        live = [
            h
            for h in list(app.loop._scheduled)
            if not h.cancelled() and "close" in repr(h._callback)
        ]
        assert live == []


def test_many_lingering_connections_do_not_hold_a_shutdown(short_linger: None) -> None:
    with _serving(_Refuser(), "uvloop") as (server, port):
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
        try:
            for sock in socks:
                _refused(port, sock)
            server.should_exit = True
            assert _until(lambda: not server.server_state.connections, 1.0)
        finally:
            for sock in socks:
                sock.close()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    tmp = tmp_path_factory.mktemp("s32-tls")
    cert_file, key_file, ca_file = tmp / "cert.pem", tmp / "key.pem", tmp / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    return cert_file, key_file, ca_file


@pytest.mark.parametrize("loop", LOOPS)
def test_over_tls_a_refused_body_closes_at_once(
    loop: str, tls_files: tuple[Path, Path, Path], short_linger: None
) -> None:
    cert_file, key_file, ca_file = tls_files
    context = ssl.create_default_context(cafile=str(ca_file))
    with _serving(_Refuser(), loop, ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)) as (
        server,
        port,
    ):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(_post_head(port, 1_000_000) + b"x" * 1000)
            started = time.monotonic()
            # No half-close over TLS: the answer, then the close at once (as before), not
            # after LINGER_S.
            try:
                answer = _read_to_close(sock)
            except (ssl.SSLError, ConnectionResetError):
                answer = b"(reset)"
            assert time.monotonic() - started < 1.0, answer
        assert _until(lambda: not server.server_state.connections, 1.0)


# --- the specialist's answers against the tree before this session (dc03330) -----------------
#
# One agent served twice, by this checkout and by `git archive dc03330` (on PYTHONPATH first, with
# PYTHONSAFEPATH: `python -m` would otherwise put the working directory, this checkout, ahead of it),
# each with its own data dir; the same requests to both; every answer's text compared with ids
# and times replaced by placeholders: the same members in the same order, byte for byte.

BEFORE = "dc03330"

_AGENT_SOURCE = '''
from typing import Any

from pydantic import BaseModel

from mesh import Agent, File, SkillContext, skill


class In(BaseModel):
    key: str
    n: int = 1
    extra: dict[str, Any] = {}


class Out(BaseModel):
    key: str
    n: int
    ratio: float
    nested: dict[str, Any]
    items: list[Any]


def _out(req: In) -> Out:
    return Out(
        key=req.key,
        n=req.n,
        ratio=req.n / 3,
        nested={"u": "\\u00e9\\u2028\\U0001f600", "big": 2**60, "neg": -0.0, **req.extra},
        items=[1, 2.5, None, True, "x", {"k": []}],
    )


@skill
def plain(req: In) -> Out:
    """Answer at once."""
    return _out(req)


@skill
async def rich(req: In, ctx: SkillContext) -> Out:
    """Attach files and data, then answer."""
    await ctx.progress("working \\u00fc")
    ctx.attach(File(b"\\x89PNG\\x00\\xff" * 3, media_type="image/png", name="chart.png"))
    ctx.attach({"rate": 1.08, "big": 2**60, "u": "\\u00e9"}, "the rate", name="rate",
               description="a rate")
    ctx.attach(File(url="https://files.example/x.pdf", media_type="application/pdf"))
    ctx.attach("text only")
    return _out(req)


@skill
def broken(req: In) -> Out:
    """Always fails."""
    raise RuntimeError("exploded " + req.key)


@skill(accepts=["image/png", "application/pdf"])
def files(req: In) -> Out:
    """Takes files with its input."""
    return _out(req)


@skill(asks=True)
async def asks(req: In, ctx: SkillContext) -> Out:
    """Asks a question first."""
    answer = await ctx.ask("which one? \\u00e9")
    return _out(In(key=str(answer), n=req.n))


agent = Agent(name="s32-worker", description="s32 worker.", skills=[plain, rich, broken, asks, files])
'''


@contextmanager
def _node(tmp: Path, name: str, pythonpath: str, data: Path | None = None) -> Iterator[str]:
    port = free_port()
    argv = ["mesh", "serve", "s32_agent:agent", "--port", str(port), "--no-register"]
    argv += ["--data-dir", str(data or tmp / name)]
    url = f"http://127.0.0.1:{port}"
    env = clean_env(PYTHONSAFEPATH="1", PYTHONPATH=pythonpath)
    with running(argv, name=name, tmp=tmp, health=f"{url}/health", env=env):
        yield url


@dataclass
class Nodes:
    now: str
    before: str
    tmp: Path
    before_tree: Path


@dataclass
class Trees:
    """Where the agent module is, and the tree of ``BEFORE`` (``git archive``)."""

    agent_dir: Path
    before: Path

    def path(self, side: str) -> str:
        if side.startswith("before"):
            return f"{self.before}{os.pathsep}{self.agent_dir}"
        return str(self.agent_dir)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    tmp = tmp_path_factory.mktemp("s32-trees")
    tree = archived_tree(BEFORE, tmp / "before")
    (tmp / "s32_agent.py").write_text(_AGENT_SOURCE)
    return Trees(tmp, tree)


@pytest.fixture(scope="module")
def nodes(trees: Trees, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    tmp = tmp_path_factory.mktemp("s32-compare")
    with (
        _node(tmp, "now", trees.path("now")) as now,
        _node(tmp, "before", trees.path("before")) as before,
    ):
        yield Nodes(now, before, tmp, trees.before)


_IDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


_TRACES = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")
# Members whose value is a protobuf Struct (a map: its members come in no fixed order).
_STRUCTS = frozenset({"data", "metadata", "usage", "childrenUsage"})


def _text_norm(text: str) -> str:
    return _TRACES.sub("<trace>", _TIMES.sub("<time>", _IDS.sub("<id>", text)))


def _order(value: Any, inside_struct: bool = False) -> Any:
    """The member order of every JSON object that is a message (not a Struct's map)."""
    if isinstance(value, dict):
        return {
            "": None if inside_struct else list(value),
            **{k: _order(v, inside_struct or k in _STRUCTS) for k, v in value.items()},
        }
    if isinstance(value, list):
        return [_order(v, inside_struct) for v in value]
    return None


def _comparable(status: int, content_type: str | None, text: str) -> Any:
    """An answer as compared: status, type, the JSON (ids, times, traces replaced) and the
    member order of its messages; a text that is not JSON as it is."""
    text = _text_norm(text)
    try:
        value = json.loads(text)
    except ValueError:
        return (status, content_type, text)
    return (status, content_type, value, _order(value))


def _message(skill: str, data: Any, message_id: str, **more: Any) -> dict[str, Any]:
    parts = more.pop("parts", None) or [{"data": data, "mediaType": "application/json"}]
    metadata = {"skill": skill, **more.pop("metadata", {})}
    return {
        "role": "ROLE_USER",
        "messageId": message_id,
        "contextId": more.pop("context_id", "ctx-s32"),
        "parts": parts,
        "metadata": metadata,
        **more,
    }


def _rpc(method: str, params: dict[str, Any], rpc_id: Any = 7) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


async def _both_texts(
    http: httpx.AsyncClient, nodes: Nodes, path: str, body: bytes | dict[str, Any]
) -> tuple[Any, Any]:
    """The answer of each node to ``body`` (``_comparable``)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    got = []
    for url in (nodes.now, nodes.before):
        r = await http.post(
            url + path,
            content=content,
            headers={**HEADERS, "Content-Type": "application/json"},
        )
        got.append(_comparable(r.status_code, r.headers.get("content-type"), r.text))
    return got[0], got[1]


@pytest.fixture
async def client() -> Any:
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
        yield http


_RAW = "iVBORw0KGgo="  # base64 of a few bytes

SEND_CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"message": _message("plain", {"key": "a", "n": 4}, "m-plain")}),
    *[
        (
            f"plain-history-{n}",
            {
                "message": _message("plain", {"key": "h", "n": 2}, f"m-plain-h{n}"),
                "configuration": {"historyLength": n},
            },
        )
        for n in (0, 1, 2, 5)
    ],
    ("rich", {"message": _message("rich", {"key": "r", "n": 7}, "m-rich")}),
    (
        "rich-history-0",
        {
            "message": _message("rich", {"key": "r0"}, "m-rich-h0"),
            "configuration": {"historyLength": 0},
        },
    ),
    ("broken", {"message": _message("broken", {"key": "b"}, "m-broken")}),
    ("asks", {"message": _message("asks", {"key": "q"}, "m-asks")}),
    (
        "several-parts",
        {
            "message": _message(
                "files",
                None,
                "m-parts",
                parts=[
                    {"data": {"key": "p", "n": 3}, "mediaType": "application/json"},
                    {"text": "and some text \u00e9", "mediaType": "text/plain"},
                    {"raw": _RAW, "mediaType": "image/png", "filename": "x.png"},
                    {"url": "https://files.example/y.pdf", "mediaType": "application/pdf"},
                ],
            )
        },
    ),
    (
        "metadata",
        {
            "message": _message(
                "plain",
                {"key": "md", "extra": {"deep": {"list": [1, {"a": None}]}}},
                "m-meta",
                metadata={
                    "caller": "tester",
                    "n": 3,
                    "f": 0.1,
                    "flag": True,
                    "none": None,
                    "deep": {"x": [1, "2", {"y": False}]},
                    "u": "\u00e9\u2028",
                },
            ),
            "metadata": {"request": "level", "n": 1},
        },
    ),
    (
        "references",
        {
            "message": _message(
                "plain",
                {"key": "ref"},
                "m-ref",
                referenceTaskIds=["t-1", "t-2"],
                extensions=["https://example.com/ext"],
            )
        },
    ),
    ("invalid-input", {"message": _message("plain", {"key": 5, "n": "x"}, "m-invalid")}),
    ("unknown-skill", {"message": _message("nope", {"key": "a"}, "m-unknown")}),
    ("no-parts", {"message": {**_message("plain", {"key": "a"}, "m-noparts"), "parts": []}}),
    ("no-message-id", {"message": {**_message("plain", {"key": "a"}, ""), "messageId": ""}}),
    ("message-not-object", {"message": 5}),
    (
        "no-role",
        {
            "message": {
                k: v for k, v in _message("plain", {"key": "a"}, "m-norole").items() if k != "role"
            }
        },
    ),
]


@pytest.mark.integration
async def test_send_answers_are_the_trees_before(nodes: Nodes, client: Any) -> None:
    """Every send's answer, then its replay (same messageId) under other history lengths and
    on REST, then GetTask of its task: the same text (ids and times aside) on both trees."""
    diffs = []
    for name, params in SEND_CASES:
        for rpc_id in (7, None):
            now, before = await _both_texts(client, nodes, "/", _rpc("SendMessage", params, rpc_id))
            if now != before:
                diffs.append((name, rpc_id, now, before))
        for config in ({"historyLength": 0}, None):
            again = {k: v for k, v in params.items() if k != "configuration"}
            if config is not None:
                again["configuration"] = config
            now, before = await _both_texts(client, nodes, "/", _rpc("SendMessage", again))
            if now != before:
                diffs.append((name, f"replay {config}", now, before))
            now, before = await _both_texts(client, nodes, "/a2a/rest/message:send", again)
            if now != before:
                diffs.append((name, f"rest {config}", now, before))
    assert diffs == []


BAD_BODIES: list[bytes] = [
    b"{not json",
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{}}}',
    b'{"jsonrpc":"1.0","id":1,"method":"SendMessage","params":{}}',
    b'{"jsonrpc":"2.0","id":{"a":1},"method":"SendMessage","params":{}}',
    b'{"jsonrpc":"2.0","id":1,"method":"NoSuchMethod","params":{}}',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage"}',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m",'
    b'"role":"ROLE_USER","parts":[{"data":NaN}]}}}',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m",'
    b'"role":"ROLE_USER","parts":[{"text":"x"}]},"configuration":{"historyLength":-1}}}',
    b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"no-such-task"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x","historyLength":-1}}',
    b'{"jsonrpc":"2.0","id":1,"method":"CancelTask","params":{"id":"no-such-task"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"contextId":"ctx-none"}}',
]


@pytest.mark.integration
async def test_bad_requests_are_refused_as_the_tree_before(nodes: Nodes, client: Any) -> None:
    """Bad bodies, unknown tasks and methods: the same JSON-RPC errors (codes, messages)."""
    diffs = []
    for body in BAD_BODIES:
        now, before = await _both_texts(client, nodes, "/", body)
        if now != before:
            diffs.append((body, now, before))
    assert diffs == []


async def _send_get(
    http: httpx.AsyncClient, url: str, params: dict[str, Any]
) -> tuple[Any, str | None]:
    r = await http.post(url + "/", json=_rpc("SendMessage", params), headers=HEADERS)
    answer = r.json()
    task = answer.get("result", {}).get("task")
    return _comparable(r.status_code, r.headers.get("content-type"), r.text), (
        task["id"] if task else None
    )


async def _get_tasks(http: httpx.AsyncClient, url: str, task_id: str) -> list[Any]:
    got = []
    for history in (None, 0, 2):
        params: dict[str, Any] = {"id": task_id}
        if history is not None:
            params["historyLength"] = history
        r = await http.post(url + "/", json=_rpc("GetTask", params), headers=HEADERS)
        got.append(_comparable(r.status_code, r.headers.get("content-type"), r.text))
        rest = f"/a2a/rest/tasks/{task_id}" + (
            "" if history is None else f"?historyLength={history}"
        )
        r = await http.get(url + rest, headers=HEADERS)
        got.append(_comparable(r.status_code, r.headers.get("content-type"), r.text))
    return got


@contextmanager
def _started_together(tmp: Path, dirs: dict[str, tuple[str, Path]]) -> Iterator[dict[str, str]]:
    """One node per side on ``(pythonpath, data dir)``, started at once (then waited for)."""
    procs, urls = {}, {}
    try:
        for side, (path, data) in dirs.items():
            port = free_port()
            argv = ["mesh", "serve", "s32_agent:agent", "--port", str(port), "--no-register"]
            argv += ["--data-dir", str(data)]
            env = clean_env(PYTHONSAFEPATH="1", PYTHONPATH=path)
            procs[side] = Proc.start(argv, name=side, tmp=tmp, env=env)
            urls[side] = f"http://127.0.0.1:{port}"
        for side, proc in procs.items():
            wait_until_ok(urls[side] + "/health", timeout=30, proc=proc)
        yield urls
    finally:
        for proc in procs.values():
            proc.terminate()


@pytest.mark.integration
async def test_stored_tasks_are_the_trees_before_and_after_a_restart(
    nodes: Nodes, trees: Trees, client: Any
) -> None:
    """The tasks of sends (artifacts, metadata, a question and its reply, a failure), read back
    with GetTask under every history length, on JSON-RPC and REST: the same on both trees,
    and the same again from a new process of each on the same database."""
    names = {"plain", "rich", "broken", "asks", "metadata", "several-parts", "references"}
    cases = [c for c in SEND_CASES if c[0] in names]
    seen: dict[str, list[Any]] = {}
    ids: dict[str, list[str]] = {}
    for side, url in (("now", nodes.now), ("before", nodes.before)):
        answers, task_ids = [], []
        for name, params in cases:
            fresh = {**params, "message": {**params["message"], "messageId": f"stored-{name}"}}
            answer, task_id = await _send_get(client, url, fresh)
            answers.append(answer)
            assert task_id is not None, answer
            task_ids.append(task_id)
        # The question's reply: the same task, now completed.
        asked = task_ids[[c[0] for c in cases].index("asks")]
        reply = _message("asks", None, "m-reply", parts=[{"text": "this one"}], taskId=asked)
        replied = await _send_get(client, url, {"message": reply})
        assert replied[1] == asked
        answers.append(replied[0])
        for task_id in task_ids:
            answers.extend(await _get_tasks(client, url, task_id))
        seen[side], ids[side] = answers, task_ids
    assert seen["now"] == seen["before"]
    dirs = {side: (trees.path(side), nodes.tmp / side) for side in ("now", "before")}
    (nodes.tmp / "again").mkdir(exist_ok=True)
    with _started_together(nodes.tmp / "again", dirs) as urls:
        for side, url in urls.items():
            again = []
            for task_id in ids[side]:
                again.extend(await _get_tasks(client, url, task_id))
            assert again == seen[side][len(cases) + 1 :], side


# --- e166527: missing_required against the SDK's check, every combination ---------------------


def _required_case(bits: int) -> dict[str, Any]:
    """A SendMessageRequest body: each bit of ``bits`` sets or leaves out one thing the
    REQUIRED check looks at (or near it)."""
    on = [bool(bits >> i & 1) for i in range(11)]
    body: dict[str, Any] = {}
    if on[0]:
        message: dict[str, Any] = {}
        if on[1]:
            message["messageId"] = "m-1"
        if on[2]:
            message["role"] = "ROLE_USER"
        if on[3]:
            message["parts"] = [{"text": "x"}]
        if on[4]:
            message["metadata"] = {"skill": "s"}
        body["message"] = message
    if on[5]:
        configuration: dict[str, Any] = {}
        if on[6]:
            push: dict[str, Any] = {}
            if on[7]:
                push["url"] = "https://example.test/hook"
            if on[8]:
                push["authentication"] = {"scheme": "Bearer"} if on[9] else {"credentials": "c"}
            configuration["taskPushNotificationConfig"] = push
        if on[10]:
            configuration["historyLength"] = 2
        body["configuration"] = configuration
    return body


def test_missing_required_agrees_with_the_sdk_on_every_combination() -> None:
    from a2a.types import SendMessageRequest
    from a2a.utils.errors import InvalidParamsError
    from a2a.utils.proto_utils import validate_proto_required_fields
    from google.protobuf.json_format import ParseDict

    from mesh._a2a.fastpath_required import missing_required

    disagree = []
    for bits in range(1 << 11):
        body = _required_case(bits)
        params = ParseDict(body, SendMessageRequest())
        untouched = params.SerializeToString(deterministic=True)
        mine = missing_required(params)
        # The check reads, never writes: no absent message made present by reading it.
        assert params.SerializeToString(deterministic=True) == untouched, body
        assert params.HasField("configuration") == ("configuration" in body)
        try:
            validate_proto_required_fields(params)
            sdk = False
        except InvalidParamsError:
            sdk = True
        if mine != sdk:
            disagree.append(body)
    assert disagree == []


# --- the coordinator's side against the tree before this session -----------------------------
#
# The bench's coordinator (a scripted LLM turn calling the bench bureau's typed skill over A2A,
# tests/bench/agents/coordinator.py) served by each tree, each reaching the same bureau through
# a recording proxy of its own: the answers, the requests each sent to the peer, its session
# on disk, its log lines, and its errors when the peer fails, compared.


class _Recorder:
    """An ASGI app that records each request (path, headers, body) and forwards it to
    ``target``, or answers ``fail`` (status, body) instead when set."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.fail: tuple[int, bytes] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append((f"{scope['method']} {scope['path']}", headers, body))
        if self.fail is not None:
            status, answer = self.fail
            out = [(b"content-type", b"application/json")]
        else:
            async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
                forwarded = {
                    k: v for k, v in headers.items() if k not in {"host", "content-length"}
                }
                r = await http.request(
                    scope["method"], self.target + scope["path"], content=body, headers=forwarded
                )
            status, answer = r.status_code, r.content
            out = [(b"content-type", r.headers.get("content-type", "").encode())]
        out.append((b"content-length", str(len(answer)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": answer})


_ADDRS = re.compile(r"127\.0\.0\.1:\d+")
_EPOCHS = re.compile(r"\b1[789]\d{8}(\.\d+)?\b")
_HEXES = re.compile(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{16}\b")


def _wire_norm(text: str) -> str:
    text = _ADDRS.sub("<addr>", _text_norm(text))
    return _HEXES.sub("<hex>", _EPOCHS.sub("<epoch>", text))


@dataclass
class Coordinated:
    url: str
    recorder: _Recorder
    data: Path
    log: Path
    proc: Proc


PEERS = {
    # name: (the peer agent, the coordinator that calls it over A2A)
    "bureau": (
        "tests.bench.agents.specialist:agent",
        "tests.bench.agents.coordinator:remote_agent",
    ),
    "analyst": ("tests.bench.agents.analyst:agent", "tests.bench.agents.analyst:remote_lead"),
}


@pytest.fixture(scope="module")
def coordinators(
    trees: Trees, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Coordinated]]:
    """Per peer and side ("bureau-now", "analyst-before", ...): a coordinator of that tree
    calling the peer (served by this checkout) through a recording proxy of its own."""
    tmp = tmp_path_factory.mktemp("s32-coord")
    with contextlib.ExitStack() as stack:
        peers, procs = {}, {}
        for name, (peer, _) in PEERS.items():
            port = free_port()
            argv = ["mesh", "serve", peer, "--port", str(port), "--no-register"]
            argv += ["--data-dir", str(tmp / name)]
            procs[name] = Proc.start(argv, name=name, tmp=tmp, env=clean_env())
            stack.callback(procs[name].terminate)
            peers[name] = f"http://127.0.0.1:{port}"
        sides: dict[str, Coordinated] = {}
        for name, (_, coordinator) in PEERS.items():
            for tree in ("now", "before"):
                side = f"{name}-{tree}"
                recorder = _Recorder(peers[name])
                _, proxy_port = stack.enter_context(_serving(recorder, "asyncio"))
                port = free_port()
                argv = ["mesh", "serve", coordinator, "--port", str(port), "--no-register"]
                argv += ["--data-dir", str(tmp / side)]
                env = clean_env(
                    BENCH_PEER_URL=f"http://127.0.0.1:{proxy_port}",
                    PYTHONSAFEPATH="1",
                    PYTHONPATH=trees.path(tree),
                )
                procs[side] = Proc.start(argv, name=side, tmp=tmp, env=env)
                stack.callback(procs[side].terminate)
                url = f"http://127.0.0.1:{port}"
                sides[side] = Coordinated(
                    url, recorder, tmp / side, tmp / f"{side}.log", procs[side]
                )
        for name, url in peers.items():
            wait_until_ok(url + "/health", timeout=60, proc=procs[name])
        for side, c in sides.items():
            wait_until_ok(c.url + "/health", timeout=60, proc=procs[side])
        yield sides


async def _turn(http: httpx.AsyncClient, url: str, text: str, message_id: str) -> Any:
    message = {
        "role": "ROLE_USER",
        "messageId": message_id,
        "contextId": "ctx-coord",
        "parts": [{"text": text}],
    }
    r = await http.post(url + "/", json=_rpc("SendMessage", {"message": message}), headers=HEADERS)
    return r.status_code, json.loads(_wire_norm(r.text))


def _sent(recorder: _Recorder, start: int) -> list[Any]:
    out = []
    for what, headers, body in recorder.requests[start:]:
        kept = {k: _wire_norm(v) for k, v in headers.items() if k not in {"content-length"}}
        try:
            parsed: Any = json.loads(_wire_norm(body.decode()))
        except ValueError:
            parsed = _wire_norm(body.decode(errors="replace"))
        out.append((what, sorted(kept.items()), parsed, _wire_norm(body.decode(errors="replace"))))
    return out


def _session_rows(db: Path) -> list[Any]:
    """The coordinator's sessions and session events as stored, ids and times replaced."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows: list[Any] = [
            tuple(_wire_norm(str(v)) for v in row)
            for row in conn.execute("select user_id, id, state from mesh_sessions order by id")
        ]
        rows += [
            tuple(_wire_norm(str(v)) for v in row)
            for row in conn.execute(
                "select user_id, session_id, author, data from mesh_session_events order by seq"
            )
        ]
    return rows


_LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
_LOG_VARYING = re.compile(r"(duration_ms|trace_id|process|data)[=\[ ]\S+")


def _log_lines(log: Path) -> list[str]:
    """The node's log lines of mesh's loggers, times, ids and durations replaced."""
    lines = []
    for line in log.read_text().splitlines():
        if " mesh" not in line[:60]:
            continue
        line = _LOG_VARYING.sub(r"\1=<v>", _wire_norm(_LOG_TIME.sub("", line)))
        lines.append(line)
    return lines


@pytest.mark.integration
@pytest.mark.parametrize("peer", sorted(PEERS))
async def test_a_coordinators_remote_turns_are_the_trees_before(
    coordinators: dict[str, Coordinated], client: Any, peer: str
) -> None:
    """Two turns (the second reuses the peer's context id from the session), then the peer
    answering 503, then answering text that is not JSON, then well again: the coordinator's
    answers (its task's usage and childrenUsage) and the requests it sent the peer; then,
    stopped, its session on disk and its log lines: the same on both trees. The peers: the
    bureau's typed skill, and the analyst's LLM turn (a text hop with the child's usage)."""
    failures: list[tuple[int, bytes] | None] = [
        None,
        None,
        (503, b'{"error": "busy"}'),
        (200, b"not json"),
        None,
    ]
    results: dict[str, list[Any]] = {}
    for tree in ("now", "before"):
        c = coordinators[f"{peer}-{tree}"]
        got = []
        for n, fail in enumerate(failures):
            c.recorder.fail = fail
            start = len(c.recorder.requests)
            got.append(await _turn(client, c.url, f"score APP-{n} for {400 + n}", f"coord-{n}"))
            got.append(_sent(c.recorder, start))
        c.proc.terminate()
        got.append(_session_rows(c.data / "node.db"))
        got.append(_log_lines(c.log))
        results[tree] = got
    for a, b in zip(results["now"], results["before"], strict=True):
        assert a == b


# --- 8ac99bc: the request counter kept under the method name the caller sent -----------------


def test_junk_method_names_are_not_kept_by_the_request_counter() -> None:
    """Broken by 8ac99bc: the request counter was kept under the method name the caller sent
    (up to 256 names, each up to the body limit): against a real node, 60 POST / with 2 MB
    method names grew its RSS 73 -> 193 MB (dc03330: 73 -> 77). Fixed by 0ab81fe."""
    import tracemalloc

    from prometheus_client import CollectorRegistry

    from mesh._metrics import NodeMetrics

    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", methods=["SendMessage"], process_collectors=False)
    size = 100_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            metrics.request(f"{i:06d}" + "x" * size, ok=False)  # a new str each time
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert (
        registry.get_sample_value(
            "mesh_requests_total", {"agent": "a", "method": "other", "outcome": "error"}
        )
        == 300
    )
    assert kept < 10 * size, f"{kept} bytes kept after 300 junk method names of {size} bytes"


# --- the request bytes a delegation sends, against the tree before ----------------------------

_BODIES_SOURCE = r"""
import enum, json, sys
from collections import OrderedDict
from mesh._a2a.jsonrpc import send_message_body

class Level(enum.IntEnum):
    HIGH = 2

class Name(str):
    pass

PAYLOADS = [
    {}, {"a": 1}, {"a": -0.0, "b": 1e16, "c": 2**70, "d": True, "e": None, "f": "\u00e9\ud800"},
    {"n": float("nan")}, {"i": float("inf")}, {"x": 10**5000}, {"x": 10**5000, "y": object()},
    {"y": object(), "x": 10**5000}, {"t": (1, 2)}, {"l": [1, {"a": None}]}, {"e": Level.HIGH},
    {Name("k"): "v"}, {"k": Name("v")}, {1: "int key"}, {True: "bool key"}, {None: 1},
    OrderedDict(a=1), {"nested": {"a": 1}}, {"big": 1.7976931348623157e308}, "text \u00e9",
]
METAS = [None, {}, {"caller": "c", "n": 1, "f": 0.5, "b": False, "z": None}, {"deep": {"a": 1}},
         {"e": Level.HIGH}, {"x": float("nan")}]
out = []
for payload in PAYLOADS:
    for meta in METAS:
        for wait in (True, False):
            try:
                body = send_message_body(payload, skill="s", message_id="m", context_id="c",
                                         metadata=meta, wait=wait)
                out.append(body.decode("utf-8", "replace"))
            except Exception as exc:
                out.append(f"{type(exc).__name__}: {exc}")
sys.stdout.write(json.dumps(out))
"""


def test_delegation_request_bytes_are_the_trees_before(trees: Trees) -> None:
    """``send_message_body`` for odd payloads and metadata (ints, bools, None, NaN, huge ints,
    subclasses, non-str keys, nested values) writes the same bytes, or raises the same error,
    as dc03330's."""
    got = {}
    for side in ("now", "before"):
        env = clean_env(PYTHONSAFEPATH="1", PYTHONPATH=trees.path(side))
        run = subprocess.run(
            [sys.executable, "-c", _BODIES_SOURCE], capture_output=True, env=env, timeout=60
        )
        assert run.returncode == 0, run.stderr.decode()[-2000:]
        got[side] = json.loads(run.stdout)
    assert len(got["now"]) == len(got["before"])
    diffs = [(a, b) for a, b in zip(got["now"], got["before"], strict=True) if a != b]
    assert diffs == []


# --- durability: a blocking send's task and key are on disk when it answers -------------------


@pytest.mark.integration
async def test_a_blocking_sends_task_and_key_survive_a_kill_right_after_the_answer(
    trees: Trees, tmp_path: Path, client: Any
) -> None:
    """Four sends answered, then the node killed at once (SIGKILL, no shutdown): a new process on
    the same database has every answered task (GetTask: the same task) and its idempotency
    key (the same messageId again: the same task, not run again)."""
    import asyncio

    data = tmp_path / "data"
    port = free_port()
    argv = ["mesh", "serve", "s32_agent:agent", "--port", str(port), "--no-register"]
    argv += ["--data-dir", str(data)]
    env = clean_env(PYTHONSAFEPATH="1", PYTHONPATH=trees.path("now"))
    url = f"http://127.0.0.1:{port}"
    proc = Proc.start(argv, name="durable", tmp=tmp_path, env=env)
    try:
        wait_until_ok(url + "/health", timeout=30, proc=proc)
        sends = [
            _message(skill, {"key": f"d{n}", "n": n}, f"durable-{n}")
            for n, skill in enumerate(["plain", "rich", "plain", "rich"])
        ]
        answers = await asyncio.gather(
            *(
                client.post(url + "/", json=_rpc("SendMessage", {"message": m}), headers=HEADERS)
                for m in sends
            )
        )
        proc.popen.kill()
        proc.popen.wait(10)
    finally:
        proc.terminate()
    tasks = [a.json()["result"]["task"] for a in answers]
    assert {t["status"]["state"] for t in tasks} == {"TASK_STATE_COMPLETED"}
    with running(argv, name="durable-again", tmp=tmp_path, health=url + "/health", env=env):
        for message, task in zip(sends, tasks, strict=True):
            got = await client.post(
                url + "/", json=_rpc("GetTask", {"id": task["id"]}), headers=HEADERS
            )
            stored = got.json()["result"]
            assert stored["status"]["state"] == "TASK_STATE_COMPLETED"
            assert _text_norm(json.dumps(stored["artifacts"], sort_keys=True)) == _text_norm(
                json.dumps(task["artifacts"], sort_keys=True)
            )
            again = await client.post(
                url + "/", json=_rpc("SendMessage", {"message": message}), headers=HEADERS
            )
            assert again.json()["result"]["task"]["id"] == task["id"]


# --- the specialist's metrics after the same requests, against the tree before ----------------


def _series(url: str) -> dict[str, float]:
    """The node's metric samples but timings' (buckets, sums, created times) and the
    process's own: what the same requests must count the same."""
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name.startswith(("process_", "python_")) or name.endswith(
            ("_bucket", "_sum", "_created")
        ):
            continue
        if "seconds" in name and not name.endswith("_count"):
            continue
        out[_wire_norm(name_labels)] = float(value)
    return out


@pytest.mark.integration
async def test_the_specialists_metrics_count_as_the_tree_before(nodes: Nodes, client: Any) -> None:
    """After the same requests on both nodes (this module's sends, replays, bad requests,
    GetTasks), each node's counters and gauges (tasks in flight, requests by method and
    outcome, tasks by skill and outcome, fast path sends...): the same series and values."""
    for name, params in SEND_CASES[:8]:
        fresh = {**params, "message": {**params["message"], "messageId": f"metrics-{name}"}}
        await _both_texts(client, nodes, "/", _rpc("SendMessage", fresh))
    now, before = _series(nodes.now), _series(nodes.before)
    assert {k: v for k, v in now.items() if before.get(k) != v} == {}
    assert set(now) == set(before)


# --- 5648fd0: StateView.get against Mapping.get ----------------------------------------------


def test_state_view_get_is_mapping_get_for_odd_bases() -> None:
    """``StateView.get`` (its own since 5648fd0) answers, raises and side-effects as
    ``Mapping.get`` (``__getitem__`` in a try) did, whatever the base and delta."""
    from collections import ChainMap, defaultdict
    from collections.abc import Mapping
    from types import MappingProxyType

    from mesh._tools import StateView

    class Missing(KeyError):
        pass

    class Odd(Mapping[str, Any]):
        def __init__(self) -> None:
            self.data = {"o": 1}

        def __getitem__(self, key: str) -> Any:
            if key == "boom":
                raise Missing(key)
            if key == "type":
                raise TypeError("no such key type")
            return self.data[key]

        def __iter__(self) -> Iterator[str]:
            return iter(self.data)

        def __len__(self) -> int:
            return len(self.data)

    def bases() -> list[Any]:
        return [
            {"a": 1, "n": None},
            defaultdict(lambda: "made", {"a": 1}),
            Odd(),
            MappingProxyType({"a": 2}),
            ChainMap({"a": 3}, {"b": 4}),
            StateView({"a": 5}, {"d": 6}),
        ]

    keys: list[Any] = ["a", "b", "n", "d", "missing", "boom", "type", ["unhashable"]]
    for delta in ({}, {"a": "delta", "n": 0}, {"missing": None}):
        for make in range(len(bases())):
            for key in keys:
                outcomes = []
                for how in ("own", "mapping"):
                    base = bases()[make]
                    view = StateView(base, dict(delta))
                    try:
                        got: Any = (
                            view.get(key, "dflt")
                            if how == "own"
                            else Mapping.get(view, key, "dflt")
                        )
                    except Exception as exc:
                        got = (type(exc), str(exc))
                    outcomes.append((got, dict(base) if not isinstance(base, Odd) else None))
                assert outcomes[0] == outcomes[1], (delta, make, key, outcomes)
