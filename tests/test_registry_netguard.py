"""The registry's HTTP client connects only inside the allowed networks, after DNS, every time."""

from __future__ import annotations

import httpx
import pytest

from mesh._errors import ConfigError
from mesh._netguard import AddressRefused, create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._outbound import FetchFailed, bounded_get
from registry import cli
from registry.settings import RegistrySettings
from tests.raw_http import answer, raw_server

pytestmark = pytest.mark.integration


def _client(spec: str) -> httpx.AsyncClient:
    return create_http_client(NetworkPolicy.parse(spec), timeout=2)


async def test_an_allowed_address_is_fetched() -> None:
    async with raw_server(answer(200, '{"ok": true}')) as srv, _client("loopback") as http:
        r = await http.get(f"{srv.url}/x")
    assert (r.status_code, r.json()) == (200, {"ok": True})
    assert srv.requests == ["/x"]


async def test_an_address_outside_the_policy_is_refused_before_connecting() -> None:
    async with (
        raw_server(answer(200, "{}"), host="127.0.0.2") as srv,
        _client("127.0.0.1/32") as http,
    ):
        with pytest.raises(httpx.ConnectError) as caught:
            await http.get(f"{srv.url}/x")
        assert srv.connections == 0
    refused = caught.value.__cause__
    assert isinstance(refused, AddressRefused)
    assert (refused.address, refused.allowed) == ("127.0.0.2", "127.0.0.1/32")


async def test_a_name_is_checked_by_what_it_resolves_to() -> None:
    async with raw_server(answer(200, "{}")) as srv:
        # localhost is 127.0.0.1 (and maybe ::1): outside 127.0.0.2/32, inside loopback.
        async with _client("127.0.0.2/32") as http:
            with pytest.raises(httpx.ConnectError) as caught:
                await http.get(f"http://localhost:{srv.port}/x")
        assert isinstance(caught.value.__cause__, AddressRefused)
        assert srv.connections == 0
        async with _client("loopback") as http:
            assert (await http.get(f"http://localhost:{srv.port}/x")).status_code == 200
        assert srv.requests == ["/x"]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://[fe80::1]/",
        "http://0.0.0.0:80/",
    ],
)
async def test_link_local_and_unspecified_are_refused_even_under_any(url: str) -> None:
    async with _client("any") as http:
        with pytest.raises(FetchFailed) as caught:
            await bounded_get(http, url, max_bytes=100, timeout_s=2)
    assert caught.value.reason == "refused"
    assert isinstance(caught.value.__cause__, AddressRefused)


async def test_bounded_get_says_refused_and_keeps_the_allowed_networks() -> None:
    async with _client("127.0.0.1/32") as http:
        with pytest.raises(FetchFailed) as caught:
            await bounded_get(http, "http://127.0.0.9:9/", max_bytes=100, timeout_s=2)
    assert caught.value.reason == "refused"
    assert "127.0.0.9" in caught.value.detail
    assert isinstance(caught.value.__cause__, AddressRefused)
    assert caught.value.__cause__.allowed == "127.0.0.1/32"


def test_the_default_policy_follows_the_bind_address() -> None:
    on_loopback = RegistrySettings(host="127.0.0.1").network_policy
    assert on_loopback.allows("127.0.0.5")
    assert not on_loopback.allows("10.1.2.3")
    wildcard = RegistrySettings(host="0.0.0.0").network_policy
    assert wildcard.allows("10.1.2.3")
    assert not wildcard.allows("169.254.169.254")
    assert not wildcard.allows("8.8.8.8")
    narrowed = RegistrySettings(host="0.0.0.0", allow_networks=NetworkPolicy.parse("10.0.0.0/8"))
    assert not narrowed.network_policy.allows("192.168.1.1")


def test_the_cli_parses_allow_networks_and_names_the_flag_on_a_typo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = cli.build_parser()

    flagged = cli.settings_from(parser.parse_args(["--allow-networks", "127.0.0.1/32,private"]))
    assert flagged.network_policy.allows("127.0.0.1")
    assert flagged.network_policy.allows("10.9.9.9")
    assert not flagged.network_policy.allows("127.0.0.2")

    monkeypatch.setenv("MESH_REGISTRY_ALLOW_NETWORKS", "192.168.7.0/24")
    settings = cli.settings_from(parser.parse_args([]))
    assert settings.network_policy.allows("192.168.7.7")
    assert not settings.network_policy.allows("127.0.0.1")

    with pytest.raises(ConfigError, match=r"^--allow-networks: 'loopbak' is not a network"):
        cli.settings_from(parser.parse_args(["--allow-networks", "loopbak"]))
