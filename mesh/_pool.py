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

``DirectPool``: the delegation's hot path (issue 19 item 2). Every ``remote()`` call is one
``POST`` of a small JSON body to a kept-alive connection; through httpx and httpcore's pool that
cost ~1.1 ms of client CPU, most of it request/response objects and pool bookkeeping around a
few hundred bytes each way (``tests/bench/hop_client.py``). ``DirectPool.post`` speaks HTTP/1.1 on
a protocol of its own (``_Connection``: the bytes in, the end, one waiter; asyncio's streams
cost ~15 k instructions more a call): it writes the request itself (every name and value held to h11's grammar) and
reads a textbook answer (HTTP/1.1, a final status, one Content-Length) itself; any other answer
(chunked, read to its close, 1xx, HTTP/1.0, malformed) goes to h11 (what httpcore itself speaks
HTTP/1.1 with) from its first byte, which reads or refuses it. h11 alone for both was 0.39 ms of
client CPU a call; this ~0.25 ms (~1.05 M -> 0.48 M instructions). Each new connection goes to
the addresses the pool's network backend allows (``Resolver``: ``GuardedBackend`` checks every
address after DNS, and the checked address is connected to, never the name again), TLS is
``mesh._tls.client_context()`` (the URL's host verified and sent as SNI), a stale kept-alive
connection is retried once on a new one as above, one deadline bounds the whole exchange, the
answer is read within a byte cap, and the errors are httpx's own types, as httpx would raise
them, so callers translate them the same way. The transport ``create_transport`` returns
carries one (``MeshTransport.direct``; none over a backend that is not a ``Resolver``) and
closes it with itself: its connections live as long as the client, in the app lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, cast, runtime_checkable

import h11
import httpcore
import httpx

from mesh import _timeouts
from mesh._tls import client_context, trusted_ca

__all__ = [
    "REPLAYABLE",
    "CancelSafePool",
    "DirectPool",
    "MeshTransport",
    "Resolver",
    "create_transport",
    "open_checked",
    "plain_mesh_transport",
]

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


# httpcore's exceptions as httpx raises them (its transport's mapping), most specific first.
_HTTPX_ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (h11.RemoteProtocolError, httpx.RemoteProtocolError),
    (h11.LocalProtocolError, httpx.LocalProtocolError),
)
_READ_BYTES = 65_536
_DEFAULT_PORTS = {"http": 80, "https": 443}


@contextmanager
def _as_httpx() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        mapped = _httpx_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


def _httpx_error(exc: Exception) -> httpx.HTTPError | None:
    """``exc`` as httpx raises it, or None when it is not one of httpcore's or h11's."""
    for found, mapped in _HTTPX_ERRORS:
        if isinstance(exc, found):
            return mapped(str(exc))
    return None


@runtime_checkable
class Resolver(Protocol):
    """What a network backend offers ``DirectPool`` to connect where it would: the addresses
    to connect to for a host, checked (``mesh._netguard.GuardedBackend``)."""

    async def allowed_addresses(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds the lookup)
    ) -> list[str]: ...


