"""The card names the origin its caller used (a loopback one), or ``MESH_PUBLIC_URL``; a hostile
``Host`` never lands in it; caching headers (``ETag``, ``Last-Modified``, ``Vary``); the registry
registers the configured URL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types import AgentCard
from google.protobuf.json_format import ParseDict

from mesh._a2a.card_route import loopback_origin
from tests.registry_support import registry
from tests.support import clean_env, free_port, running, wait_for

pytestmark = pytest.mark.integration

CARD = "/.well-known/agent-card.json"


def _serve(tmp: Path, port: int, **env: str) -> Any:
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += [
        "--data-dir",
        str(tmp / "data"),
        *([] if "MESH_REGISTRY" in env else ["--no-register"]),
    ]
    health = f"http://127.0.0.1:{port}/health"
    return running(argv, name=f"node-{port}", tmp=tmp, env=clean_env(**env), health=health)


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A node without MESH_PUBLIC_URL."""
    tmp = tmp_path_factory.mktemp("origin")
    port = free_port()
    with _serve(tmp, port):
        yield port


def _urls(card: dict[str, Any]) -> list[str]:
    return [i["url"] for i in card["supportedInterfaces"]]


def _get(url: str, **headers: str) -> httpx.Response:
    named = {k.replace("_", "-"): v for k, v in headers.items()}
    return httpx.get(url, headers=named, timeout=10, trust_env=False)


def test_a_card_fetched_from_localhost_names_localhost(port: int) -> None:
    r = _get(f"http://localhost:{port}{CARD}")
    assert r.status_code == 200
    assert _urls(r.json()) == [f"http://localhost:{port}", f"http://localhost:{port}/a2a/rest"]
    assert r.headers["vary"] == "Host"


def test_a_card_fetched_from_127_0_0_1_names_127_0_0_1(port: int) -> None:
    r = _get(f"http://127.0.0.1:{port}{CARD}")
    assert _urls(r.json()) == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/a2a/rest"]
    # Another loopback form, through a port forward (the Host names the forwarded port).
    r = _get(f"http://127.0.0.1:{port}{CARD}", host="127.0.0.2:18017")
    assert _urls(r.json())[0] == "http://127.0.0.2:18017"
    r = _get(f"http://127.0.0.1:{port}{CARD}", host="[::1]:18017")
    assert _urls(r.json())[0] == "http://[::1]:18017"


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8017",
        "10.0.0.1:80",
        "localhost.evil.example",
        "127.0.0.1.evil.example",
        "localhost:99999",
        "localhost:8017/x",
        "user@localhost",
        "localhost:8017, evil.example",
        "[::ffff:10.0.0.1]:80",
        "",
    ],
)
def test_a_hostile_host_never_lands_in_the_card(port: int, host: str) -> None:
    r = _get(f"http://127.0.0.1:{port}{CARD}", host=host)
    if r.status_code == 400:
        return  # uvicorn refused the header itself: nothing was served
    assert r.status_code == 200, r.text
    assert _urls(r.json()) == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/a2a/rest"]
    assert "evil" not in r.text
    assert "10.0.0.1" not in r.text


def test_the_card_parses_with_the_sdk_from_either_origin(port: int) -> None:
    async def resolve(base: str) -> AgentCard:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
            return await A2ACardResolver(http, base).get_agent_card()

    for base in (f"http://localhost:{port}", f"http://127.0.0.1:{port}"):
        card = asyncio.run(resolve(base))
        assert [i.url for i in card.supported_interfaces] == [base, base + "/a2a/rest"]
        assert [i.protocol_binding for i in card.supported_interfaces] == ["JSONRPC", "HTTP+JSON"]
        # And with the plain protobuf parser, unknown fields refused.
        parsed = ParseDict(_get(base + CARD).json(), AgentCard())
        assert parsed.name == card.name


def test_caching_headers_and_conditional_requests(port: int) -> None:
    url = f"http://127.0.0.1:{port}{CARD}"
    r = _get(url)
    assert r.headers["cache-control"] == "public, max-age=30"
    etag, modified = r.headers["etag"], r.headers["last-modified"]
    assert etag.startswith('W/"')
    assert modified.endswith(" GMT")
    assert _get(url, if_none_match=etag).status_code == 304
    assert _get(url, if_modified_since=modified).status_code == 304
    assert _get(url, if_modified_since="Mon, 01 Jan 2001 00:00:00 GMT").status_code == 200
    assert _get(url, if_modified_since="not a date").status_code == 200
    # If-None-Match wins over If-Modified-Since (RFC 9110): a stale tag gets the card.
    assert _get(url, if_none_match='W/"old"', if_modified_since=modified).status_code == 200
    # Another origin is another card, with its own tag.
    other = _get(f"http://localhost:{port}{CARD}")
    assert other.headers["etag"] != etag
    assert _get(f"http://localhost:{port}{CARD}", if_none_match=etag).status_code == 200
    head = httpx.head(url, timeout=10, trust_env=False)
    assert head.status_code == 200
    assert head.headers["etag"] == etag


def test_mesh_public_url_wins_and_the_registry_registers_it(tmp_path: Path) -> None:
    port = free_port()
    public = f"http://localhost:{port}"  # reachable, and not what 127.0.0.1 would reflect
    with (
        registry(tmp_path) as reg,
        _serve(tmp_path, port, MESH_PUBLIC_URL=public, MESH_REGISTRY=reg.url),
    ):
        for base in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            r = _get(base + CARD)
            assert _urls(r.json()) == [public, public + "/a2a/rest"]
            assert "vary" not in r.headers
        hostile = _get(f"http://127.0.0.1:{port}{CARD}", host="evil.example")
        assert _urls(hostile.json())[0] == public

        def registered() -> list[dict[str, Any]]:
            r = httpx.get(reg.url + "/v1/instances", params={"agent": "test-worker"}, timeout=5)
            return list(r.json()["instances"])

        found = wait_for(registered, timeout=60, what="the node to register")
        assert [i["url"] for i in found] == [public]
        agent = httpx.get(reg.url + "/v1/agents/test-worker", timeout=5).json()
        assert _urls(agent["card"]) == [public, public + "/a2a/rest"]


def test_without_a_public_url_the_registry_registers_the_bind_address(tmp_path: Path) -> None:
    port = free_port()
    with registry(tmp_path) as reg, _serve(tmp_path, port, MESH_REGISTRY=reg.url):

        def registered() -> list[dict[str, Any]]:
            r = httpx.get(reg.url + "/v1/instances", params={"agent": "test-worker"}, timeout=5)
            return list(r.json()["instances"])

        found = wait_for(registered, timeout=60, what="the node to register")
        url = f"http://127.0.0.1:{port}"
        assert [i["url"] for i in found] == [url]
        agent = httpx.get(reg.url + "/v1/agents/test-worker", timeout=5).json()
        assert _urls(agent["card"]) == [url, url + "/a2a/rest"]


@pytest.mark.parametrize(
    ("scheme", "host", "origin"),
    [
        ("http", "localhost", "http://localhost"),
        ("https", "LOCALHOST:443", "https://localhost:443"),
        ("http", "127.1.2.3:9", "http://127.1.2.3:9"),
        ("http", "[0:0:0:0:0:0:0:1]:80", "http://[::1]:80"),
        ("http", "localhost:0", None),
        ("http", "localhost:", None),
        ("ftp", "localhost", None),
        ("http", None, None),
        ("http", "127.0.0.1:8017:1", None),
    ],
)
def test_loopback_origin(scheme: str, host: str | None, origin: str | None) -> None:
    assert loopback_origin(scheme, host) == origin
