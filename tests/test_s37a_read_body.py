"""``read_body`` with its one-message fast path (session 37) reads, refuses and reserves as it
did: against the read as it was (b007e39), for any run of ASGI messages (chunks, ``more_body``,
a disconnect, an unknown type), any limit, a declared length, and a ``reserve`` that refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh._asgi import BodyTooLarge, _header, read_body


async def _reference(
    scope: Any, receive: Any, *, limit: int, reserve: Callable[[int], None] | None
) -> bytes | None:
    declared = _header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
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
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Refused(Exception):
    pass


def _message(kind: str, body: bytes | None, more: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"type": kind}
    if body is not None:
        message["body"] = body
    if more is not None:
        message["more_body"] = more
    return message


_messages = st.lists(
    st.builds(
        _message,
        st.sampled_from(["http.request", "http.request", "http.disconnect", "other"]),
        st.one_of(st.none(), st.binary(max_size=12)),
        st.sampled_from([None, False, True, 0, 1]),
    ),
    min_size=1,
    max_size=5,
)


def _run(read: Any, messages: list[dict[str, Any]], args: dict[str, Any]) -> Any:
    pending = list(messages)
    reserved: list[int] = []
    refuse_at = args.pop("refuse_at")

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    def reserve(size: int) -> None:
        reserved.append(size)
        if refuse_at is not None and size >= refuse_at:
            raise Refused

    async def go() -> Any:
        try:
            body = await read(args["scope"], receive, limit=args["limit"], reserve=reserve)
        except (BodyTooLarge, Refused) as exc:
            return type(exc), reserved, len(pending)
        return body, reserved, len(pending)

    return asyncio.run(go())


@settings(max_examples=400, deadline=None)
@given(
    _messages,
    st.integers(min_value=0, max_value=30),
    st.one_of(st.none(), st.integers(min_value=0, max_value=20)),
    st.one_of(st.none(), st.sampled_from([b"5", b"100", b"x", b"", b"0"])),
)
def test_a_body_is_read_as_before(
    messages: list[dict[str, Any]], limit: int, refuse_at: int | None, declared: bytes | None
) -> None:
    headers = [] if declared is None else [(b"content-length", declared)]
    scope = {"headers": headers}
    new = _run(read_body, messages, {"scope": scope, "limit": limit, "refuse_at": refuse_at})
    old = _run(_reference, messages, {"scope": scope, "limit": limit, "refuse_at": refuse_at})
    assert new == old
    if type(new[0]) is bytes and len(messages) == 1:
        assert new[0] is messages[0].get("body", new[0])  # the chunk itself, no copy


def test_no_reserve_and_a_deadline_read_as_before() -> None:
    async def go() -> None:
        for timeout in (None, 5.0):
            message = {"type": "http.request", "body": b"abc"}

            async def receive(message: dict[str, Any] = message) -> dict[str, Any]:
                return message

            assert await read_body({}, receive, limit=3, timeout_s=timeout) == b"abc"
            try:
                await read_body({}, receive, limit=2, timeout_s=timeout)
            except BodyTooLarge:
                pass
            else:
                raise AssertionError("over the limit")

    asyncio.run(go())
