"""What the registry accepts as a URL and what it fetches from it, against real registry
processes: URL and card_path rules (422 naming the field, never a 500), the network allow-list
(checked after DNS, on probes too), and answers that never repeat what a URL served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.raw_http import answer, raw_server
from tests.registry_support import instances, registry, start_node
from tests.support import free_port, wait_for

pytestmark = pytest.mark.integration

CARD = '{"name": "echo"}'


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with registry(tmp_path_factory.mktemp("reg")) as service:
        yield service.url


def _body(**fields: Any) -> dict[str, Any]:
    return {"instance_id": "x-1", "agent": "echo", "url": "http://127.0.0.1:9", **fields}


async def _register(reg: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{reg}/v1/instances", json=body)


def _fields(r: httpx.Response) -> set[str]:
    assert r.status_code == 422, r.text
    return {f["field"] for f in r.json().get("fields", [])}


@pytest.mark.parametrize(
    "card_path",
    [
        "/admin/delete-everything?confirm=yes",
        "/card.json#top",
        "/../etc/passwd",
        "/a/./card.json",
        "/%2e%2e/card.json",
        "\\card.json",
        "/a\\b",
        "/card.json\r\nX-Injected: 1",
        "/card\x00.json",
        "card.json",
        "//evil.example/card.json",
        "/" + "a" * 300,
    ],
)
async def test_card_path_is_a_path_only_and_is_never_fetched_otherwise(
    reg: str, card_path: str
) -> None:
    async with raw_server(answer(200, CARD)) as srv:
        r = await _register(reg, _body(url=srv.url, card_path=card_path))
        assert _fields(r) == {"card_path"}, r.text
        assert r.json()["message"].startswith("card_path: ")
        assert srv.connections == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1:abc",
        "http://xn--zz",
        "http://[zz]:80",
        "http://exa\u00efmple.com",
        "http://127.0.0.1\r\n:80",
        "http://127.0.0.1:80/a\r\nX: 1",
        "http://127.0.0.1\x00:80",
        "http://127.0.0.1/" + "a" * 3000,
        "http://user:pw@127.0.0.1:80",
        "http://127.0.0.1:80/?q=1",
        "http://127.0.0.1:80/a/../b",
        "http://a..b:80",
        "ftp://127.0.0.1",
        "http:///nohost",
    ],
)
async def test_urls_the_registry_cannot_use_are_422s_naming_url(reg: str, url: str) -> None:
    r = await _register(reg, _body(url=url))
    assert _fields(r) == {"url"}, r.text
    assert r.json()["message"].startswith("url: ")


async def test_every_fetch_failure_reads_the_same(reg: str) -> None:
    """A closed port, a 404, a 500 and an oversized card: one message, so the registry does
    not tell a registrant which ports on the network are open."""
    messages = []
    closed = f"http://127.0.0.1:{free_port()}"
    body = _body(instance_id="failed-1")
    messages.append((await _register(reg, {**body, "url": closed})).json()["message"])
    for handler in (answer(404, "nope"), answer(500, "boom"), answer(200, " " * 1_100_000)):
        async with raw_server(handler) as srv:
            r = await _register(reg, {**body, "url": srv.url})
            assert r.status_code == 422
            messages.append(r.json()["message"].replace(srv.url, closed))
    assert len(set(messages)) == 1, messages
    assert messages[0].startswith(f"could not fetch the agent card from {closed}/.well-known/")
    assert "failed-1" not in [i["instance_id"] for i in instances(reg, status="any")]


@pytest.mark.parametrize(
    ("card", "secret"),
    [
        ('{"name": "internal-db-admin"}', "internal-db-admin"),
        ('{"name": "echo", "skills": "SECRET-7f3a"}', "SECRET-7f3a"),
        ('{"name": "echo", "version": {"SECRET-7f3a": 1}}', "SECRET-7f3a"),
    ],
)
async def test_refusals_never_repeat_what_the_url_served(reg: str, card: str, secret: str) -> None:
    async with raw_server(answer(200, card)) as srv:
        r = await _register(reg, _body(url=srv.url))
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_card"
    assert secret not in r.text


async def test_a_url_outside_the_allowed_networks_is_refused_after_dns(tmp_path: Path) -> None:
    with registry(tmp_path, extra=["--allow-networks", "127.0.0.2/32"]) as reg:
        async with raw_server(answer(200, CARD), host="127.0.0.2") as inside:
            r = await _register(reg.url, _body(url=inside.url))
            assert r.status_code == 201, r.text
        async with raw_server(answer(200, CARD), host="127.0.0.3") as outside:
            r = await _register(reg.url, _body(url=outside.url))
            assert outside.connections == 0
        assert r.status_code == 422
        refusal = r.json()
        assert refusal["error"] == "url_refused"
        assert refusal["message"].startswith(f"url: {outside.url} is outside the networks")
        assert "127.0.0.2/32" in refusal["message"]
        assert "--allow-networks" in refusal["message"]
        # A name is judged by the address it resolves to: localhost is 127.0.0.1.
        async with raw_server(answer(200, CARD)) as srv:
            r = await _register(reg.url, _body(url=f"http://localhost:{srv.port}"))
            assert srv.connections == 0
        assert r.json()["error"] == "url_refused"


async def test_metadata_addresses_are_refused_even_when_any_network_is_allowed(
    tmp_path: Path,
) -> None:
    with registry(tmp_path, extra=["--allow-networks", "any"]) as reg:
        for url in ("http://169.254.169.254", "http://[fe80::1]:80", "http://0.0.0.0:80"):
            r = await _register(reg.url, _body(url=url))
            assert r.status_code == 422, (url, r.text)
            assert r.json()["error"] == "url_refused", url


def test_a_registered_instance_outside_a_narrower_policy_is_probed_as_unreachable(
    tmp_path: Path,
) -> None:
    """The policy holds on every connection, not only at registration: the same registry
    database under a narrower --allow-networks cannot reach (or vouch for) the instance."""
    data = tmp_path / "registry-data"
    with registry(tmp_path, data_dir=data, name="wide") as reg:
        node = start_node(tmp_path, reg.url, name="echo", instance_id="echo-1")
        with node.proc:
            wait_for(lambda: instances(reg.url), what="echo registered and passing")
            node.proc.kill()  # no deregistration: the record stays in registry.db
    # The same instance serves again, but the registry may no longer connect to 127.0.0.1.
    node = start_node(tmp_path, None, name="echo", port=node.port, instance_id="echo-1")
    with (
        node.proc,
        registry(
            tmp_path,
            data_dir=data,
            name="narrow",
            ttl=300,  # no heartbeat reaches this registry: keep the TTL out of the picture
            extra=["--allow-networks", "127.0.0.2/32"],
        ) as reg,
    ):
        wait_for(lambda: httpx.get(f"{node.url}/health").status_code == 200, what="echo up")
        found = wait_for(
            lambda: [i for i in instances(reg.url, status="any") if i["status"] == "critical"],
            what="the probe refused and the instance critical",
        )
        assert found[0]["instance_id"] == "echo-1"
        assert "heartbeat" not in found[0]["status_reason"]
