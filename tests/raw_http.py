"""A raw asyncio HTTP server for tests: it answers what a hostile instance would (a trickle, an
endless chunked body, any status) and records every request target it was asked for.

    async with raw_server(answer(200, card_json)) as srv:
        ... register srv.url ...
        assert srv.requests == ["/.well-known/agent-card.json"]
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

Handler = Callable[[str, asyncio.StreamWriter], Awaitable[None]]

_MAX_HEADER_LINES = 100


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