class _Connection(asyncio.Protocol):
    """One connection of a ``DirectPool``, as the protocol of its transport: what arrives is
    gathered here and its reader woken (``read``). asyncio's ``StreamReader`` and
    ``StreamWriter`` did the same through a reader, a writer, a protocol between them and a
    coroutine per drain; a request is one write of a few hundred bytes and an answer a read
    or two, so this holds only what ``DirectPool`` asks of it: the bytes in, the end (EOF, or
    the connection lost and its error), one waiter, and write flow control."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None
        self._received: list[bytes] = []
        self._size = 0
        # The peer ended it (EOF) or it was lost; lost: with this error, if any.
        self._eof = False
        self._lost = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        # Write flow control: the transport's buffer is over its high-water mark.
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._over_ssl = False

    # -- the transport's calls ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport's subclasses: no isinstance).
        self.transport = cast("asyncio.Transport", transport)
        self._over_ssl = transport.get_extra_info("sslcontext") is not None

    def data_received(self, data: bytes) -> None:
        self._received.append(data)
        self._size += len(data)
        if self._size > 2 * _READ_BYTES and not self._reading_paused and self.transport:
            # StreamReader's limit: what nobody read yet stops further reads meanwhile.
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # As StreamReaderProtocol: a half-closed TCP connection stays open (a peer that answers
        # early and half-closes still reads the rest of the body), TLS closes.
        return not self._over_ssl

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = self._lost = True
        self._error = exc
        self._wake()
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- DirectPool's ---------------------------------------------------------------------
    def quiet(self) -> bool:
        """Whether nothing has come in since the last read: no byte and no close. A connection
        is kept and reused only so (an answer is kept only when it ended exactly at its last
        byte): bytes past an answer's end (a Content-Length that lies short, unsolicited
        output) would otherwise be read as the next request's answer."""
        transport = self.transport
        return (
            not self._received
            and not self._eof
            and transport is not None
            and not transport.is_closing()
        )

    def write(self, data: bytes) -> bool:
        """Send ``data``; True when the transport's buffer is full (then ``drain`` before
        reading): a request of a few hundred bytes never waits, and no coroutine is made for
        it. A connection lost or failing is ``httpx.WriteError``."""
        transport = self.transport
        assert transport is not None
        try:
            transport.write(data)
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
        if self._lost:
            raise self._write_error()
        return self._paused

    async def drain(self) -> None:
        """Wait until the transport's buffer has room again (``write`` said it was full)."""
        while self._paused and not self._lost:
            drained = self._drained = asyncio.get_running_loop().create_future()
            try:
                await drained
            finally:
                self._drained = None
        if self._lost:
            raise self._write_error()

    def _write_error(self) -> httpx.WriteError:
        """As StreamWriter.drain: a connection lost with an error says it (a reset: "[Errno
        104] Connection reset by peer"), one lost without says "Connection lost"."""
        error = self._error
        if error is None:
            return httpx.WriteError("Connection lost")
        return httpx.WriteError(str(error) or type(error).__name__)

    async def read(self) -> bytes:
        """The bytes that came in since the last read (waiting for some), b"" at the end; a
        connection lost with an error is ``httpx.ReadError`` (as StreamReader, even with bytes
        unread)."""
        if not self._received and not self._eof:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        error = self._error
        if error is not None:
            raise httpx.ReadError(str(error) or type(error).__name__) from error
        received = self._received
        if not received:
            return b""
        data = received[0] if len(received) == 1 else b"".join(received)
        if len(data) > _READ_BYTES:
            # At most _READ_BYTES a read, as StreamReader.read(_READ_BYTES) gave: the head's
            # limit (_MAX_HEAD, then h11's) is met as before however the bytes arrive.
            self._received = [data[_READ_BYTES:]]
            self._size = len(data) - _READ_BYTES
            data = data[:_READ_BYTES]
        else:
            self._received = []
            self._size = 0
        if self._reading_paused and self._size <= _READ_BYTES and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


@dataclass
class _Exchange:
    """How far one request got: a failure before any byte of an answer on a reused connection
    is stale."""

    reused: bool
    answered: bool = False


# The request is written by hand (mesh makes every header it sends; h11's event objects and
# per-header validation were ~0.1 ms of the ~0.4 ms ``A2APeer.send`` took), each name and
# value held to h11's own grammar (``h11._abnf``), so none can add a line of its own.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")
_TARGET = re.compile(rb"[\x21-\x7e]+")
# Headers the pool writes itself.
_OWN = frozenset({b"host", b"content-length", b"transfer-encoding"})
# The answers read without h11: HTTP/1.1, a final status, a plain header block (h11's grammar,
# narrower: no control characters, no obs-fold), one Content-Length, no Transfer-Encoding.
# Anything else (chunked, read to close, 1xx, a 204/304, HTTP/1.0, garbage) is handed whole
# to h11, which reads or refuses it as it always did.
_STATUS = re.compile(rb"HTTP/1\.1 ([0-9]{3})(?: [ \t\x21-\x7e\x80-\xff]*)?")
_FIELD = re.compile(
    rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*"
    rb"((?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?)[ \t]*"
)
# h11's limit for a header block (its max_incomplete_event_size) and a Content-Length's digits.
_MAX_HEAD = 16 * 1024
_MAX_LENGTH_DIGITS = 20
# Request heads a pool keeps (by URL and headers).
_HEADS_KEPT = 64


