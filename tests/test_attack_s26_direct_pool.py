"""``mesh._pool.DirectPool`` (15eb66d: it reads a "textbook" answer itself, h11 the rest)
against a hostile or merely odd peer, held to what httpx over h11 does with the same bytes.

A raw server on loopback answers each request with scripted bytes (real sockets); the same
answer is read once by ``DirectPool`` and once by an httpx client on mesh's own transport
(httpcore + h11, what the delegation spoke before), and both must agree: the same status and
body, or the same error type and text. Beside that: a large answer read in many pieces costs
CPU linear in its size, not quadratic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest

from mesh._pool import create_transport
from tests.raw_http import connection_server, read_request
from tests.test_attack_direct_pool import TooLarge, direct, scripted

pytestmark = pytest.mark.integration

_BODY = b'{"x": 1}'


def _script(answer: bytes) -> Callable[[int], tuple[bytes | None, bool]]:
    """Each request answered with ``answer``; the connection closed after it when it says so
    (else kept, as a peer keeps it)."""
    return lambda n: (answer, b"Connection: close" in answer)


async def _direct_outcome(answer: bytes) -> tuple[object, ...]:
    async with scripted(_script(answer)) as server, direct() as pool:
        outcome: tuple[object, ...]
        try:
            status, body = await pool.post(
                httpx.URL(f"http://127.0.0.1:{server.port}/"),
                [("Content-Type", "application/json")],
                _BODY,
                timeout=5.0,
                connect_timeout=5.0,
                max_bytes=1_000,
                too_large=TooLarge,
            )
            outcome = (status, body)
        except httpx.HTTPError as exc:
            outcome = (type(exc).__name__, str(exc))
        return outcome


async def _httpx_outcome(answer: bytes) -> tuple[object, ...]:
    async with (
        scripted(_script(answer)) as server,
        httpx.AsyncClient(transport=create_transport(), timeout=5.0) as client,
    ):
        try:
            response = await client.post(
                f"http://127.0.0.1:{server.port}/",
                content=_BODY,
                headers={"Content-Type": "application/json", "Accept-Encoding": "identity"},
            )
        except httpx.HTTPError as exc:
            return (type(exc).__name__, str(exc))
        return (response.status_code, response.content)


@pytest.mark.parametrize(
    "answer",
    [
        # h11 ends a head at a blank line made with bare LFs: read at once, not at the deadline.
        b"HTTP/1.1 200 OK\nContent-Length: 4\n\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\nreal",
        # The peer closes in the body: the same error, worded as h11 words it.
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nreal\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length: +4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length : 4\r\n\r\nreal",
        b"HTTP/1.1 200 \xe2\x9c\x93\r\nX-Name: caf\xc3\xa9\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nreal",
    ],
    ids=[
        "bare-lf",
        "lf-crlf-blank",
        "crlf-lf-blank",
        "closed-mid-body",
        "length-and-chunked",
        "100-then-200",
        "obs-fold",
        "nul",
        "signed-length",
        "space-before-colon",
        "non-ascii",
        "http-1.0",
    ],
)
async def test_an_answer_is_read_as_httpx_over_h11_reads_it(answer: bytes) -> None:
    # Before: the three bare-LF heads waited for a CRLF blank line until the deadline
    # (ReadTimeout after 5 s; httpx read them at once), and a body cut short was worded
    # "...body: received 4 bytes" where h11 says "...body (received 4 bytes".
    expected = await _httpx_outcome(answer)
    started = time.monotonic()
    assert await _direct_outcome(answer) == expected
    assert time.monotonic() - started < 4.0  # not the deadline


async def test_a_gzip_answer_is_refused_whichever_content_encoding_header_comes_last() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Encoding: identity\r\n"
        b"Content-Length: 4\r\n\r\nreal"
    )
    # Before: the last Content-Encoding (identity) won, and gzip bytes were read as the answer.
    with pytest.raises(httpx.DecodingError):
        async with scripted(lambda n: (answer, False)) as server, direct() as pool:
            await pool.post(
                httpx.URL(f"http://127.0.0.1:{server.port}/"),
                [],
                _BODY,
                timeout=5.0,
                connect_timeout=5.0,
                max_bytes=1_000,
                too_large=TooLarge,
            )


_LARGE = 8 * 1024 * 1024
_PIECE = 4096


async def test_a_large_answer_in_many_pieces_costs_cpu_linear_in_its_size() -> None:
    # A slow link (or a peer that wants to) delivers a large answer a segment at a time.
    # Before: each piece was appended to all that came before (bytes += bytes), copying the
    # answer again per read: 8 MiB in 4 KiB pieces took ~2 s of CPU (32 MiB in 64 KiB: ~4 s),
    # against ~0.07 s through h11.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % _LARGE
    sent: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head)
        for offset in range(0, _LARGE, _PIECE):
            writer.write(b"x" * min(_PIECE, _LARGE - offset))
            await writer.drain()
            await asyncio.sleep(0)  # one piece per turn of the loop, as a slow link sends them
        sent.append(_LARGE)
        await reader.read()

    async with connection_server(serve, close_clients=True) as port, direct() as pool:
        cpu = time.process_time()
        status, body = await pool.post(
            httpx.URL(f"http://127.0.0.1:{port}/"),
            [],
            _BODY,
            timeout=60.0,
            connect_timeout=5.0,
            max_bytes=_LARGE,
            too_large=TooLarge,
        )
        spent = time.process_time() - cpu
    assert (status, len(body)) == (200, _LARGE)
    # The server's 2048 writes run in this process too; linear reading is ~0.1 s of it all.
    assert spent < 0.8, f"{spent:.2f} s of CPU for an 8 MiB answer in 4 KiB pieces"
