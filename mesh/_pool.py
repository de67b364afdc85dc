"""``CancelSafePool``: httpcore's connection pool, without the slot leaks that cancellation
causes, and ``create_transport``, an httpx transport on it.

Every outbound request the project makes under a deadline (``asyncio.timeout``: the registry's
probes and card fetches through ``mesh._outbound.bounded_get``, a node's calls to its peers) can
be cancelled at any moment, and httpcore 1.0.9 loses a pool slot for good at two of them. Once
``max_connections`` slots are gone, every request of that client fails with ``PoolTimeout``,
against healthy servers, until the process restarts (the registry after one flood of slow
instances: its probes and card fetches, so every registration, failed from then on).

1. **Cancelled after the pool assigned a connection, before the connection served it**
   (encode/httpcore#1093, open). The pool makes a new connection for a queued request (or hands
   it one that has not yet marked itself active) and wakes it; the request's task is cancelled
   before it runs, leaves the queue, and the connection stays: not closed, not idle, not
   available, held by no request. The fix is the one the upstream pull requests make
   (encode/httpcore#1094 and #1099; pydantic/httpx2#983, merged in that fork): whenever the pool
   reassigns connections (a request arrives, leaves or finishes), a connection that no request
   in the pool holds and that is neither idle nor closed is an orphan, and is closed first, so
   its slot serves the queue at once. A request holds its connection from assignment until its
   response is closed, and the connection turns idle or closed as that response closes, before
   the request leaves the pool: nothing in use is ever taken.
2. **Cancelled while a finished response is being closed.** httpcore shields that close with an
   anyio cancel scope, which does not stop asyncio's own ``Task.cancel`` (what
   ``asyncio.timeout`` sends): a deadline that expires during the close interrupts it after the
   stream marked itself closed and before the pool let go of the request, so the request and its
   connection stay in the pool for good. Here a response's close runs in a task of its own that
   the caller's cancellation cannot interrupt (the caller still stops at once); it takes
   microseconds (state bookkeeping, or closing a socket).

We chose this over running each whole request in a shielded task (a cancelled caller then
leaves its request running until the request's own timeouts end it): that alone leaves leak 2,
costs a task per request where this costs one per close, keeps abandoned requests alive (a
server trickling its headers a byte at a time keeps one alive as long as it likes), and holds
their slots meanwhile. Here a cancelled request releases its connection at once, as before.

3. **A stale kept-alive connection** (issue 19 item 4). A server may close an idle connection
   just as the pool hands it to a request (its keep-alive ran out at the moment ours had not):
   the request fails with ``RemoteProtocolError`` ("Server disconnected without sending a
   response") or ``ReadError``/``WriteError`` (reset) before any byte of an answer. Such a
   failure on a REUSED connection is sent once more, at once, when the request may be repeated:
   an idempotent method (GET, HEAD, OPTIONS, PUT, DELETE: card reads, probes, the registry's
   calls) or one its sender marked ``REPLAYABLE`` (``A2APeer.send``'s JSON-RPC ``SendMessage``:
   the node deduplicates by message id, so a message that did arrive runs once). Any other
   POST, a failure on a new connection, or one after the answer's headers is not retried. Mesh
   serves with a keep-alive (65 s) longer than common clients' idle expiry, so the race needs
   a server that is not mesh's or a client that keeps connections longer.

It relies on the pool's ``_requests``, ``_connections`` and ``_assign_requests_to_connections``
(httpcore 1.0.x): ``tests/test_pool.py`` fails if they change. Every long-lived client of the
project is built on it (``mesh._netguard.create_http_client``, ``RegistryBackend``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import httpcore
import httpx

from mesh._tls import client_context, trusted_ca

__all__ = ["REPLAYABLE", "CancelSafePool", "create_transport"]

_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)

#: A request extension (``httpx`` ``extensions={REPLAYABLE: True}``): this POST may be sent
#: again when a stale connection lost it (its receiver deduplicates it).
REPLAYABLE = "mesh.replayable"
# What a request on a connection the server closed under it fails with, before any answer.
_STALE = (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError)
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE"})

log = logging.getLogger("mesh._pool")


def _replayable(request: httpcore.Request) -> bool:
    """Whether ``request`` may be sent again: idempotent or marked, with a body in memory."""
    if request.method not in _IDEMPOTENT and not request.extensions.get(REPLAYABLE):
        return False
    return isinstance(request.stream, httpx.ByteStream)  # bytes, not a one-shot generator


class _CloseInTask:
    """A response stream whose ``aclose`` runs in a task the caller's cancellation cannot
    interrupt (leak 2 of the module docstring)."""

    __slots__ = ("_closing", "_stream")

    def __init__(self, stream: AsyncIterable[bytes], closing: set[asyncio.Task[None]]) -> None:
        self._stream = stream
        self._closing = closing

    def __aiter__(self) -> AsyncIterator[bytes]:
        # The pool's own iterator: it closes itself on an error while reading.
        return self._stream.__aiter__()

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is None:
            return
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(close())
        # The loop keeps only weak references to tasks: hold it until it ends.
        self._closing.add(task)
        task.add_done_callback(self._done)
        await asyncio.shield(task)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._closing.discard(task)
        if not task.cancelled():
            # A close that failed after its caller left: nobody else will read it.
            task.exception()


class CancelSafePool(httpcore.AsyncConnectionPool):
    """An ``httpcore.AsyncConnectionPool`` that no cancellation makes lose a slot (see the
    module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._closing: set[asyncio.Task[None]] = set()
        # The requests (by id) whose current connection was an existing one, not made for them.
        self._reused: set[int] = set()

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        try:
            response = await super().handle_async_request(request)
        except _STALE as exc:
            if id(request) not in self._reused or not _replayable(request):
                raise
            # Leak 3 of the module docstring: once more, on another connection (the stale one
            # is closed). Nothing of an answer came back, so nothing was consumed.
            log.debug("%s on a reused connection to %s: sending it again", exc, request.url)
            self._reused.discard(id(request))
            response = await super().handle_async_request(request)
        finally:
            self._reused.discard(id(request))
        assert isinstance(response.stream, AsyncIterable)  # the async pool's own stream
        response.stream = _CloseInTask(response.stream, self._closing)
        return response

    def create_connection(self, origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
        if self._ssl_context is None and origin.scheme == b"https":
            # Verified as ever, against the system's store read once per process (cached).
            self._ssl_context = client_context()
        return super().create_connection(origin)

    def _assign_requests_to_connections(self) -> list[httpcore.AsyncConnectionInterface]:
        held = {id(r.connection) for r in self._requests if r.connection is not None}
        orphans = [
            c
            for c in self._connections
            if id(c) not in held and not c.is_idle() and not c.is_closed()
        ]
        for connection in orphans:
            self._connections.remove(connection)
        queued = [r for r in self._requests if r.is_queued()]
        existing = {id(c) for c in self._connections}
        # Every caller closes what this returns (outside the lock, shielded).
        closing = orphans + super()._assign_requests_to_connections()
        for pool_request in queued:
            # A connection that was in the pool before this assignment is a reused one (a new
            # one serves only the request it was made for, over HTTP/1.1).
            if pool_request.connection is not None and id(pool_request.connection) in existing:
                self._reused.add(id(pool_request.request))
            else:
                self._reused.discard(id(pool_request.request))
        return closing


def create_transport(
    *,
    limits: httpx.Limits = _LIMITS,
    network_backend: httpcore.AsyncNetworkBackend | None = None,
) -> httpx.AsyncHTTPTransport:
    """An httpx transport over a ``CancelSafePool`` (HTTP/1.1, certificates verified against
    ``mesh._tls.client_context()``, nothing taken from the environment), connecting through
    ``network_backend`` if given."""
    # httpx builds a pool we replace below, with an SSL context nobody uses: verify=False makes
    # that one without loading a CA store (~50 ms of a node's start-up). Ours verifies.
    transport = httpx.AsyncHTTPTransport(trust_env=False, limits=limits, verify=False)
    # httpx has no public seam for the pool: replace the one it built with ours, same
    # settings. httpx is pinned below 1.0, where this is stable. The system's trust store
    # (another ~50 ms) is loaded at the first https connection; a bundle given to
    # ``mesh._tls.trust`` (MESH_TLS_CA) is read now, so a bad one fails at start.
    transport._pool = CancelSafePool(
        ssl_context=client_context() if trusted_ca() is not None else None,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=network_backend,
    )
    return transport
