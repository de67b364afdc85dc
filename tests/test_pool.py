"""``mesh._pool``: requests cancelled under pool contention never cost the client a slot.

A real HTTP/1.1 server on 127.0.0.1 (in this process) answers slowly while hundreds of requests
are cancelled by their deadlines at every stage (queued for a slot, connecting, reading, while
their finished response is closed). Afterwards the client must still open ``max_connections``
requests at once: before ``CancelSafePool`` some slots were gone for good (encode/httpcore#1093,
and a close interrupted by ``asyncio.timeout``), and with all of them gone every request failed
with ``PoolTimeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from mesh._discovery.registry_client import RegistryBackend
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._pool import CancelSafePool, create_transport
from tests.support import eventually

_BODY = b'{"instances": []}'
_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class SlowServer:
    """Answers each request after ``delay()`` seconds; while ``hold`` is set, instead holds
    every request until ``hold`` requests are in at once (at most 5 s), and records the most
    it saw together in ``most``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.in_flight = 0
        self.most = 0
        self.hold = 0
        self._all_in = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self.url = ""

    def delay(self) -> float:
        return self.rng.random() * 0.05

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = await reader.read(4096)
                    if not chunk:
                        return
                    head += chunk
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
                try:
                    if self.hold:
                        if self.in_flight >= self.hold:
                            self._all_in.set()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(5.0):
                                await self._all_in.wait()
                    else:
                        await asyncio.sleep(self.delay())
                finally:
                    self.in_flight -= 1
                writer.write(_ANSWER)
                await writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            return
        finally:
            writer.close()
            self._handlers.discard(task)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SlowServer]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=1024)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await server.wait_closed()


async def _churn(server: SlowServer, call: Callable[[], Awaitable[object]], width: int) -> None:
    """``width`` requests at a time for 1.5 s, each cancelled by a random deadline of at most
    50 ms against answers that take up to 50 ms: cancellations land at every stage."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.5

    async def one() -> None:
        with contextlib.suppress(TimeoutError, httpx.HTTPError, Exception):
            async with asyncio.timeout(server.rng.random() * 0.05):
                await call()

    while loop.time() < deadline:
        await asyncio.gather(*(one() for _ in range(width)))


async def _all_slots_open_at_once(
    server: SlowServer, call: Callable[[], Awaitable[object]], slots: int
) -> None:
    await eventually(lambda: server.in_flight == 0, within=5, what="the churn's answers sent")
    server.most, server.hold = 0, slots
    async with asyncio.timeout(20):
        await asyncio.gather(*(call() for _ in range(slots)))
    assert server.most == slots, f"only {server.most} of {slots} slots were left"


async def test_the_guarded_client_keeps_every_slot_through_a_cancellation_storm() -> None:
    async with SlowServer(seed=1).running() as server:
        http = create_http_client(
            NetworkPolicy.parse("loopback"),
            timeout=httpx.Timeout(5.0),
            limits=httpx.Limits(max_connections=5),
        )
        async with http:

            async def call() -> object:
                return (await http.get(server.url + "/health")).raise_for_status()

            await _churn(server, call, width=20)
            await _all_slots_open_at_once(server, call, slots=5)


async def test_a_plain_transport_keeps_every_slot_through_a_cancellation_storm() -> None:
    async with SlowServer(seed=2).running() as server:
        transport = create_transport(limits=httpx.Limits(max_connections=5))
        async with httpx.AsyncClient(transport=transport, timeout=5.0) as http:

            async def call() -> object:
                async with http.stream("GET", server.url + "/x") as response:
                    return await response.aread()

            await _churn(server, call, width=20)
            await _all_slots_open_at_once(server, call, slots=5)


@pytest.mark.integration
async def test_the_registry_backend_keeps_every_slot_through_a_cancellation_storm() -> None:
    async with SlowServer(seed=3).running() as server:
        backend = RegistryBackend(server.url, timeout=5.0)
        try:
            # Its pool has 100 slots: 150 at a time contend for them.
            await _churn(server, backend.find, width=150)
            await _all_slots_open_at_once(server, backend.find, slots=100)
        finally:
            await backend.aclose()


async def test_a_cancellation_during_the_close_of_an_answer_loses_no_slot() -> None:
    """A deadline that expires while a finished answer is being closed (httpcore's anyio
    shield does not stop asyncio's cancel): the one slot of the pool must be free after."""
    async with SlowServer(seed=4).running() as server:
        server.delay = lambda: 0.0
        transport = create_transport(limits=httpx.Limits(max_connections=1))
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as http:

            async def cancelled_while_closing() -> None:
                async with http.stream("GET", server.url + "/x") as response:
                    me = asyncio.current_task()
                    assert me is not None
                    # The answer came in one write, so reading its body does not wait: the
                    # first suspension is in the close that follows the last byte.
                    asyncio.get_running_loop().call_soon(me.cancel)
                    await response.aread()

            for _ in range(3):
                task = asyncio.create_task(cancelled_while_closing())
                with pytest.raises(asyncio.CancelledError):
                    await task
                answer = await http.get(server.url + "/x", timeout=httpx.Timeout(2.0, pool=1.0))
                assert answer.status_code == 200


def test_the_pool_internals_it_relies_on_are_there() -> None:
    """``CancelSafePool`` reads httpcore 1.0.x internals; an httpcore that renamed them must
    fail here, not quietly leak again."""
    pool = CancelSafePool(max_connections=1)
    assert pool._requests == []
    assert pool._connections == []
    assert pool._assign_requests_to_connections() == []
    assert isinstance(create_transport()._pool, CancelSafePool)
