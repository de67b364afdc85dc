"""``OneWriteProtocol``: uvicorn's httptools protocol with an answer's head and body in one write.

    uvicorn.Config(app, http=OneWriteProtocol)      # what `mesh serve` runs when httptools is there

uvicorn writes a response's head at ``http.response.start`` and its body at the first
``http.response.body``: two ``send()`` calls, two TCP segments (TCP_NODELAY), so a caller whose
read found the head alone wakes once more for the body (~0.05 ms, the delegation's answer in
1.9 reads a call; docs/performance.md "One write per answer"). Here a head that announces a
``Content-Length`` body waits for that body's first write and leaves with it. A chunked head
(a stream: its first event may be far off), a ``HEAD`` answer's, a head with no body and any
other write go out as uvicorn wrote them.

A connection an answer ends (``Connection: close``) while its request's body is still arriving
(a refusal before the body is read: the registry's 401, 403 and 413, a node's 408) lingers: its
write side is shut after the answer, and what the client still sends is read and dropped until
it closes, at most ``LINGER_S``. Closed at once, the kernel would answer those bytes with a
reset, and a client still writing its body (most do: they read only once it is sent) gets the
reset instead of the answer it was sent (what Apache and nginx call a lingering close).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["LINGER_S", "OneWriteProtocol"]

# How long a refused request's connection keeps reading after its answer (nginx's
# lingering_timeout): enough for a client on loopback or a LAN to finish sending a body of a
# few hundred MB and read its answer; a client slower than that gets the reset it got before.
LINGER_S = 5.0


class _HeldHead:
    """A connection's transport as its answers' cycles see it: holds the head of a sized answer
    until the next write, and lingers at a refusal's close. Everything but ``write``, ``close``
    and ``is_closing`` is the transport's own."""

    __slots__ = ("_head", "_lingering", "_protocol", "_seen", "_shutting_down", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: HttpToolsProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._head: bytes | None = None
        # The cycle whose first write (its head) this has seen: later writes are its body.
        self._seen: RequestResponseCycle | None = None
        self._lingering = False
        # The server is shutting down: a close is a close (it must not wait for a client).
        self._shutting_down = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._lingering:
            return  # the answer has gone and the write side is shut
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + bytes(data))
            return
        if self._holds(data):
            return
        self._transport.write(data)

    def _holds(self, data: bytes | bytearray | memoryview) -> bool:
        """Whether ``data`` is the head of a sized answer, now held for its body."""
        try:
            cycle = self._protocol.cycle
            if cycle is None or cycle is self._seen or not cycle.response_started:
                return False
            self._seen = cycle
            sized = (
                cycle.chunked_encoding is False
                and cycle.expected_content_length > 0
                and not cycle.response_complete
                and cycle.scope["method"] != "HEAD"
            )
        except (AttributeError, KeyError):
            # These are uvicorn's internals (its cycle's state), not an API: if a release
            # moves them, answers go out as uvicorn writes them (two writes), never wrong.
            return False
        if sized:
            self._head = bytes(data)
        return sized

    def close(self) -> None:
        # An app that failed between its head and its body: the head goes out, as uvicorn's
        # own write would have sent it, before the connection closes.
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head)
        if self._lingering or not self._linger():
            self._transport.close()

    def _linger(self) -> bool:
        """Close after the client has stopped sending, if this is the close after a whole
        answer that ends the connection (``Connection: close``) while its request's body is
        still coming: whether this connection now lingers (closed later by ``_Drain``)."""
        transport = self._transport
        try:
            cycle = self._protocol.cycle
            refused = (
                cycle is not None
                # Any other close is closed at once, as uvicorn closes it: a parser error's 400
                # or an app that failed mid-answer (the app may still be reading the body and
                # must hear of the close), a shutdown or keep-alive timeout of a connection
                # kept alive (a shutdown must not wait for a client).
                and cycle.response_complete
                and not cycle.keep_alive
                and cycle.more_body
                and not cycle.disconnected
            )
        except AttributeError:  # uvicorn's internals moved: close as uvicorn would
            return False
        if self._shutting_down or not refused or transport.is_closing():
            return False  # nothing unread to cause a reset, or a shutdown's close
        if not transport.can_write_eof():
            return False  # TLS: no half-close
        self._lingering = True
        # From here the bytes go nowhere: uvicorn's parser would start a pipelined request's
        # app on a connection whose answers can no longer be written.
        transport.set_protocol(_Drain(transport, self._protocol))
        transport.write_eof()  # the answer, then FIN: the client reads all of it
        transport.resume_reading()  # uvicorn's flow control may have paused it
        return True

    def is_closing(self) -> bool:
        # uvicorn asks before arming a keep-alive timer on a finished answer.
        return self._lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Drain(asyncio.Protocol):
    """A lingering connection's protocol: drops what arrives, closes at the client's EOF or
    after ``LINGER_S``, and hands the close to uvicorn's protocol (its connection count, which
    a shutdown waits on)."""

    def __init__(self, transport: asyncio.Transport, protocol: HttpToolsProtocol) -> None:
        self._protocol = protocol
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        self._protocol.connection_lost(exc)


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol whose sized answers leave in one write, and whose
    refusals of a body still arriving close once the client has stopped sending it."""

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        # The cycles of this connection get the transport from here (on_headers_complete).
        self.transport = _HeldHead(transport, self)  # type: ignore[assignment]

    def shutdown(self) -> None:
        # uvicorn's shutdown marks a running answer's connection not kept alive; its close
        # after that answer must come at once, not once the client has stopped sending.
        held = self.transport
        if isinstance(held, _HeldHead):
            held._shutting_down = True
        super().shutdown()
