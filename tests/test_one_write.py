"""``OneWriteProtocol`` (mesh/_one_write.py): a sized answer's head and body in one write.

uvicorn writes a head at ``http.response.start`` and the body after it: two TCP segments, and a
caller reading as soon as bytes arrive (a delegation's ``DirectPool``) wakes twice. A node served
by ``mesh serve`` answers in one; a stream's head, and a head whose app failed before its body,
still go out at once.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from mesh._one_write import OneWriteProtocol
from tests.support import clean_env, free_port, running


def _request(port: int, method: str = "GET", path: str = "/health") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


def _sized(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no content-length in {head!r}")


def _data_segments_in(sock: socket.socket) -> int:
    """Segments with data this socket has received (Linux ``tcp_info.tcpi_data_segs_in``)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < 156:
        pytest.skip("this kernel's tcp_info has no tcpi_data_segs_in")
    return int(struct.unpack_from("I", info, 152)[0])


def _answer(sock: socket.socket, port: int, method: str = "GET") -> bytes:
    """Send a request and read its whole sized answer."""
    sock.sendall(_request(port, method))
    data = b""
    while True:  # bounded: the answer is sized, a close fails the test
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep and (method == "HEAD" or len(body) >= _sized(head)):
            assert head.startswith(b"HTTP/1.1 200"), data
            return data
        more = sock.recv(65536)
        assert more, f"the connection closed mid-answer: {data!r}"
        data += more


def _segments_per_answer(sock: socket.socket, port: int, method: str = "GET") -> int:
    before = _data_segments_in(sock)
    _answer(sock, port, method)
    return _data_segments_in(sock) - before


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")
@pytest.mark.integration
def test_mesh_serve_answers_in_one_segment(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        "mesh", "serve", "agents.credit_bureau:agent", "--port", str(port),
        "--data-dir", str(tmp_path / "node"), "--no-register",
    ]  # fmt: skip
    with (
        running(
            argv,
            name="bureau",
            tmp=tmp_path,
            health=f"http://127.0.0.1:{port}/health",
            env=clean_env(),
        ),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        segments = [_segments_per_answer(sock, port) for _ in range(5)]
    # uvicorn's own protocol: 2 each (the head, then the body).
    assert segments == [1] * 5


@contextmanager
def _serving(app: Any, loop: str = "auto", **config: Any) -> Iterator[tuple[uvicorn.Server, int]]:
    """``app`` on a real uvicorn with ``OneWriteProtocol`` (and ``config``), in a thread of its
    own (its own loop, so its writes and this test's reads are apart as across processes);
    yields the server and its port. Leaving asks it to stop and waits (bounded) for it."""
    port = free_port()
    config.setdefault("timeout_graceful_shutdown", 10)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=OneWriteProtocol,
            log_config=None,
            loop=loop,
            **config,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):  # bounded: 5 s
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "uvicorn did not start"
        yield server, port
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "uvicorn did not stop"


@contextmanager
def _served(app: Any, loop: str = "auto") -> Iterator[int]:
    with _serving(app, loop) as (_, port):
        yield port


def test_a_stream_head_is_not_held() -> None:
    go = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})  # chunked
        for _ in range(1000):  # bounded: 10 s, until the test has read the head
            if go.is_set():
                break
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"event", "more_body": False})

    with _served(app) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_request(port, path="/stream"))
        head = sock.recv(65536)  # before any body was sent: a held head would time out here
        assert head.startswith(b"HTTP/1.1 200")
        assert b"transfer-encoding: chunked" in head
        go.set()
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):  # bounded by the socket's timeout
            more = sock.recv(65536)
            assert more
            rest += more
        assert b"event" in rest


def test_a_failed_app_still_sends_its_head_then_closes() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-length", b"5")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise RuntimeError("after the head")

    with _served(app) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_request(port))
        data = b""
        for _ in range(100):  # bounded: until the close
            more = sock.recv(65536)
            if not more:
                break
            data += more
        assert data.startswith(b"HTTP/1.1 200")
        assert data.endswith(b"\r\n\r\n")


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux's")
def test_head_and_sized_answers_on_one_connection() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-length", b"5")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"hello"})

    with _served(app) as port, socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        # A HEAD answer has no body to wait for: its head goes out alone, at once.
        assert _segments_per_answer(sock, port, "HEAD") == 1
        assert [_segments_per_answer(sock, port) for _ in range(3)] == [1, 1, 1]


