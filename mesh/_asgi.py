"""What a pure-ASGI gate reads of a request before its app does: the bearer credentials, and the
body under a byte limit and a deadline. Shared by the node's ``mesh._gate.RequestGate`` and the
registry's ``registry.gate.Gate``.

    given = bearer(scope)                                # b"s3cret", or None
    body = await read_body(scope, receive, limit=65536, timeout_s=30)
    # BodyTooLarge past the limit, BodyTimeout when the whole body is not in within 30 s
    if body is not None:                                 # None: the client went away
        await app(scope, replay(body, receive), send)    # the app reads the body as usual

uvicorn has no timeout of its own for a request body: without ``timeout_s`` a client that
declares a length and sends nothing more holds the request (and what it has sent) for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Message, Receive, Scope

__all__ = ["BodyTimeout", "BodyTooLarge", "bearer", "read_body", "replay"]


class BodyTooLarge(Exception):
    """The body is over the limit: its ``Content-Length`` says so, or the bytes received do."""


class BodyTimeout(Exception):
    """The whole body did not arrive within the deadline (a stalled or trickling client)."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def bearer(scope: Scope) -> bytes | None:
    """The credentials of ``Authorization: Bearer <token>`` (the scheme is case-insensitive, as
    RFC 7235 says), or None without a bearer header. Compare them with ``hmac.compare_digest``:
    the comparison must not leak how much of a token matched."""
    value = _header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, credentials = value.partition(b" ")
    return credentials.strip(b" ") if scheme.lower() == b"bearer" else None


async def read_body(
    scope: Scope,
    receive: Receive,
    *,
    limit: int,
    reserve: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> bytes | None:
    """The whole body of the request, or None if the client went away first.

    ``BodyTooLarge`` before reading a byte when ``Content-Length`` is over ``limit``, and as
    soon as the bytes received pass it (a chunked body). ``BodyTimeout`` when the whole body
    has not arrived ``timeout_s`` seconds after the call. ``reserve(size)`` is told the bytes
    received so far (what the request really holds: a declared length costs nothing until it
    arrives) before more is kept; it raises to refuse the request (the node's bound on bodies
    in flight)."""
    declared = _header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    if timeout_s is None:
        message = await receive()
        if message["type"] != "http.disconnect" and not message.get("more_body", False):
            # The whole body in one message (the usual case): _read's first turn, without its
            # coroutine and its list (~3 k instructions).
            chunk = message.get("body", b"")
            if len(chunk) > limit:
                raise BodyTooLarge
            if reserve is not None:
                reserve(len(chunk))
            return chunk  # type: ignore[no-any-return]
        return await _read(receive, limit, reserve, message)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(receive, limit, reserve)
    except TimeoutError:
        raise BodyTimeout from None


async def _read(
    receive: Receive,
    limit: int,
    reserve: Callable[[int], None] | None,
    first: Message | None = None,
) -> bytes | None:
    """The body's messages from ``receive``, from ``first`` when it was received already."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        if first is None:
            message = await receive()
        else:
            message, first = first, None
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if reserve is not None:
            reserve(size)
        chunks.append(chunk)
        more = bool(message.get("more_body", False))
    # One chunk (the usual case) is the body itself: no copy.
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands ``body`` to the app as one message, then passes on to
    ``receive`` (which tells of a disconnect). The body is handed over, not kept: once the app
    has it, the caller's reference (``del`` it) is the only other one."""
    pending = [body]

    async def replayed() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replayed
