"""``NetworkPolicy``: which addresses the registry may fetch from and a node may send its token to."""

from __future__ import annotations

import pytest

from mesh._errors import ConfigError
from mesh._netpolicy import NetworkPolicy, NetworkRefused, is_loopback_host


def test_named_networks_and_cidrs() -> None:
    policy = NetworkPolicy.parse("loopback, 10.1.0.0/16")
    assert policy.allows("127.0.0.1")
    assert policy.allows("::1")
    assert policy.allows("10.1.200.3")
    assert not policy.allows("10.2.0.1")
    assert not policy.allows("192.168.1.1")
    assert not policy.allows("8.8.8.8")
    assert not policy.allows("not an address")


def test_link_local_is_refused_even_by_any() -> None:
    policy = NetworkPolicy.parse("any")
    assert policy.allows("8.8.8.8")
    for address in ("169.254.169.254", "fe80::1", "::ffff:169.254.169.254", "0.0.0.0"):
        assert not policy.allows(address), address


def test_defaults_follow_the_bind_address() -> None:
    assert NetworkPolicy.default_for("127.0.0.1").allows("127.0.0.1")
    assert not NetworkPolicy.default_for("127.0.0.1").allows("10.0.0.5")
    assert NetworkPolicy.default_for("0.0.0.0").allows("10.0.0.5")
    assert NetworkPolicy.default_for("0.0.0.0").allows("192.168.3.4")
    assert not NetworkPolicy.default_for("0.0.0.0").allows("8.8.8.8")


def test_bad_entries_name_themselves() -> None:
    with pytest.raises(ConfigError, match=r"'10\.0\.0\.0/33'"):
        NetworkPolicy.parse("loopback,10.0.0.0/33")
    with pytest.raises(ConfigError, match="at least one"):
        NetworkPolicy.parse(" , ")


def test_loopback_host_without_dns() -> None:
    assert is_loopback_host("localhost")
    assert is_loopback_host("127.0.0.2")
    assert is_loopback_host("[::1]")
    assert not is_loopback_host("10.0.0.1")
    assert not is_loopback_host("example.internal")


async def test_check_url_resolves_names_before_deciding() -> None:
    loopback = NetworkPolicy.parse("loopback")
    await loopback.check_url("http://127.0.0.1:8017")
    await loopback.check_url("http://localhost:8017/x")  # resolves to 127.0.0.1 / ::1
    with pytest.raises(NetworkRefused, match=r"169\.254\.169\.254"):
        await NetworkPolicy.parse("any").check_url("http://169.254.169.254/latest/meta-data")
    with pytest.raises(NetworkRefused, match="outside the allowed networks"):
        await NetworkPolicy.parse("10.0.0.0/8").check_url("http://localhost:8017")
    with pytest.raises(NetworkRefused, match="not an http"):
        await loopback.check_url("file:///etc/passwd")
    with pytest.raises(NetworkRefused, match="invalid port"):
        await loopback.check_url("http://127.0.0.1:99999")
    with pytest.raises(NetworkRefused, match="does not resolve"):
        await loopback.check_url("http://no-such-host.invalid:80")


def test_both_policies_and_whether_one_lies_within_another() -> None:
    plain_http = NetworkPolicy.parse("loopback,private")
    both = NetworkPolicy.parse("any") & plain_http
    assert both.spec == "any and loopback,private"
    assert both.allows("10.1.2.3")
    assert both.allows("::1")
    assert not both.allows("8.8.8.8")
    narrow = NetworkPolicy.parse("10.1.0.0/16,203.0.113.0/24") & NetworkPolicy.parse("10.0.0.0/8")
    assert narrow.allows("10.1.9.9")
    assert not narrow.allows("10.2.0.1")  # in the wider one only
    assert not narrow.allows("203.0.113.5")  # in the first one only
    assert NetworkPolicy.parse("loopback,10.0.0.0/16").within(plain_http)
    assert not NetworkPolicy.parse("any").within(plain_http)
    assert not NetworkPolicy.parse("loopback,203.0.113.7").within(plain_http)


def test_from_env_names_the_variable() -> None:
    assert NetworkPolicy.from_env({}, "MESH_PEER_NETWORKS") is None
    policy = NetworkPolicy.from_env({"MESH_PEER_NETWORKS": " 10.0.0.0/8 "}, "MESH_PEER_NETWORKS")
    assert policy is not None
    assert policy.allows("10.9.9.9")
    with pytest.raises(ConfigError, match=r"MESH_PEER_NETWORKS='intranet': 'intranet' is not"):
        NetworkPolicy.from_env({"MESH_PEER_NETWORKS": "intranet"}, "MESH_PEER_NETWORKS")


def test_public_is_a2a_sdks_push_url_rule() -> None:
    """``public``: globally routable unicast addresses, what a2a-sdk's
    ``validate_push_notification_url`` accepts (the default of MESH_PUSH_NETWORKS)."""
    public = NetworkPolicy.parse("public")
    for address in ("8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"):
        assert public.allows(address), address
    refused = (
        "127.0.0.1", "::1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.1.1",
        "169.254.169.254", "fe80::1", "fc00::1", "224.0.0.1", "ff02::1", "240.0.0.1",
        "255.255.255.255", "0.0.0.0", "192.0.2.1", "2001:db8::1", "::ffff:127.0.0.1",
    )  # fmt: skip
    for address in refused:
        assert not public.allows(address), address
    with_loopback = NetworkPolicy.parse("public,loopback")
    assert with_loopback.allows("8.8.8.8")
    assert with_loopback.allows("127.0.0.1")
    assert not with_loopback.allows("10.0.0.1")
    assert not NetworkPolicy.parse("public").within(NetworkPolicy.parse("loopback,private"))
    assert NetworkPolicy.parse("loopback").within(with_loopback)
    assert not (public & NetworkPolicy.parse("loopback")).allows("8.8.8.8")