def test_uvicorn_internals_moved_means_two_writes_not_a_broken_answer() -> None:
    """The held head reads uvicorn's cycle state, which is not an API: when a release renames
    it, the answer goes out as uvicorn writes it (head, then body), never lost or held."""
    from mesh._one_write import _HeldHead

    written: list[bytes] = []

    class Transport:
        def write(self, data: bytes) -> None:
            written.append(bytes(data))

    class Cycle:  # a cycle of some future uvicorn: started, but no chunked_encoding attribute
        response_started = True
        scope = {"method": "GET"}

    class Protocol:
        cycle = Cycle()

    held = _HeldHead(Transport(), Protocol())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
    held.write(b"{}")
    assert written == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", b"{}"]


class _Refuser:
    """An app that refuses every request's body before reading it (as the gate's 413 does),
    closing the connection, and counts the requests it was given."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.calls += 1
        body = b'{"error":"body_too_large"}'
        headers = [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _post_head(port: int, length: int) -> bytes:
    return (
        f"POST /x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}\r\n\r\n".encode()
    )


def _await_answer(sock: socket.socket) -> None:
    """Wait until the answer's first bytes are here (not read: the test reads them later)."""
    assert sock.recv(1, socket.MSG_PEEK), "closed before answering"


def _read_to_close(sock: socket.socket) -> bytes:
    data = b""
    for _ in range(10_000):  # bounded; each recv is bounded by the socket's timeout
        more = sock.recv(65536)
        if not more:
            return data
        data += more
    raise AssertionError(f"no close after {len(data)} bytes")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_client_still_sending_a_refused_body_reads_the_answer(loop: str) -> None:
    """The answer leaves before the body is read; a client that sends its whole body before
    reading (most do) must still read it. Closed at once, the unread body bytes made the
    kernel reset the connection: the client's send failed (broken pipe) and the answer was lost.
    The connection lingers instead: the body (and a request pipelined after it) is dropped,
    never run."""
    app = _Refuser()
    total = 8 * 1024 * 1024  # far more than the socket buffers hold: the server must read it
    with (
        _served(app, loop) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, total))
        _await_answer(sock)  # answered and closed (or lingering) before the body is sent
        sock.sendall(b"x" * total + _post_head(port, 0))
        answer = _read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert answer.endswith(b'{"error":"body_too_large"}')
    assert app.calls == 1


def _send_until_refused(sock: socket.socket) -> None:
    for _ in range(200):  # bounded: 10 s at most
        sock.sendall(b"x" * 65536)
        threading.Event().wait(0.05)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_lingering_connection_closes_after_linger_s(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that neither finishes its body nor closes holds the connection LINGER_S at
    most."""
    import mesh._one_write

    monkeypatch.setattr(mesh._one_write, "LINGER_S", 1.0)
    with (
        _served(_Refuser(), loop) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(_post_head(port, 1_000_000) + b"x" * 1000)
        started = time.monotonic()
        answer = _read_to_close(sock)  # the FIN after the answer: a read ends here
        assert answer.startswith(b"HTTP/1.1 413 ")
        # Lingering: what the client sends is still read (more than the socket buffers hold),
        # not answered with a reset.
        sock.sendall(b"x" * 8 * 1024 * 1024)
        # Then closed by the server: a send fails once the close has come back as a reset.
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            _send_until_refused(sock)
        assert time.monotonic() - started < 8


def test_a_lingering_connection_does_not_hold_up_shutdown() -> None:
    with _serving(_Refuser()) as (server, port):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(_post_head(port, 1_000_000))
            assert _read_to_close(sock).startswith(b"HTTP/1.1 413 ")
            started = time.monotonic()
            server.should_exit = True
            # uvicorn's shutdown waits for its connections (up to its graceful timeout): the
            # lingering one is closed by the shutdown, not left for LINGER_S.
            for _ in range(500):  # bounded: 5 s
                if not server.server_state.connections:
                    break
                threading.Event().wait(0.01)
            assert not server.server_state.connections
            assert time.monotonic() - started < 2
        finally:
            sock.close()
