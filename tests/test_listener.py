"""``bind_listener``: the socket ``mesh serve`` and ``mesh registry`` hand to uvicorn.

Its accepted connections must have TCP_NODELAY on asyncio's own loop too (uvicorn's when uvloop
is absent): an answer goes out in two writes (head, then body), and with Nagle on the second
waits for the client's delayed ACK, ~45 ms a request (docs/performance.md "The listening
socket"). asyncio sets the option only on sockets whose proto says TCP.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from mesh._errors import ConfigError
from mesh._listener import bind_listener


def _nodelay_of_accepted(sock: socket.socket) -> int:
    """Serve ``sock`` on a plain asyncio loop (never uvloop), connect once, and return the
    accepted connection's TCP_NODELAY as the server's transport has it."""

    async def main() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        port = sock.getsockname()[1]
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            value = await asyncio.wait_for(seen, 5)
            writer.close()
            return value
        finally:
            server.close()
            await server.wait_closed()

    runner = asyncio.Runner(loop_factory=asyncio.SelectorEventLoop)
    with runner:
        return runner.run(main())


def test_accepted_connections_have_nodelay_on_asyncio_loop() -> None:
    sock = bind_listener("127.0.0.1", 0)
    assert _nodelay_of_accepted(sock) != 0


def test_busy_port_is_a_config_error() -> None:
    first = bind_listener("127.0.0.1", 0)
    first.listen()
    try:
        with pytest.raises(ConfigError, match="already in use"):
            bind_listener("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()
