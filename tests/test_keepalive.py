"""Issue 19 item 4: no connection-reuse errors. A server that closes a kept-alive connection as
the client reuses it (its keep-alive ran out at that moment) loses the request before any byte
of an answer; mesh's clients (``mesh._pool``) send it once more when it may be repeated, and
mesh serves with a keep-alive longer than common clients' idle expiry.

The server here is a raw HTTP/1.1 server on loopback that answers the first request of every
connection, keeps the connection, and closes it on the next request without answering: the
race, every time.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from mesh._a2a.client import A2APeer
from mesh._pool import create_transport
from tests.raw_http import TASK, connection_server, read_request


@dataclass
class ClosingServer:
    """What the server saw: every request's body, and how many it dropped unanswered."""

    port: int = 0
    bodies: list[bytes] = field(default_factory=list)
    dropped: int = 0
    reset: bool = False  # drop with a TCP reset (ReadError) rather than a clean close

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        while True:
            _, body = await read_request(reader)
            self.bodies.append(body)
            if answered:
                # The kept connection's next request: closed under it, no answer.
                self.dropped += 1
                if self.reset:
                    sock = writer.get_extra_info("socket")
                    # Linger 0: close sends RST, the client's read fails with a reset.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.close()
                return
            answer = json.dumps(TASK).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
            await writer.drain()
            answered += 1


@asynccontextmanager
async def closing_server(*, reset: bool = False) -> AsyncIterator[ClosingServer]:
    state = ClosingServer(reset=reset)
    async with connection_server(state._serve) as state.port:
        yield state


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=create_transport(), timeout=5.0)


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_get_on_a_connection_the_server_closes_is_sent_again(reset: bool) -> None:
    async with closing_server(reset=reset) as server, _client() as http:  # client closes first
        url = f"http://127.0.0.1:{server.port}/.well-known/agent-card.json"
        assert (await http.get(url)).status_code == 200
        # The kept connection is reused, closed under the request, and the request sent again
        # on a new one (before: httpx.RemoteProtocolError / ReadError).
        assert (await http.get(url)).status_code == 200
        assert server.dropped == 1
        assert len(server.bodies) == 3


async def test_send_message_is_sent_again_with_the_same_message_id() -> None:
    async with closing_server() as server, _client() as http:
        peer = A2APeer(http, f"http://127.0.0.1:{server.port}")
        first = await peer.send({"applicant_id": "a-1"}, skill="score", message_id="m-1")
        second = await peer.send({"applicant_id": "a-2"}, skill="score", message_id="m-2")
        assert (first.state, second.state) == ("completed", "completed")
        ids = [json.loads(b)["params"]["message"]["messageId"] for b in server.bodies]
        # m-2 lost on the stale connection, then sent again, the same message (the node
        # deduplicates by its id, so a resend of one that did arrive runs it once).
        assert ids == ["m-1", "m-2", "m-2"]
        assert server.dropped == 1


async def test_a_post_not_marked_replayable_is_not_sent_again() -> None:
    async with closing_server() as server, _client() as http:
        url = f"http://127.0.0.1:{server.port}/"
        assert (await http.post(url, content=b"{}")).status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(url, content=b"{}")
        assert len(server.bodies) == 2


async def test_a_failure_on_a_new_connection_is_not_sent_again() -> None:
    # A server that drops the FIRST request of a connection: nothing stale about it.
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))

    seen: list[bytes] = []
    async with connection_server(drop) as port, _client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get(f"http://127.0.0.1:{port}/health")
    assert len(seen) == 1


def test_mesh_serves_with_a_keep_alive_longer_than_common_clients_idle_expiry() -> None:
    from mesh._cli.serve import KEEP_ALIVE_S as NODE
    from registry.server import KEEP_ALIVE_S as REGISTRY

    # httpx keeps an idle connection 5 s, aiohttp 15 s, Node.js's agent 5 s; an AWS ALB 60 s.
    clients = (httpx.Limits().keepalive_expiry or 0, 15, 60)
    assert min(NODE, REGISTRY) > max(clients)
