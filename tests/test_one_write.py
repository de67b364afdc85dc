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
def _served(app: Any) -> Iterator[int]:
    """``app`` on a real uvicorn with ``OneWriteProtocol``, in a thread of its own (its own
    loop, so its writes and this test's reads are apart as across processes)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, http=OneWriteProtocol, log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(500):  # bounded: 5 s
            if server.started:
                break
            threading.Event().wait(0.01)
        assert server.started, "uvicorn did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


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
