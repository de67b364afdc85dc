"""``A2APeer.send`` through mesh's own client takes ``mesh._pool.DirectPool`` (issue 19 item 2:
the delegation's hop, h11 straight over the guarded network backend instead of httpx and
httpcore's pool) and keeps what the httpx path guaranteed: the same request on the wire, one
deadline for the whole answer, connections that a cancelled call does not leak, closed with the
client.

The server is a raw HTTP/1.1 server on loopback that records every request (its head and body)
and answers a task, per its ``mode``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from mesh._a2a.client import A2APeer
from mesh._errors import RemoteError
from mesh._pool import DirectPool, MeshTransport, create_transport
from tests.raw_http import TASK, connection_server, header_fields, read_request
from tests.support import eventually

ANSWER = json.dumps(TASK).encode()


@dataclass
class RecordingServer:
    """Every request's header lines (lower-case names) and body; ``mode`` decides the answer:
    "task" at once, "trickle" one byte every 0.1 s, "silent" never."""

    mode: str = "task"
    port: int = 0
    heads: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    open: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        try:
            while True:
                head, body = await read_request(reader)
                self.heads.append(header_fields(head))
                self.bodies.append(body)
                if self.mode == "silent":
                    await reader.read()  # until the client hangs up
                    return
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
                )
                if self.mode == "trickle":
                    for byte in ANSWER:
                        writer.write(bytes([byte]))
                        await writer.drain()
                        await asyncio.sleep(0.1)
                else:
                    writer.write(ANSWER)
                await writer.drain()
        finally:
            self.open -= 1


@asynccontextmanager
async def recording_server(mode: str = "task") -> AsyncIterator[RecordingServer]:
    state = RecordingServer(mode=mode)
    async with connection_server(state._serve) as state.port:
        yield state


async def _send(peer: A2APeer, **kwargs: object) -> object:
    return await peer.send({"applicant_id": "a-1"}, skill="score", message_id="m-1", **kwargs)  # type: ignore[arg-type]


async def test_send_takes_the_direct_pool_with_the_request_httpx_would_send() -> None:
    headers = {"X-Client": "kept", "Authorization": "Bearer client-token"}
    async with recording_server() as server:
        url = f"http://127.0.0.1:{server.port}"
        for http in (
            httpx.AsyncClient(transport=create_transport(), headers=headers, timeout=5.0),
            httpx.AsyncClient(headers=headers, timeout=5.0, trust_env=False),  # httpx sends
        ):
            async with http:
                peer = A2APeer(http, url, headers={"Authorization": "Bearer peer-token"})
                peer.credential = lambda: {"X-Mesh-Caller": "signed"}
                first = await peer.send({"applicant_id": "a-1"}, skill="score", message_id="m-1")
                assert (first.state, first.data) == ("completed", {"score": 712})
                transport = http._transport
                if isinstance(transport, MeshTransport):
                    # The call went by the direct pool: httpx's pool never saw it.
                    assert transport._pool.connections == []
                    assert len(transport.direct._idle) == 1
    direct, through_httpx = server.heads
    assert direct.pop("accept-encoding") == "identity"  # the direct path decodes nothing
    through_httpx.pop("accept-encoding")
    # Each body's own length: their JSON-RPC ids are a per-process counter, 9 and 10 say.
    for head, body in zip(server.heads, server.bodies, strict=True):
        assert head.pop("content-length") == str(len(body))
    assert direct == through_httpx
    assert direct["authorization"] == "Bearer peer-token"  # the call's over the client's
    assert direct["x-client"] == "kept"
    assert direct["x-mesh-caller"] == "signed"
    assert direct["a2a-version"] == "1.0"
    sent = [json.loads(body) for body in server.bodies]
    for body in sent:
        body.pop("id")  # a counter per process
    assert sent[0] == sent[1]


async def test_a_kept_connection_serves_the_next_call() -> None:
    async with (
        recording_server() as server,
        httpx.AsyncClient(transport=create_transport(), timeout=5.0) as http,
    ):
        peer = A2APeer(http, f"http://127.0.0.1:{server.port}")
        for _ in range(3):
            await _send(peer)
        assert server.connections == 1
        assert len(server.bodies) == 3


async def test_an_answer_trickling_past_the_deadline_ends_at_the_deadline() -> None:
    async with (
        recording_server("trickle") as server,
        httpx.AsyncClient(transport=create_transport(), timeout=30.0) as http,
    ):
        peer = A2APeer(http, f"http://127.0.0.1:{server.port}")
        started = time.monotonic()
        # Bounded: before, each byte restarted httpx's read timeout (the answer took ~25 s).
        async with asyncio.timeout(10.0):
            with pytest.raises(RemoteError) as caught:
                await _send(peer, timeout=1.0)
        assert caught.value.reason == "deadline"
        assert time.monotonic() - started < 3.0


async def test_cancelled_calls_leave_no_connection_behind() -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with (
        recording_server("silent") as silent,
        recording_server() as server,
        httpx.AsyncClient(transport=create_transport(limits=limits), timeout=5.0) as http,
    ):
        stuck = A2APeer(http, f"http://127.0.0.1:{silent.port}")
        for sent in range(1, 4):
            call = asyncio.ensure_future(_send(stuck))
            await eventually(lambda n=sent: len(silent.bodies) == n)  # type: ignore[misc]
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            # Its connection is closed (the server sees the hang-up), its slot free.
            await eventually(lambda: silent.open == 0)
        assert silent.connections == 3
        # The one slot serves another peer at once.
        peer = A2APeer(http, f"http://127.0.0.1:{server.port}")
        async with asyncio.timeout(5.0):
            await _send(peer)


async def test_closing_the_client_closes_its_direct_connections() -> None:
    async with recording_server() as server:
        async with httpx.AsyncClient(transport=create_transport(), timeout=5.0) as http:
            await _send(A2APeer(http, f"http://127.0.0.1:{server.port}"))
            assert server.open == 1
        await eventually(lambda: server.open == 0)


async def _post_body(port: int, body: bytes, deadline: float = 10.0) -> tuple[int, bytes]:
    pool = DirectPool(None, max_connections=4, keepalive_expiry=30.0)
    try:
        return await pool.post(
            httpx.URL(f"http://127.0.0.1:{port}/"),
            [("Content-Type", "application/json")],
            body,
            timeout=deadline,
            connect_timeout=deadline,
            max_bytes=1_000,
            too_large=lambda: AssertionError("too large"),
        )
    finally:
        await pool.aclose()


async def test_a_body_larger_than_the_socket_buffers_waits_for_the_peer_to_read_it() -> None:
    # The connection is the pool's own protocol (no StreamWriter): a body the kernel cannot take
    # at once pauses the write until the peer reads, then the answer is read as ever.
    body = b'{"x":"' + b"y" * (16 << 20) + b'"}'
    received: list[int] = []

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(header_fields(head)["content-length"])
        got = 0
        while got < length:
            await asyncio.sleep(0.01)  # a reader slower than the writer: the buffers fill
            got += len(await reader.read(1 << 20))
        received.append(got)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async with connection_server(slow) as port:
        assert await _post_body(port, body) == (200, b"ok")
    assert received == [len(body)]


async def test_a_peer_that_hangs_up_mid_body_is_an_httpx_error() -> None:
    # Gone while the write waits for room: the pool's write (or the read after it) fails as
    # httpx's error, not a hang until the deadline and not a bare OSError.
    async def rude(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.read(1 << 16)
        writer.transport.abort()

    body = b'{"x":"' + b"y" * (32 << 20) + b'"}'
    async with connection_server(rude) as port:
        started = time.monotonic()
        with pytest.raises((httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError)):
            await _post_body(port, body, deadline=20.0)
        assert time.monotonic() - started < 10.0


async def test_the_clients_headers_changed_between_calls_go_with_the_next() -> None:
    # A2APeer keeps its merged header list while the client's and the call's headers are the
    # same: one changed in place, replaced, or a call header changed, goes with the next call.
    async with (
        recording_server() as server,
        httpx.AsyncClient(transport=create_transport(), headers={"X-A": "1"}, timeout=5.0) as http,
    ):
        peer = A2APeer(http, f"http://127.0.0.1:{server.port}", headers={"X-Call": "c"})
        await _send(peer)
        await _send(peer)
        http.headers["X-A"] = "2"  # in place
        await _send(peer)
        http.headers["X-B"] = "b"
        await _send(peer)
        http.headers = httpx.Headers({"X-C": "3"})  # replaced
        await _send(peer)
        peer.headers = {"X-Call": "d"}
        await _send(peer)
    seen = [(h.get("x-a"), h.get("x-b"), h.get("x-c"), h["x-call"]) for h in server.heads]
    assert seen == [
        ("1", None, None, "c"),
        ("1", None, None, "c"),
        ("2", None, None, "c"),
        ("2", "b", None, "c"),
        (None, None, "3", "c"),
        (None, None, "3", "d"),
    ]


async def test_a_head_past_h11s_limit_is_refused_however_it_arrives() -> None:
    # 70 KB of head in one piece: read 64 KiB at a time (as StreamReader gave), no blank line
    # within the head limit, so h11 has it and refuses it.
    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        filler = b"".join(b"X-Fill-%d: %s\r\n" % (i, b"f" * 60) for i in range(1000))
        writer.write(b"HTTP/1.1 200 OK\r\n" + filler + b"Content-Length: 2\r\n\r\nhi")
        await writer.drain()
        await reader.read()

    async with connection_server(huge) as port:
        with pytest.raises(httpx.RemoteProtocolError, match="Receive buffer too long"):
            await _post_body(port, b"{}")


async def test_an_early_answer_then_a_half_close_is_read() -> None:
    # The peer answers before it read the body and half-closes; the connection stays open for
    # the rest of the body (as StreamReaderProtocol kept it), and the answer is read.
    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 413 Too Large\r\nContent-Length: 5\r\nConnection: close\r\n\r\nlarge"
        )
        await writer.drain()
        writer.write_eof()
        left = int(header_fields(head)["content-length"])
        while left > 0 and (data := await reader.read(1 << 16)):
            left -= len(data)

    async with connection_server(early) as port:
        assert await _post_body(port, b'{"x":"' + b"y" * (8 << 20) + b'"}') == (413, b"large")