def _request_head(url: httpx.URL, headers: Sequence[tuple[str, str]]) -> tuple[bytes, bool]:
    """The request line and headers of a POST to ``url`` (up to its Content-Length), and
    whether they ask to close the connection after it. A name or value outside HTTP's grammar
    is ``httpx.LocalProtocolError`` (nothing is sent)."""
    target = url.raw_path
    if not _TARGET.fullmatch(target):
        raise httpx.LocalProtocolError(f"Illegal target characters: {target!r}")
    host = url.netloc
    if not _VALUE.fullmatch(host):
        raise httpx.LocalProtocolError(f"Illegal header value {host!r}")
    out = [b"POST ", target, b" HTTP/1.1\r\nHost: ", host, b"\r\n"]
    closes = False
    for name, value in headers:
        raw_name, raw_value = name.encode("ascii"), value.encode("ascii")
        if not _TOKEN.fullmatch(raw_name):
            raise httpx.LocalProtocolError(f"Illegal header name {raw_name!r}")
        if not _VALUE.fullmatch(raw_value):
            raise httpx.LocalProtocolError(f"Illegal header value {raw_value!r}")
        lower = raw_name.lower()
        if lower in _OWN:
            raise httpx.LocalProtocolError(f"{name} is written by the pool")
        if lower == b"connection":
            closes = closes or _says_close(raw_value)
        out += (raw_name, b": ", raw_value, b"\r\n")
    out.append(b"Content-Length: ")
    return b"".join(out), closes


def _call_sent(sent: Callable[[], object]) -> None:
    """``DirectPool.post``'s ``sent()``: its failure is its caller's bookkeeping's, never the
    exchange's (the request is on the wire; its answer is read as ever)."""
    try:
        sent()
    except Exception:
        log.warning("the bookkeeping run while a request is answered failed", exc_info=True)


def _says_close(value: bytes) -> bool:
    """Whether a ``Connection`` header's value asks to close the connection."""
    return b"close" in {v.strip() for v in value.lower().split(b",")}


@dataclass(frozen=True)
class _Head:
    """A textbook answer's status line and headers, as ``_textbook`` read them."""

    status: int
    length: int
    closes: bool
    #: A Content-Encoding other than identity (the answer is refused), else None.
    encoding: bytes | None


# The last heads ``_textbook`` read: a peer's answers repeat theirs byte for byte (the same
# Date within a second, the same length for the same shape of answer).
_HEADS_READ: dict[bytes, _Head | None] = {}
_HEADS_READ_KEPT = 16
# The last heads read without their Date line (``_undated``), kept apart: a new Date a second
# fills ``_HEADS_READ``, and these stay.
_UNDATED_READ: dict[bytes, _Head | None] = {}
_UNDATED_READ_KEPT = 16


def _textbook(head: bytes) -> _Head | None:
    """``head`` (an answer's status line and headers, without the blank line) when it is one
    this module reads without h11; None for anything else. The same bytes read the same: the
    last few are kept (a ``_Head`` is never changed).

    A head not kept yet is read as the one without its Date line (``_undated``) when that
    line is a field ``_read_head`` accepts: the same verdict (a Date says nothing of the
    status, length, connection or encoding), and a peer's heads without it repeat across
    seconds, so one whose Date just changed (every call, when calls are a second or more
    apart) is found without the split and a regex per line (~3 us instead of ~8.5 us)."""
    try:
        return _HEADS_READ[head]
    except KeyError:
        pass
    undated = _undated(head)
    if undated is None:
        found = _read_head(head)
    else:
        try:
            found = _UNDATED_READ[undated]
        except KeyError:
            found = _read_head(undated)
            if len(_UNDATED_READ) >= _UNDATED_READ_KEPT:
                _UNDATED_READ.clear()
            _UNDATED_READ[undated] = found
    if len(_HEADS_READ) >= _HEADS_READ_KEPT:
        _HEADS_READ.clear()
    _HEADS_READ[head] = found
    return found


# A value ``_FIELD`` accepts (with the blanks around it): a line of "date:" and such a value
# is a field it accepts, named date.
_FIELD_VALUE = re.compile(rb"[ \t\x21-\x7e\x80-\xff]*")


