"""``mesh._pool.DirectPool`` against a hostile or odd HTTP/1.1 peer: a raw server on loopback
answers each request with the bytes a test scripts (real sockets, no mocks). What is checked:
an answer belongs to the request it was read for (no bytes of one answer, nor unsolicited bytes
on an idle connection, become the next request's answer), a request is sent again only when no
byte of an answer came back, redirects are not followed, framing the peer chooses (chunked, read
to close, HTTP/1.0, 1xx) is read whole, caps and the deadline hold, and nothing a caller passes
can add a header line.
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import trustme

from mesh._netguard import AddressRefused, GuardedBackend
from mesh._netpolicy import NetworkPolicy
from mesh._pool import DirectPool
from mesh._tls import trust, trusted_ca, verify_failure
from tests.raw_http import connection_server, read_request
from tests.support import eventually

pytestmark = pytest.mark.integration

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"


class TooLarge(Exception):
    pass


@dataclass
class ScriptedServer:
    """Answers the n-th request (0-based, over all connections) with ``script(n)``: the bytes
    to write, and whether to close the connection after them (None: no answer; then True
    closes at once, False waits for the client to hang up)."""

    script: Callable[[int], tuple[bytes | None, bool]]
    port: int = 0
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    open: int = 0
    most_open: int = 0
    delay: float = 0.0  # before each answer

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head, body = await read_request(reader)
                index = len(self.requests)
                self.requests.append(head + body)
                answer, close = self.script(index)
                if answer is None:
                    if not close:
                        await reader.read()  # silent until the client hangs up
                    return
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(answer)
                await writer.drain()
                if close:
                    return
        finally:
            self.open -= 1


@asynccontextmanager
async def scripted(
    script: Callable[[int], tuple[bytes | None, bool]],
) -> AsyncIterator[ScriptedServer]:
    state = ScriptedServer(script)
    async with connection_server(state.serve, close_clients=True) as state.port:
        yield state


@asynccontextmanager
async def direct(max_connections: int = 10) -> AsyncIterator[DirectPool]:
    pool = DirectPool(None, max_connections=max_connections, keepalive_expiry=30.0)
    try:
        yield pool
    finally:
        await pool.aclose()


async def _post(
    pool: DirectPool,
    port: int,
    *,
    headers: list[tuple[str, str]] | None = None,
    deadline: float = 5.0,
    max_bytes: int = 1_000,
) -> tuple[int, bytes]:
    def too_large() -> Exception:
        return TooLarge()

    return await pool.post(
        httpx.URL(f"http://127.0.0.1:{port}/"),
        headers or [("Content-Type", "application/json")],
        b'{"x": 1}',
        timeout=deadline,
        connect_timeout=deadline,
        max_bytes=max_bytes,
        too_large=too_large,
    )


async def test_bytes_past_a_short_content_length_are_not_the_next_answer() -> None:
    # The peer's first answer says 4 bytes and sends a whole second response after them.
    smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforged"

    def script(n: int) -> tuple[bytes | None, bool]:
        return (OK + smuggled if n == 0 else OK), False

    async with scripted(script) as server, direct() as pool:
        assert await _post(pool, server.port) == (200, b"real")
        # Before: the connection was kept with the forged answer in its buffer, and the next
        # request (another caller's, perhaps) read it as its own.
        assert await _post(pool, server.port) == (200, b"real")
        assert len(server.requests) == 2


async def test_an_answer_a_peer_sends_to_an_idle_connection_is_not_taken_for_the_next() -> None:
    # Some servers write "408 Request Timeout" to an idle kept-alive connection and close it.
    def script(n: int) -> tuple[bytes | None, bool]:
        if n == 0:
            timeout = (
                b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return OK + timeout, True
        return OK, False

    async with scripted(script) as server, direct() as pool:
        assert await _post(pool, server.port) == (200, b"real")
        await eventually(lambda: server.open == 0)  # the peer wrote its 408 and closed
        # Before: the 408 sitting in the idle connection's buffer was returned as this answer.
        assert await _post(pool, server.port) == (200, b"real")
        assert server.connections == 2


async def test_a_garbled_answer_on_a_reused_connection_is_not_sent_again() -> None:
    # Bytes of an answer came back: the request arrived, so it is not a stale connection.
    def script(n: int) -> tuple[bytes | None, bool]:
        return (OK, False) if n == 0 else (b"HTTP/1.1 2x0 garbage\r\n\r\n", True)

    async with scripted(script) as server, direct() as pool:
        await _post(pool, server.port)
        with pytest.raises(httpx.RemoteProtocolError):
            await _post(pool, server.port)
        assert len(server.requests) == 2  # before: 3, the second sent again on a new connection


async def test_a_reused_connection_the_peer_closed_is_retried_once_on_a_new_one() -> None:
    def script(n: int) -> tuple[bytes | None, bool]:
        return (OK, False) if n != 1 else (None, True)  # the 2nd request: closed, no answer

    async with scripted(script) as server, direct() as pool:
        await _post(pool, server.port)
        assert await _post(pool, server.port) == (200, b"real")
        assert len(server.requests) == 3
        assert server.connections == 2


async def test_a_redirect_is_returned_not_followed() -> None:
    async with scripted(lambda n: (OK, False)) as elsewhere:
        location = f"http://127.0.0.1:{elsewhere.port}/".encode()
        moved = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + location
        moved += b"\r\nContent-Length: 0\r\n\r\n"
        async with scripted(lambda n: (moved, False)) as server, direct() as pool:
            status, _ = await _post(pool, server.port)
        assert status == 307
        assert elsewhere.requests == []


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nre\r\n2\r\nal\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK,
        b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 4\r\n\r\nreal",
    ],
    ids=["chunked", "1xx", "http1.0", "connection-close"],
)
async def test_framings_a_peer_chooses_are_read_whole(answer: bytes) -> None:
    async with scripted(lambda n: (answer, False)) as server, direct() as pool:
        for _ in range(2):
            assert await _post(pool, server.port) == (200, b"real")


async def test_an_answer_read_to_its_close_is_whole_and_its_connection_not_kept() -> None:
    answer = b"HTTP/1.1 200 OK\r\n\r\nreal"
    async with scripted(lambda n: (answer, True)) as server, direct() as pool:
        assert await _post(pool, server.port) == (200, b"real")
        assert await _post(pool, server.port) == (200, b"real")
        assert server.connections == 2
        assert pool._idle == []


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"100\r\n"
        + b"x" * 256
        + b"\r\n" * 1,
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 2000,
    ],
    ids=["content-length", "chunked", "to-close"],
)
async def test_an_answer_past_the_cap_is_refused(answer: bytes) -> None:
    # The chunked one sends 256-byte chunks (four of them pass the 1,000-byte cap).
    if b"chunked" in answer:
        answer += (b"100\r\n" + b"x" * 256 + b"\r\n") * 4
    async with scripted(lambda n: (answer, True)) as server, direct() as pool:
        with pytest.raises(TooLarge):
            await _post(pool, server.port)


async def test_a_huge_header_block_is_a_protocol_error_not_a_memory_sink() -> None:
    answer = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 200_000 + b"\r\n\r\n"
    async with scripted(lambda n: (answer, True)) as server, direct() as pool:
        with pytest.raises(httpx.RemoteProtocolError):
            await _post(pool, server.port)


async def test_a_lying_long_content_length_is_a_protocol_error() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nreal"
    async with scripted(lambda n: (answer, True)) as server, direct() as pool:
        with pytest.raises(httpx.RemoteProtocolError):
            await _post(pool, server.port)


async def test_an_encoded_answer_is_refused() -> None:
    body = gzip.compress(b"real")
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
    answer += str(len(body)).encode() + b"\r\n\r\n" + body
    async with scripted(lambda n: (answer, False)) as server, direct() as pool:
        with pytest.raises(httpx.DecodingError):
            await _post(pool, server.port)


async def test_an_endless_run_of_1xx_answers_ends_at_the_deadline() -> None:
    answer = b"HTTP/1.1 102 Processing\r\n\r\n" * 200_000
    async with scripted(lambda n: (answer, True)) as server, direct() as pool:
        started = time.monotonic()
        with pytest.raises((httpx.ReadTimeout, httpx.RemoteProtocolError)):
            await _post(pool, server.port, deadline=1.0)
        assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(
    "header", [("Authorization", "Bearer t\r\nX-Injected: 1"), ("X-Mesh-Caller", "a\nb")]
)
async def test_a_line_break_in_a_header_value_is_refused_before_anything_is_sent(
    header: tuple[str, str],
) -> None:
    async with scripted(lambda n: (OK, False)) as server, direct() as pool:
        with pytest.raises(httpx.LocalProtocolError):
            await _post(pool, server.port, headers=[header])
        assert server.requests == []


async def test_calls_past_the_limit_wait_and_time_out_as_pool_timeouts() -> None:
    async with scripted(lambda n: (OK, False)) as server, direct(max_connections=2) as pool:
        server.delay = 0.2
        calls = [asyncio.ensure_future(_post(pool, server.port)) for _ in range(6)]
        assert await asyncio.gather(*calls) == [(200, b"real")] * 6
        assert server.most_open == 2

    async with scripted(lambda n: (None, False)) as silent, direct(max_connections=1) as pool:
        stuck = asyncio.ensure_future(_post(pool, silent.port, deadline=30.0))
        await eventually(lambda: len(silent.requests) == 1)
        with pytest.raises(httpx.PoolTimeout):
            await _post(pool, silent.port, deadline=0.3)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        await eventually(lambda: silent.open == 0)  # the cancelled call hung up
        assert pool._idle == []


async def test_a_certificate_for_another_host_is_refused(tmp_path: Path) -> None:
    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("other.example").configure_cert(served)  # not 127.0.0.1, not localhost
    state = ScriptedServer(lambda n: (OK, False))
    before = trusted_ca()
    trust(bundle)
    try:
        async with (
            connection_server(state.serve, close_clients=True, tls=served) as port,
            direct() as pool,
        ):
            with pytest.raises(httpx.ConnectError) as caught:
                await pool.post(
                    httpx.URL(f"https://127.0.0.1:{port}/"),
                    [],
                    b"{}",
                    timeout=5.0,
                    connect_timeout=5.0,
                    max_bytes=1000,
                    too_large=TooLarge,
                )
            assert verify_failure(caught.value) is not None
            assert state.requests == []
    finally:
        trust(before)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_each_new_connection_goes_only_where_the_network_policy_allows(host: str) -> None:
    # DirectPool bypasses httpcore: the guard must still decide, after DNS, per connection.
    async with scripted(lambda n: (OK, False)) as server:
        allowed = DirectPool(
            GuardedBackend(NetworkPolicy.parse("127.0.0.0/8")),
            max_connections=4,
            keepalive_expiry=30.0,
        )
        refused = DirectPool(
            GuardedBackend(NetworkPolicy.parse("10.0.0.0/8")),
            max_connections=4,
            keepalive_expiry=30.0,
        )
        url = httpx.URL(f"http://{host}:{server.port}/")
        args: dict[str, object] = {
            "timeout": 5.0,
            "connect_timeout": 5.0,
            "max_bytes": 1000,
            "too_large": TooLarge,
        }
        try:
            with pytest.raises(httpx.ConnectError) as caught:
                await refused.post(url, [], b"{}", **args)  # type: ignore[arg-type]
            assert isinstance(caught.value.__cause__, AddressRefused)
            assert server.requests == []
            if host == "127.0.0.1":
                assert await allowed.post(url, [], b"{}", **args) == (200, b"real")  # type: ignore[arg-type]
        finally:
            await allowed.aclose()
            await refused.aclose()


# The pool reads a textbook answer (HTTP/1.1, a final status, one Content-Length) itself and
# hands any other to h11 from its first byte: the tests below hold its own reading to h11's.


async def test_an_answer_that_says_connection_close_is_whole_and_its_connection_not_kept() -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 4\r\n\r\nreal"
    async with scripted(lambda n: (answer, False)) as server, direct() as pool:
        assert await _post(pool, server.port) == (200, b"real")
        assert await _post(pool, server.port) == (200, b"real")
        assert server.connections == 2
        assert pool._idle == []


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\ncontent-LENGTH:   4  \r\nX-Empty:\r\n\r\nreal",
        b"HTTP/1.1 200 \r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\n\r\nreal",
    ],
    ids=["spacing-and-case", "empty-reason", "no-reason", "repeated-length", "listed-length"],
)
async def test_headers_as_http_allows_them_are_read_and_the_connection_kept(answer: bytes) -> None:
    async with scripted(lambda n: (answer, False)) as server, direct() as pool:
        assert await _post(pool, server.port) == (200, b"real")
        assert await _post(pool, server.port) == (200, b"real")
        assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nreal!",
        b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\nreal",
        b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 4\r\n\r\nreal",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 4\r\n\r\nreal",
    ],
    ids=["conflicting-lengths", "negative-length", "space-in-name", "status"],
)
async def test_a_malformed_head_is_a_protocol_error(answer: bytes) -> None:
    async with scripted(lambda n: (answer, False)) as server, direct() as pool:
        with pytest.raises(httpx.RemoteProtocolError):
            await _post(pool, server.port)
        assert pool._idle == []


async def test_an_error_answer_is_cut_at_its_cap_and_the_next_answer_is_its_own() -> None:
    error = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 10000\r\n\r\n"
    error += b"e" * 10_000
    async with scripted(lambda n: (error if n == 0 else OK, False)) as server, direct() as pool:
        status, body = await pool.post(
            httpx.URL(f"http://127.0.0.1:{server.port}/"),
            [],
            b"{}",
            timeout=5.0,
            connect_timeout=5.0,
            max_bytes=100_000,
            too_large=TooLarge,
            error_bytes=4096,
        )
        assert (status, body) == (500, b"e" * 4096)
        assert await _post(pool, server.port) == (200, b"real")


@pytest.mark.parametrize(
    "header", [("Host", "elsewhere"), ("Content-Length", "1"), ("Transfer-Encoding", "chunked")]
)
async def test_a_header_the_pool_writes_itself_is_refused_before_anything_is_sent(
    header: tuple[str, str],
) -> None:
    async with scripted(lambda n: (OK, False)) as server, direct() as pool:
        with pytest.raises(httpx.LocalProtocolError):
            await _post(pool, server.port, headers=[header])
        assert server.requests == []
