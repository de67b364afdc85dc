"""One ``DirectPool`` for several peers: each call goes to its own URL's server, whichever URL
the pool posted to last (it keeps the last URL's origin and path, by the URL object)."""

from __future__ import annotations

import asyncio
import json

import httpx

from mesh._a2a.client import A2APeer
from mesh._pool import create_transport
from tests.raw_http import TASK, ConnectionHandler, connection_server, read_request

ANSWER = json.dumps(TASK).encode()


def _server(seen: list[str], name: str) -> ConnectionHandler:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, _ = await read_request(reader)
            seen.append(f"{name} {head.split(b' ')[1].decode()}")
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
                + ANSWER
            )
            await writer.drain()

    return serve


async def test_each_call_goes_to_its_own_url() -> None:
    seen: list[str] = []
    async with (
        connection_server(_server(seen, "a")) as port_a,
        connection_server(_server(seen, "b")) as port_b,
        httpx.AsyncClient(transport=create_transport(), timeout=5.0) as http,
    ):
        a = A2APeer(http, f"http://127.0.0.1:{port_a}")
        b = A2APeer(http, f"http://127.0.0.1:{port_b}/under/here")
        for peer in (a, b, b, a, b):
            result = await peer.send({"x": 1}, skill="score", message_id="m-1")
            assert result.state == "completed"
        # A URL equal to one posted to before, in a new object: the same place.
        again = A2APeer(http, f"http://127.0.0.1:{port_a}")
        await again.send({"x": 1}, skill="score", message_id="m-1")
    assert seen == ["a /", "b /under/here", "b /under/here", "a /", "b /under/here", "a /"]
