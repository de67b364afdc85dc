"""A peer's answers read within a byte cap, while they are read (not after).

Whoever discovery names may answer a call with gigabytes: httpx reads a whole body into memory
(``.content``, ``.json()``), and the SDK's SSE reader keeps an event until its blank line.
``read_bounded`` reads one body chunk by chunk and gives up as soon as it passes ``max_bytes``
(a declared ``Content-Length`` over it before reading a byte); ``BoundedTransport`` does the same
for every answer the SDK's client reads through it, and for a stream caps each event instead of
the whole stream (a long chat may stream more than any one answer holds). Bytes are counted
decoded: a small gzip answer cannot expand past the cap.

    try:
        content = await read_bounded(response, max_bytes=32 << 20)
    except AnswerTooLarge:
        ...                                    # not an A2A answer: try another instance

    sdk_http = httpx.AsyncClient(transport=BoundedTransport(http, max_bytes=32 << 20))
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

__all__ = ["AnswerTooLarge", "BoundedTransport", "read_bounded"]

# Blank lines that end an SSE event, whatever the line ending.
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\n\r\n")


class AnswerTooLarge(httpx.RequestError):
    """An answer (or one event of a stream) over the cap. An ``httpx.RequestError``, so the
    SDK's transport wraps it like any failed read (``A2AClientError``, this as its cause)."""

    def __init__(self, max_bytes: int, *, what: str = "answer") -> None:
        super().__init__(f"the {what} is over {max_bytes} bytes")
        self.max_bytes = max_bytes


def _declared_over(response: httpx.Response, max_bytes: int) -> bool:
    declared = response.headers.get("content-length", "")
    return declared.isdigit() and int(declared) > max_bytes


async def read_bounded(response: httpx.Response, *, max_bytes: int) -> bytes:
    """The body of a streamed ``response`` (``client.send(..., stream=True)``), or
    ``AnswerTooLarge`` once more than ``max_bytes`` arrived. The caller closes the response."""
    if _declared_over(response, max_bytes):
        raise AnswerTooLarge(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge(max_bytes)
        chunks.append(chunk)
    # One chunk (the usual case) is the body itself: join returns it without a copy.
    return b"".join(chunks)


class _BoundedStream(httpx.AsyncByteStream):
    """The decoded body of ``response``, failing past ``max_bytes`` (per event for SSE)."""

    def __init__(self, response: httpx.Response, max_bytes: int, events: bool) -> None:
        self._response = response
        self._max = max_bytes
        self._events = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = 0  # bytes since the last event ended (or since the start)
        tail = b""
        async for chunk in self._response.aiter_bytes():
            if self._events:
                data = tail + chunk
                ends = [data.rfind(mark) + len(mark) for mark in _EVENT_ENDS if mark in data]
                end = max(ends, default=-1)
                pending = pending + len(chunk) if end < 0 else len(data) - end
                tail = data[-2:]
            else:
                pending += len(chunk)
            if pending > self._max:
                raise AnswerTooLarge(self._max, what="event" if self._events else "answer")
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """Sends each request through ``client`` (its pool, its network checks, its mounts) and
    hands back the answer read within ``max_bytes`` (see the module docstring). Closing it
    leaves ``client`` open: it belongs to the caller."""

    def __init__(self, client: httpx.AsyncClient, *, max_bytes: int) -> None:
        self.client = client
        self.max_bytes = max_bytes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.client.send(request, stream=True)
        if _declared_over(response, self.max_bytes):
            await response.aclose()
            raise AnswerTooLarge(self.max_bytes)
        events = response.headers.get("content-type", "").startswith("text/event-stream")
        # The body goes on decoded: its length and encoding headers no longer describe it.
        headers = [
            (name, value)
            for name, value in response.headers.raw
            if name.lower() not in (b"content-length", b"content-encoding")
        ]
        return httpx.Response(
            response.status_code,
            headers=headers,
            stream=_BoundedStream(response, self.max_bytes, events),
            extensions=response.extensions,
            request=request,
        )