def _undated(head: bytes) -> bytes | None:
    """``head`` without its first ``date`` (or ``Date``) header line, when ``_read_head``
    accepts that line as a field (every byte of its value one ``_FIELD`` takes); else None.
    The rest reads to the same ``_Head`` or None as ``head``: that line is not the status
    line, and ``_read_head`` takes nothing from a field named date."""
    start = head.find(b"\r\ndate:")
    if start < 0:
        start = head.find(b"\r\nDate:")
        if start < 0:
            return None
    end = head.find(b"\r\n", start + 2)
    if end < 0:
        end = len(head)
    if _FIELD_VALUE.fullmatch(head, start + 7, end) is None:
        return None  # a byte the field's grammar refuses: read as it is (and refused there)
    return head[:start] + head[end:]


def _read_head(head: bytes) -> _Head | None:
    lines = head.split(b"\r\n")
    found = _STATUS.fullmatch(lines[0])
    if found is None:
        return None
    status = int(found[1])
    if status < 200 or status in (204, 304):
        return None
    length: int | None = None
    closes, encoding = False, None
    for line in lines[1:]:
        match = _FIELD.fullmatch(line)
        if match is None:
            return None
        name, value = match[1].lower(), match[2]
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                return None
            length = int(value)
        elif name == b"transfer-encoding":
            return None
        elif name == b"connection":
            closes = closes or _says_close(value)
        elif name == b"content-encoding" and value.lower() != b"identity":
            encoding = value  # any but identity refuses the answer, in whichever header
    if length is None:
        return None
    return _Head(status, length, closes, encoding)


