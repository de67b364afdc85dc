"""``OneWriteProtocol``: uvicorn's httptools protocol with an answer's head and body in one write.

    uvicorn.Config(app, http=OneWriteProtocol)      # what `mesh serve` runs when httptools is there

uvicorn writes a response's head at ``http.response.start`` and its body at the first
``http.response.body``: two ``send()`` calls, two TCP segments (TCP_NODELAY), so a caller whose
read found the head alone wakes once more for the body (~0.05 ms, the delegation's answer in
1.9 reads a call; docs/performance.md "One write per answer"). Here a head that announces a
``Content-Length`` body waits for that body's first write and leaves with it. A chunked head
(a stream: its first event may be far off), a ``HEAD`` answer's, a head with no body and any
other write go out as uvicorn wrote them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["OneWriteProtocol"]


class _HeldHead:
    """A connection's transport as its answers' cycles see it: holds the head of a sized answer
    until the next write. Everything but ``write`` and ``close`` is the transport's own."""

    __slots__ = ("_head", "_protocol", "_seen", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: HttpToolsProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._head: bytes | None = None
        # The cycle whose first write (its head) this has seen: later writes are its body.
        self._seen: RequestResponseCycle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
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
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools HTTP/1.1 protocol whose sized answers leave in one write."""

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        # The cycles of this connection get the transport from here (on_headers_complete).
        self.transport = _HeldHead(transport, self)  # type: ignore[assignment]
