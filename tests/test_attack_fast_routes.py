"""``registry.fast_routes`` against odd and hostile requests: the same pair of real registries
as ``tests/test_registry_fast_routes.py`` (one store, one app with the fast routes and one
without) must answer each alike, and a connection the fast heartbeat answered without reading
its body serves the next request on it correctly (raw sockets: pipelined requests)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.test_registry_fast_routes import SECRET, TOKEN, _answer, _pair

pytestmark = pytest.mark.integration

LONG = "a" * 20_000
_STATUS = re.compile(rb"HTTP/1\.1 ([0-9]{3}) ")

ODD_LOOKUPS = [
    "/v1/instances?agent=%FF%FE",  # not UTF-8
    "/v1/instances?agent=%00",
    "/v1/instances?agent=alpha%00",
    "/v1/instances?status=ANY",
    "/v1/instances?status=any%00",
    "/v1/instances?status",  # a name without "="
    "/v1/instances?&&=&status=any",
    "/v1/instances?agent=alpha;status=any",
    f"/v1/instances?agent={LONG}",
    "/v1/instances?agent=alpha&agent=",
    "/v1/instances?Agent=alpha",  # names are case-sensitive
    "/v1//instances",
    "/v1/instances%3Fagent=alpha",
    "/v1/%69nstances",  # an escaped path
]


async def test_odd_lookups_answer_as_fastapi_does(tmp_path: Path) -> None:
    async with _pair(tmp_path) as pair:
        for target in ODD_LOOKUPS:
            fast = _answer(await pair.fast.get(target))
            slow = _answer(await pair.fastapi.get(target))
            assert fast == slow, target
            # A body on a GET is ignored by both.
            fast = _answer(await pair.fast.request("GET", target, content=b'{"agent": "x"}'))
            slow = _answer(await pair.fastapi.request("GET", target, content=b'{"agent": "x"}'))
            assert fast == slow, target


def _odd_heartbeats() -> list[tuple[str, str, list[tuple[str, str]]]]:
    token = ("Authorization", f"Bearer {TOKEN}")
    secret = ("Mesh-Instance-Secret", SECRET)
    return [
        ("a very long id", f"/v1/instances/{LONG}/heartbeat", [token, secret]),
        ("an escaped slash in the id", "/v1/instances/alpha%2F1/heartbeat", [token, secret]),
        ("an escaped heartbeat", "/v1/instances/alpha-1/%68eartbeat", [token, secret]),
        ("a NUL in the id", "/v1/instances/alpha-1%00/heartbeat", [token, secret]),
        ("a non-UTF-8 id", "/v1/instances/%FF/heartbeat", [token, secret]),
        ("dot segments", "/v1/instances/../instances/alpha-1/heartbeat", [token, secret]),
        ("a query", "/v1/instances/alpha-1/heartbeat?x=1", [token, secret]),
        (
            "secret in another case",
            "/v1/instances/alpha-1/heartbeat",
            [token, ("MESH-INSTANCE-SECRET", SECRET)],
        ),
        (
            "a lower-case bearer",
            "/v1/instances/alpha-1/heartbeat",
            [("Authorization", f"bearer {TOKEN}"), secret],
        ),
        (
            "two tokens, the wrong first",
            "/v1/instances/alpha-1/heartbeat",
            [("Authorization", "Bearer nope"), token, secret],
        ),
    ]


async def test_odd_heartbeats_answer_as_fastapi_does(tmp_path: Path) -> None:
    async with _pair(tmp_path) as pair:
        for what, target, headers in _odd_heartbeats():
            fast = _answer(await pair.fast.put(target, headers=headers), heartbeat=True)
            slow = _answer(await pair.fastapi.put(target, headers=headers), heartbeat=True)
            assert fast == slow, what
            for method in ("HEAD", "GET", "POST"):
                fast = _answer(await pair.fast.request(method, target, headers=headers))
                slow = _answer(await pair.fastapi.request(method, target, headers=headers))
                assert fast == slow, (what, method)


async def _pipelined(port: int, requests: bytes, answers: int) -> list[bytes]:
    """Writes ``requests`` at once on one connection and reads ``answers`` status codes (the
    answers' bodies here are JSON: no status line inside them)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(requests)
        await writer.drain()
        received = b""
        async with asyncio.timeout(10.0):
            while len(_STATUS.findall(received)) < answers:
                data = await reader.read(65_536)
                if not data:
                    break
                received += data
        return _STATUS.findall(received)
    finally:
        writer.close()


async def test_a_heartbeat_body_left_unread_does_not_become_the_next_request(
    tmp_path: Path,
) -> None:
    # The fast heartbeat never reads a body: the server must still skip it, not parse it as
    # the next request (a request smuggled inside a heartbeat's body).
    smuggled = b"DELETE /v1/instances/alpha-2 HTTP/1.1\r\nHost: x\r\n\r\n"
    head = (
        b"PUT /v1/instances/alpha-1/heartbeat HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nMesh-Instance-Secret: {SECRET}\r\n".encode()
    )
    lookup = b"GET /v1/instances?agent=alpha HTTP/1.1\r\nHost: x\r\n\r\n"
    async with _pair(tmp_path) as pair:
        for client in (pair.fast, pair.fastapi):
            port = client.base_url.port
            assert port is not None
            sized = head + f"Content-Length: {len(smuggled)}\r\n\r\n".encode() + smuggled
            chunked = (
                head
                + b"Transfer-Encoding: chunked\r\n\r\n"
                + f"{len(smuggled):x}\r\n".encode()
                + smuggled
                + b"\r\n0\r\n\r\n"
            )
            for kind, request in (("sized", sized), ("chunked", chunked)):
                got = await _pipelined(port, request + lookup, 2)
                assert got == [b"200", b"200"], (client is pair.fast, kind, got)
        # Nothing was deleted: both instances of alpha are still listed.
        listed = (await pair.fast.get("/v1/instances?agent=alpha")).json()["instances"]
        assert sorted(i["instance_id"] for i in listed) == ["alpha-1", "alpha-2"]
