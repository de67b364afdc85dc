"""Raw asyncio HTTP servers for tests, on loopback (real sockets, no mocks).

``raw_server``: answers what a hostile instance would (a trickle, an endless chunked body, any
status) and records every request target it was asked for.

    async with raw_server(answer(200, card_json)) as srv:
        ... register srv.url ...
        assert srv.requests == ["/.well-known/agent-card.json"]

``connection_server``: a connection's handler of the test's own reads each request whole
(``read_request``) and writes the bytes it chooses, so it can answer what no framework would
(a close under a kept connection, bytes past a Content-Length, nothing at all).

    async def serve(reader, writer):
        head, body = await read_request(reader)
        ...
    async with connection_server(serve) as port: ...
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

Handler = Callable[[str, asyncio.StreamWriter], Awaitable[None]]
ConnectionHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

_MAX_HEADER_LINES = 100

#: A peer's JSON-RPC answer to a blocking SendMessage: a completed task with a data artifact.
TASK = {
    "jsonrpc": "2.0",
    "id": 1,
    "result": {
        "task": {
            "id": "t-1",
            "contextId": "c-1",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a-1", "parts": [{"data": {"score": 712}}]}],
        }
    },
}


@dataclass
class RawServer:
    host: str
    port: int
    connections: int = 0
    requests: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def answer(status: int, body: bytes | str = b"", content_type: str = "application/json") -> Handler:
    """A whole answer with a Content-Length, then close."""
    data = body.encode() if isinstance(body, str) else body

    async def handle(target: str, writer: asyncio.StreamWriter) -> None:
        writer.write(
            f"HTTP/1.1 {status} Whatever\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    return handle


def trickle(gap_s: float, max_bytes: int) -> Handler:
    """Headers at once, then one byte every ``gap_s`` (``max_bytes`` at most, so it ends)."""

    async def handle(target: str, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {max_bytes}\r\n\r\n".encode()
        )
        await writer.drain()
        for _ in range(max_bytes):
            await asyncio.sleep(gap_s)
            writer.write(b" ")
            await writer.drain()

    return handle


def chunked(total_bytes: int, chunk_bytes: int = 1 << 20) -> Handler:
    """``total_bytes`` of JSON-ish filler, chunked (no Content-Length to refuse up front)."""
    chunk = b" " * chunk_bytes
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"

    async def handle(target: str, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(total_bytes // chunk_bytes):
            writer.write(frame)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return handle


@contextlib.asynccontextmanager
async def raw_server(
    handler: Handler, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RawServer]:
    """Serve ``handler`` on ``host`` (``port``, or a free one) until the block ends."""
    tasks: set[asyncio.Task[None]] = set()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        server.connections += 1
        try:
            request_line = await reader.readline()
            for _ in range(_MAX_HEADER_LINES):
                if (await reader.readline()) in (b"\r\n", b"\n", b""):
                    break
            parts = request_line.split()
            target = parts[1].decode(errors="replace") if len(parts) > 1 else ""
            server.requests.append(target)
            await handler(target, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up: that is what most tests are about
        finally:
            tasks.discard(task)
            writer.close()

    listener = await asyncio.start_server(on_connection, host, port)
    server = RawServer(host, listener.sockets[0].getsockname()[1])
    try:
        yield server
    finally:
        listener.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await listener.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request off ``reader``: its head (up to and with the blank line) and its body
    (Content-Length's bytes, none without one). ``asyncio.IncompleteReadError`` when the
    client hangs up."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def header_fields(head: bytes) -> dict[str, str]:
    """The header fields of a request's head, by lower-case name."""
    fields = {}
    for line in head.decode().split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name:
            fields[name.strip().lower()] = value.strip()
    return fields


@contextlib.asynccontextmanager
async def connection_server(
    serve: ConnectionHandler, *, close_clients: bool = False, tls: ssl.SSLContext | None = None
) -> AsyncIterator[int]:
    """Serve each connection with ``serve(reader, writer)`` on 127.0.0.1, at a free port (what
    it yields). On the way out: stop listening, close the clients' connections if
    ``close_clients`` (else each handler ends on its client's close: the client is closed
    before this block ends), and wait for the handlers to end (5 s at most). A handler need
    not catch its client hanging up, nor close ``writer``: this does both."""
    handlers: set[asyncio.Task[object]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        writers.append(writer)
        try:
            await serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client hung up: what the test checks came before
        finally:
            writer.close()

    server = await asyncio.start_server(tracked, "127.0.0.1", 0, ssl=tls)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        if close_clients:
            for writer in writers:
                writer.close()  # Python 3.11's Server has no close_clients()
        pending = [t for t in handlers if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        await server.wait_closed()
