"""``bounded_get``: one deadline for the whole answer, and a byte cap enforced while reading."""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from mesh._outbound import FetchFailed, bounded_get


def _app(routes: dict[str, httpx.Response | str]) -> httpx.AsyncClient:
    async def handler(request: httpx.Request) -> httpx.Response:
        return routes[request.url.path]  # type: ignore[return-value]

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


class _Trickle(httpx.AsyncByteStream):
    """One byte every ``gap`` seconds, forever: what a hostile instance serves."""

    def __init__(self, gap: float) -> None:
        self.gap = gap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(self.gap)
            yield b"x"


class _Endless(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            yield b"x" * 65536


async def test_small_answer_comes_back_whole() -> None:
    async with _app({"/ok": httpx.Response(200, content=b'{"a": 1}')}) as http:
        got = await bounded_get(http, "http://t/ok", max_bytes=100, timeout_s=1)
    assert (got.status_code, got.content) == (200, b'{"a": 1}')


async def test_declared_and_streamed_sizes_over_the_cap_fail() -> None:
    routes = {
        "/declared": httpx.Response(200, content=b"x" * 6_000),
        "/endless": httpx.Response(200, stream=_Endless()),
        # ~1 KB on the wire, 1 MB decoded: the cap counts what the caller would parse.
        "/bomb": httpx.Response(
            200, content=gzip.compress(b"x" * 1_000_000), headers={"Content-Encoding": "gzip"}
        ),
    }
    async with _app(routes) as http:
        for path in routes:
            with pytest.raises(FetchFailed) as caught:
                await bounded_get(http, f"http://t{path}", max_bytes=5_000, timeout_s=5)
            assert caught.value.reason == "too_large", path


async def test_a_trickling_answer_fails_at_the_total_deadline() -> None:
    async with _app({"/slow": httpx.Response(200, stream=_Trickle(0.05))}) as http:
        started = time.monotonic()
        with pytest.raises(FetchFailed) as caught:
            await bounded_get(http, "http://t/slow", max_bytes=10_000, timeout_s=0.3)
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 2.0


async def test_unreachable_hides_the_detail_from_the_reason() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(FetchFailed) as caught:
            await bounded_get(http, "http://127.0.0.1:1/x", max_bytes=10, timeout_s=2)
    assert caught.value.reason == "unreachable"
    assert "ConnectError" in caught.value.detail
