"""``PeerTrust`` on its own: the rules that need an address or a card no loopback test can
produce (a public address, a card served from another origin), how long a verdict lasts, and
that a refusal is logged once per URL. Cards are the real ones ``build_card`` makes; addresses
are literals, so nothing is resolved or contacted."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

from agents.credit_bureau import agent as bureau_agent
from mesh._a2a.card import build_card, card_to_dict
from mesh._netpolicy import NetworkPolicy
from mesh._trust import PeerRefused, PeerTrust

TOKEN = "unit-token"


def card_at(url: str, name: str = "credit-bureau") -> Callable[[], Awaitable[Mapping[str, Any]]]:
    """The card fetcher of a peer that serves the bureau's card built for ``url``; counts."""
    card = card_to_dict(build_card(bureau_agent, url))
    card["name"] = name

    async def fetch() -> Mapping[str, Any]:
        fetch.calls += 1  # type: ignore[attr-defined]
        return card

    fetch.calls = 0  # type: ignore[attr-defined]
    return fetch


async def never() -> Mapping[str, Any]:
    raise AssertionError("the card of a refused address must not be fetched")


async def test_a_member_gets_the_token_and_a_stranger_gets_nothing() -> None:
    trust = PeerTrust(token=TOKEN, networks=NetworkPolicy.parse("loopback"))
    url = "http://127.0.0.1:8411"
    admitted = await trust.admit(url, "credit-bureau", card_at(url))
    assert admitted.headers == {"Authorization": f"Bearer {TOKEN}"}
    other = "http://127.0.0.1:8412"
    with pytest.raises(PeerRefused, match="names 'income-verifier', not 'credit-bureau'"):
        await trust.admit(other, "credit-bureau", card_at(other, "income-verifier"))


async def test_without_a_token_only_the_name_and_networks_are_checked() -> None:
    trust = PeerTrust(networks=NetworkPolicy.parse("loopback"))
    url = "http://127.0.0.1:8411"
    # A card naming another address is fine when there is no token to protect.
    admitted = await trust.admit(url, "credit-bureau", card_at("http://127.0.0.1:9999"))
    assert admitted.headers == {}
    with pytest.raises(PeerRefused, match="MESH_PEER_NETWORKS"):
        await trust.admit("http://10.1.2.3:8411", "credit-bureau", never)


@pytest.mark.parametrize(
    "url",
    ["http://203.0.113.9:8411", "http://[2001:db8::5]:8411"],  # documentation ranges
)
async def test_plain_http_beyond_private_networks_never_carries_the_token(url: str) -> None:
    trust = PeerTrust(token=TOKEN, networks=NetworkPolicy.parse("any"))
    with pytest.raises(PeerRefused, match=r"plain http .* serve that peer over https"):
        await trust.admit(url, "credit-bureau", never)


async def test_https_beyond_private_networks_is_allowed_when_the_operator_says_so() -> None:
    trust = PeerTrust(token=TOKEN, networks=NetworkPolicy.parse("any"))
    url = "https://203.0.113.9:8443"
    admitted = await trust.admit(url, "credit-bureau", card_at(url))
    assert admitted.headers["Authorization"] == f"Bearer {TOKEN}"


async def test_a_card_served_from_another_origin_gets_no_token() -> None:
    trust = PeerTrust(token=TOKEN, networks=NetworkPolicy.parse("loopback"))
    proxy = "http://127.0.0.1:7000"
    with pytest.raises(
        PeerRefused,
        match=re.escape("served at http://127.0.0.1:8411, http://127.0.0.1:8411/a2a/rest, not at"),
    ) as info:
        await trust.admit(proxy, "credit-bureau", card_at("http://127.0.0.1:8411"))
    assert "MESH_PUBLIC_URL" in str(info.value)
    # Same origin written differently (default port, trailing slash, host case) is the same.
    url = "https://LocalHost:443"
    ok = PeerTrust(token=TOKEN)
    assert (await ok.admit(url, "credit-bureau", card_at("https://localhost/"))).headers


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/", "ftp://127.0.0.1:21", "http://127.0.0.1:99999"]
)
async def test_what_is_never_a_peer(url: str) -> None:
    trust = PeerTrust(token=TOKEN, networks=NetworkPolicy.parse("any"))
    with pytest.raises(PeerRefused, match="not a verified member"):
        await trust.admit(url, "credit-bureau", never)


async def test_a_verdict_lasts_ttl_seconds_and_a_refusal_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    trust = PeerTrust(token=TOKEN, networks=NetworkPolicy.parse("loopback"), clock=lambda: now[0])
    url = "http://127.0.0.1:8411"
    fetch = card_at(url, "mallory")
    with caplog.at_level(logging.WARNING, logger="mesh._trust"):
        for _ in range(5):
            with pytest.raises(PeerRefused):
                await trust.admit(url, "credit-bureau", fetch)
    assert fetch.calls == 1  # type: ignore[attr-defined]
    assert sum("peer refused" in r.message for r in caplog.records) == 1
    now[0] = 31.0  # past the TTL: checked again (the card may have been fixed)
    with pytest.raises(PeerRefused):
        await trust.admit(url, "credit-bureau", fetch)
    assert fetch.calls == 2  # type: ignore[attr-defined]
