"""``mesh._outbound.get_once``, the registry's probe: a GET on a connection of its own, made
around httpx (h11 on asyncio streams) yet held to everything ``bounded_get`` is: the network
policy after DNS, one deadline, the byte cap, TLS verification, the same failure words."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import httpx
import pytest
import trustme

from mesh._netguard import AddressRefused, create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._outbound import FetchFailed, get_once
from mesh._tls import trust, trusted_ca
from tests.raw_http import (
    Handler,
    answer,
    chunked,
    connection_server,
    header_fields,
    raw_server,
    read_request,
    trickle,
)

pytestmark = pytest.mark.integration


def _client(spec: str) -> httpx.AsyncClient:
    return create_http_client(NetworkPolicy.parse(spec), timeout=2)


async def test_the_probe_goes_around_httpx_on_a_connection_it_closes() -> None:
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        heads.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n" + b'{"instance_id":1}')
        await writer.drain()
        await reader.read()  # until the client hangs up: it must, the answer is whole

    async with connection_server(serve) as port, _client("loopback") as http:
        first = await get_once(
            http, f"http://127.0.0.1:{port}/health?stats=1", max_bytes=100, timeout_s=5
        )
        second = await get_once(http, f"http://127.0.0.1:{port}/health", max_bytes=100, timeout_s=5)
    assert (first.status_code, first.content) == (200, b'{"instance_id":1}')
    assert second.status_code == 200
    assert len(heads) == 2  # one connection each, none kept
    assert heads[0].startswith(b"GET /health?stats=1 HTTP/1.1\r\n")
    fields = header_fields(heads[0])
    assert fields["connection"] == "close"
    assert fields["accept-encoding"] == "identity"
    assert "user-agent" not in fields  # httpx would have sent python-httpx/...


async def test_a_host_outside_the_allowed_networks_is_refused_at_connect_time() -> None:
    async with raw_server(answer(200, "{}"), host="127.0.0.2") as srv:
        async with _client("127.0.0.1/32") as http:
            with pytest.raises(FetchFailed) as caught:
                await get_once(http, f"{srv.url}/health", max_bytes=100, timeout_s=2)
        assert caught.value.reason == "refused"
        assert isinstance(caught.value.__cause__, AddressRefused)
        assert caught.value.__cause__.allowed == "127.0.0.1/32"
        # A name is judged by what it resolves to (localhost: 127.0.0.1, maybe ::1).
        async with _client("127.0.0.2/32") as http:
            with pytest.raises(FetchFailed) as caught:
                await get_once(http, f"http://localhost:{srv.port}/", max_bytes=100, timeout_s=2)
        assert caught.value.reason == "refused"
        assert srv.connections == 0


async def test_a_slow_trickle_health_hits_the_one_deadline() -> None:
    # A byte every 0.1 s keeps every read short; only a deadline on the whole answer ends it.
    async with raw_server(trickle(0.1, 1000)) as srv, _client("loopback") as http:
        started = time.monotonic()
        with pytest.raises(FetchFailed) as caught:
            await get_once(http, f"{srv.url}/health", max_bytes=10_000, timeout_s=0.6)
        took = time.monotonic() - started
    assert caught.value.reason == "timeout"
    assert 0.5 < took < 3.0


@pytest.mark.parametrize(
    "handler", [answer(200, "x" * 2000), chunked(4 << 20, 1 << 16)], ids=["length", "chunked"]
)
async def test_an_answer_over_the_cap_is_too_large(handler: Handler) -> None:
    async with raw_server(handler) as srv, _client("loopback") as http:
        with pytest.raises(FetchFailed) as caught:
            await get_once(http, f"{srv.url}/health", max_bytes=1000, timeout_s=5)
    assert caught.value.reason == "too_large"


async def test_a_refused_port_is_unreachable_and_a_non_200_is_an_answer() -> None:
    async with raw_server(answer(503, "down")) as srv, _client("loopback") as http:
        r = await get_once(http, f"{srv.url}/health", max_bytes=100, timeout_s=5)
        assert (r.status_code, r.content) == (503, b"down")
    with pytest.raises(FetchFailed) as caught:
        async with _client("loopback") as http:
            await get_once(http, f"http://127.0.0.1:{srv.port}/", max_bytes=100, timeout_s=5)
    assert caught.value.reason == "unreachable"


async def test_https_is_verified_against_the_mesh_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    good = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(good)
    wrong = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("other.example").configure_cert(wrong)  # not 127.0.0.1
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        requests.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()

    before = trusted_ca()
    trust(bundle)
    try:
        async with _client("loopback") as http:
            async with connection_server(serve, close_clients=True, tls=good) as port:
                r = await get_once(
                    http, f"https://127.0.0.1:{port}/health", max_bytes=100, timeout_s=5
                )
            assert (r.status_code, r.content) == (200, b"{}")
            async with connection_server(serve, close_clients=True, tls=wrong) as port:
                with pytest.raises(FetchFailed) as caught:
                    await get_once(http, f"https://127.0.0.1:{port}/", max_bytes=100, timeout_s=5)
        assert caught.value.reason == "tls"
        assert len(requests) == 1  # nothing was sent to the one that failed verification
    finally:
        trust(before)