class DirectPool:
    """Kept-alive HTTP/1.1 connections for one kind of request: a ``POST`` whose whole body is
    in memory and whose whole answer is read at once, which its sender may send again
    (``A2APeer.send``'s ``SendMessage``). See the module docstring."""

    def __init__(
        self,
        resolver: Resolver | None,
        *,
        max_connections: int | None,
        keepalive_expiry: float | None,
    ) -> None:
        self._resolver = resolver
        self._max = max_connections or 100
        self._expiry = keepalive_expiry
        self._slots: asyncio.Semaphore | None = None
        self._idle: list[_Connection] = []  # the most recently used last
        self._closed = False
        # Request heads by URL and headers (a peer's are the same call after call), bounded.
        self._heads: dict[tuple[bytes, bytes, tuple[tuple[str, str], ...]], tuple[bytes, bool]]
        self._heads = {}
        # The last URL posted to, with its origin, path and netloc (httpx.URL's properties
        # parse on every read; a peer posts to one URL object call after call).
        self._last_url: tuple[httpx.URL, tuple[str, str, int], bytes, bytes] | None = None

    async def post(
        self,
        url: httpx.URL,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        timeout: float | None,  # noqa: ASYNC109 - one deadline for the whole exchange
        connect_timeout: float | None,
        max_bytes: int,
        too_large: Callable[[], Exception],
        error_bytes: int = 4096,
        sent: Callable[[], object] | None = None,
    ) -> tuple[int, bytes]:
        """POST ``body`` to ``url`` and return the status and the whole answer: at most
        ``max_bytes`` (else ``too_large()`` is raised), at most ``error_bytes`` of an error
        status's (cut there). ``timeout`` bounds everything, ``connect_timeout`` a new
        connection. ``sent()`` is called as soon as the request's bytes are written, before
        the answer is waited for (again if a stale connection's request is written again): the
        caller's bookkeeping that the answer does not need runs while the peer works; it
        raising is logged and changes nothing of the exchange. Failures are httpx's exceptions: ``ConnectError`` (its cause the backend's
        refusal, or the TLS error), ``ConnectTimeout``, ``PoolTimeout`` (no free connection
        in time), ``ReadTimeout`` (the deadline passed), ``ReadError``, ``WriteError``,
        ``RemoteProtocolError``, ``LocalProtocolError`` (a header outside HTTP's grammar, or
        one the pool writes itself: Host, Content-Length, Transfer-Encoding; nothing is sent),
        ``DecodingError`` (an encoded answer: none is asked for)."""
        if self._closed:
            raise RuntimeError("the client is closed")
        last = self._last_url
        if last is None or last[0] is not url:  # httpx.URL is immutable: the same one reads same
            scheme = url.scheme
            origin = (scheme, url.host, url.port or _DEFAULT_PORTS.get(scheme, 80))
            last = self._last_url = (url, origin, url.raw_path, url.netloc)
        _, origin, raw_path, netloc = last
        key = (raw_path, netloc, tuple(headers))
        found = self._heads.get(key)
        if found is None:
            found = _request_head(url, headers)
            if len(self._heads) >= _HEADS_KEPT:
                self._heads.clear()  # a fresh credential per call: nothing to reuse
            self._heads[key] = found
        head, closes = found
        request = b"%s%d\r\n\r\n%s" % (head, len(body), body)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max)
        slots = self._slots
        # One deadline for the whole exchange, without a loop timer of its own
        # (mesh._timeouts), at this loop time. A kept connection's request is written before
        # it is entered (``_exchange``: nothing before the write waits, so nothing it bounds
        # runs sooner), so its bookkeeping is done while the peer works; a wait for a slot or
        # a new connection is under it.
        when = None if timeout is None else asyncio.get_running_loop().time() + timeout
        waiting = True
        try:
            if slots._value > 0 and not slots._waiters:
                # A free slot and no one queued for one: what ``acquire()`` does at once then
                # (its ``locked()`` is false), without its coroutine and ``locked()``'s
                # generator over the waiters, twice (~3 k instructions a call).
                slots._value -= 1
            elif slots.locked():
                with _timeouts.timeout_at(when):
                    await slots.acquire()
            else:
                await slots.acquire()  # a free slot: taken at once, nothing awaited
            try:
                waiting = False
                connection = self._take(origin)
                exchange = _Exchange(reused=connection is not None)
                if connection is None:
                    with _timeouts.timeout_at(when):
                        connection = await self._connect(origin, connect_timeout)
                try:
                    return await self._exchange(
                        connection,
                        exchange,
                        request,
                        closes,
                        max_bytes,
                        too_large,
                        error_bytes,
                        sent,
                        when,
                    )
                except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                    if not exchange.reused or exchange.answered:
                        raise
                    # A stale kept-alive connection (see the module docstring, 3.).
                    log.debug("%s on a reused connection to %s: sending it again", exc, url)
                with _timeouts.timeout_at(when):
                    connection = await self._connect(origin, connect_timeout)
                return await self._exchange(
                    connection,
                    _Exchange(reused=False),
                    request,
                    closes,
                    max_bytes,
                    too_large,
                    error_bytes,
                    sent,
                    when,
                )
            finally:
                # ``slots.release()`` (3.11-3.13: one more, then ``_wake_up_next``, which wakes
                # the first waiter not done), its calls made only when someone waits.
                slots._value += 1
                if slots._waiters:
                    slots._wake_up_next()
        except TimeoutError as exc:
            if waiting:
                raise httpx.PoolTimeout(f"no free connection within {timeout}s") from exc
            raise httpx.ReadTimeout(f"no whole answer within {timeout}s") from exc

    async def _exchange(
        self,
        connection: _Connection,
        exchange: _Exchange,
        request: bytes,
        closes: bool,
        max_bytes: int,
        too_large: Callable[[], Exception],
        error_bytes: int,
        sent: Callable[[], object] | None,
        when: float | None,
    ) -> tuple[int, bytes]:
        """One request on ``connection`` and its answer, under the deadline (loop time
        ``when``) from the moment its bytes are written: nothing awaits before that."""
        keep = False
        try:
            try:  # _as_httpx, without a context manager's generator per exchange
                full = connection.write(request)
                with _timeouts.timeout_at(when):
                    if full:
                        await connection.drain()
                    if sent is not None:
                        _call_sent(sent)
                    received = b""
                    end = -1
                    while end < 0 and len(received) <= _MAX_HEAD:
                        data = await connection.read()
                        if not data:
                            break
                        # Any byte back (even garbage) means the request arrived: not stale.
                        exchange.answered = True
                        received += data
                        end = received.find(b"\r\n\r\n")
                        if end < 0 and (b"\n\n" in received or b"\n\r\n" in received):
                            # A head h11 ends at a blank line with a bare LF: not textbook, and
                            # waiting for a CRLF one would wait for the deadline.
                            break
                    head = _textbook(received[:end]) if end >= 0 else None
                    if head is None:
                        status, answer, keep = await self._by_h11(
                            connection, received, max_bytes, too_large, error_bytes
                        )
                        keep = keep and not closes
                        return status, answer
                    status = head.status
                    if head.encoding is not None:
                        raise httpx.DecodingError(f"an answer in {head.encoding.decode()!r}")
                    if status < 400 and head.length > max_bytes:
                        raise too_large()
                    start = end + 4
                    wanted = start + (
                        head.length if status < 400 else min(head.length, error_bytes)
                    )
                    if len(received) < wanted:
                        # Joined once: adding each read to what came before copies it all again
                        # per read (a 32 MiB answer in 64 KiB reads: ~8 GB, seconds of CPU).
                        pieces, have = [received], len(received)
                        while have < wanted:
                            data = await connection.read()
                            if not data:
                                raise httpx.RemoteProtocolError(
                                    "peer closed connection without sending complete message body "
                                    f"(received {have - start} bytes, expected {head.length})"
                                )
                            pieces.append(data)
                            have += len(data)
                        received = b"".join(pieces)
                    # Kept only when the answer ended at its last byte and nothing else came in.
                    keep = (
                        not closes
                        and not head.closes
                        and len(received) == start + head.length
                        and connection.quiet()
                    )
                    return status, received[start:wanted]
            except Exception as exc:
                mapped = _httpx_error(exc)
                if mapped is None:
                    raise
                raise mapped from exc
        finally:
            if keep and not self._closed:
                self._release(connection)
            else:
                # Aborted: whatever is half-sent or half-read on it is of no use to anyone.
                connection.abort()

    async def _by_h11(
        self,
        connection: _Connection,
        received: bytes,
        max_bytes: int,
        too_large: Callable[[], Exception],
        error_bytes: int,
    ) -> tuple[int, bytes, bool]:
        """An answer that is not textbook (``_textbook``), read by h11 from its first byte
        (``received`` so far): chunked, read to its close, after 1xx, or refused as h11
        refuses it. Returns the status, the body and whether the connection may be kept."""
        state = h11.Connection(h11.CLIENT)
        # The request is on the wire already: this only tells h11 an answer to a POST is due.
        state.send(h11.Request(method="POST", target="/", headers=[("Host", "-")]))
        state.send(h11.EndOfMessage())
        state.receive_data(received)
        if not received:
            state.receive_data(b"")  # closed before any byte
        status, cap, size = 0, max_bytes, 0
        chunks: list[bytes] = []
        while True:
            event = state.next_event()
            if event is h11.NEED_DATA:
                state.receive_data(await connection.read())
            elif isinstance(event, h11.Response):
                status = event.status_code
                cap = max_bytes if status < 400 else error_bytes
                for name, value in event.headers:
                    if name == b"content-encoding" and value.lower() != b"identity":
                        raise httpx.DecodingError(f"an answer in {value.decode()!r}")
                    if (
                        name == b"content-length"
                        and status < 400
                        and (not value.isdigit() or int(value) > max_bytes)
                    ):
                        raise too_large()
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > cap:
                    if status < 400:
                        raise too_large()
                    return status, b"".join(chunks), False  # an error's first bytes do
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                pending, closed = state.trailing_data
                keep = (
                    state.our_state is h11.DONE
                    and state.their_state is h11.DONE
                    and not pending
                    and not closed
                    and connection.quiet()
                )
                return status, b"".join(chunks), keep
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    def _take(self, origin: tuple[str, str, int]) -> _Connection | None:
        """The most recently used idle connection to ``origin`` (closing expired ones)."""
        now = time.monotonic()
        if self._expiry is not None:
            while self._idle and now - self._idle[0].idle_since > self._expiry:
                self._discard(self._idle.pop(0))
        for index in range(len(self._idle) - 1, -1, -1):
            if self._idle[index].origin == origin:
                connection = self._idle.pop(index)
                if connection.quiet():
                    return connection
                # The peer wrote to it or closed it while it was idle (a "408 Request
                # Timeout", say): what it wrote answers no request of ours.
                self._discard(connection)
        return None

    def _release(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle.append(connection)
        if len(self._idle) > self._max:
            self._discard(self._idle.pop(0))

    async def _connect(
        self,
        origin: tuple[str, str, int],
        timeout: float | None,  # noqa: ASYNC109 - the connect timeout
    ) -> _Connection:
        connection = _Connection(origin)
        await _connect_checked(self._resolver, *origin, timeout, lambda: connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        connection.close()

    async def aclose(self) -> None:
        """Close every idle connection (one in use is closed when its request ends)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            self._discard(connection)


async def open_checked(
    resolver: Resolver | None,
    scheme: str,
    host: str,
    port: int,
    timeout: float | None,  # noqa: ASYNC109 - the connect timeout
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new connection to ``host:port`` on asyncio streams, where ``resolver`` allows: one of
    the addresses it checked, never the name again (``mesh._netguard``); for ``https`` TLS
    with ``mesh._tls.client_context()``, the URL's host verified and sent as SNI. Failures are
    httpx's: ``ConnectError`` (its cause the resolver's refusal, the TLS error or the last
    ``OSError``), ``ConnectTimeout``. ``mesh._outbound.get_once`` uses it (``DirectPool`` the
    same connection with its own protocol)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_BYTES, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport = await _connect_checked(resolver, scheme, host, port, timeout, lambda: protocol)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _connect_checked(
    resolver: Resolver | None,
    scheme: str,
    host: str,
    port: int,
    timeout: float | None,  # noqa: ASYNC109 - the connect timeout
    protocol: Callable[[], asyncio.Protocol],
) -> asyncio.Transport:
    """``open_checked``'s connection, its transport driving ``protocol()``'s protocol."""
    context: ssl.SSLContext | None = None
    if scheme == "https":
        context = client_context()
        context.set_alpn_protocols(["http/1.1"])
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    try:
        async with asyncio.timeout(timeout):
            with _as_httpx():
                addresses = (
                    [host]
                    if resolver is None
                    else await resolver.allowed_addresses(host, port, timeout)
                )
            for address in addresses:
                try:
                    transport, _ = await loop.create_connection(
                        protocol,
                        address,
                        port,
                        ssl=context,
                        server_hostname=host if context is not None else None,
                    )
                except ssl.SSLError as exc:
                    raise httpx.ConnectError(str(exc)) from exc  # no other address helps
                except OSError as exc:
                    last = exc
                else:
                    return transport
    except TimeoutError as exc:
        raise httpx.ConnectTimeout(f"no connection to {host}:{port} in {timeout}s") from exc
    assert last is not None
    raise httpx.ConnectError(str(last) or type(last).__name__) from last


class MeshTransport(httpx.AsyncHTTPTransport):
    """An httpx transport over a ``CancelSafePool``, with a ``DirectPool`` that connects where
    the pool's network backend would (``direct``; None for a backend that is not a
    ``Resolver``), closed with it."""

    direct: DirectPool | None = None
    #: The network backend its connections go through (None: httpcore's own).
    backend: httpcore.AsyncNetworkBackend | None = None

    async def aclose(self) -> None:
        if self.direct is not None:
            await self.direct.aclose()
        await super().aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        # ``async with httpx.AsyncClient(...)`` exits its transport here, not by ``aclose``.
        if self.direct is not None:
            await self.direct.aclose()
        await super().__aexit__(exc_type, exc_value, traceback)


def plain_mesh_transport(http: httpx.AsyncClient, url: httpx.URL) -> MeshTransport | None:
    """The ``MeshTransport`` ``http`` sends ``url`` through, when going around httpx misses
    nothing of the client's own (no auth, no event hooks): ``A2APeer.send``'s direct pool and
    the registry's probes (``mesh._outbound.get_once``) ask it; None for any other client."""
    if http.auth is not None or any(http.event_hooks.values()):
        return None
    # httpx has no public way to ask which transport (or mount) serves a URL; it is pinned
    # below 1.0, where this is stable (as the pool replaced in ``create_transport``).
    transport = http._transport_for_url(url)
    return transport if isinstance(transport, MeshTransport) else None


def create_transport(
    *,
    limits: httpx.Limits = _LIMITS,
    network_backend: httpcore.AsyncNetworkBackend | None = None,
) -> MeshTransport:
    """An httpx transport over a ``CancelSafePool`` (HTTP/1.1, certificates verified against
    ``mesh._tls.client_context()``, nothing taken from the environment), connecting through
    ``network_backend`` if given; its ``direct`` pool connects the same way."""
    # httpx builds a pool we replace below, with an SSL context nobody uses: verify=False makes
    # that one without loading a CA store (~50 ms of a node's start-up). Ours verifies.
    transport = MeshTransport(trust_env=False, limits=limits, verify=False)
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
    transport.backend = network_backend
    if network_backend is None or isinstance(network_backend, Resolver):
        transport.direct = DirectPool(
            network_backend,
            max_connections=limits.max_connections,
            keepalive_expiry=limits.keepalive_expiry,
        )
    return transport
