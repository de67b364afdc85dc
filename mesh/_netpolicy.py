"""``NetworkPolicy``: which addresses mesh may talk to on an operator's behalf.

The registry fetches cards and probes ``/health`` at URLs that anyone allowed to register can
choose, and a node presents the mesh token to peers that discovery names: both must stay inside
the networks the operator meant. A policy is a list of networks (CIDRs, or ``loopback`` /
``private`` / ``public``); a URL is allowed when EVERY address its host resolves to lies in one of
them, and no address is ever link-local (``169.254.0.0/16``, ``fe80::/10``: cloud metadata
services live there), whatever the list says.

``public`` is every globally routable unicast address: what a2a-sdk's push URL validator
(``validate_push_notification_url``) accepts, and the default of ``MESH_PUSH_NETWORKS``, where a
webhook is whatever URL a caller names (loopback, private, shared 100.64/10, reserved and
multicast addresses are not public).

    policy = NetworkPolicy.parse("loopback,private")      # the default on a private network
    policy = NetworkPolicy.parse("10.0.0.0/8,192.168.1.7")
    await policy.check_url("http://127.0.0.1:8017")      # raises NetworkRefused, or returns

``default_for(host)``: loopback only for a service bound to loopback, loopback and private ranges
for one bound to a private or wildcard address. Checking after DNS resolution is what makes a
name that points at a forbidden address (``metadata.internal``, a rebinding domain) fail.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from mesh._errors import ConfigError, NetworkRefused

__all__ = ["NetworkPolicy", "NetworkRefused", "is_loopback_host"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LOOPBACK: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)
_PRIVATE: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("10.0.0.0/8"),
    ipaddress.ip_network("172.16.0.0/12"),
    ipaddress.ip_network("192.168.0.0/16"),
    ipaddress.ip_network("fc00::/7"),
)
# Never reachable through a policy: link-local holds cloud metadata endpoints (169.254.169.254),
# and "this network" / unspecified addresses are not a peer.
_ALWAYS_REFUSED: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("0.0.0.0/8"),
    ipaddress.ip_network("::/128"),
)
_NAMED = {"loopback": _LOOPBACK, "private": _PRIVATE}
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (no DNS lookup)."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _unmapped(address: IPAddress) -> IPAddress:
    # ::ffff:169.254.169.254 is 169.254.169.254 to the kernel.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_public(ip: IPAddress) -> bool:
    # a2a-sdk's rule for push URLs (a2a.utils.push_url_validator): globally routable, and not
    # loopback, link-local, multicast, reserved or unspecified (is_global already excludes the
    # private, shared 100.64/10 and documentation ranges).
    return ip.is_global and not (ip.is_multicast or ip.is_reserved)


@dataclass(frozen=True)
class NetworkPolicy:
    """Allowed networks (see the module docstring). ``spec`` is how it was written."""

    networks: tuple[IPNetwork, ...]
    spec: str = ""
    #: Also every public address (the ``public`` entry), beyond ``networks``.
    public: bool = False

    @classmethod
    def parse(cls, spec: str | Iterable[str]) -> NetworkPolicy:
        """From ``"loopback,private,10.1.0.0/16,192.168.1.7"`` (``ConfigError`` naming the
        bad entry). ``"any"`` allows every address except the always-refused ones, ``"public"``
        every globally routable unicast address."""
        items = [spec] if isinstance(spec, str) else list(spec)
        entries = [e.strip() for item in items for e in item.split(",") if e.strip()]
        if not entries:
            raise ConfigError("a network list needs at least one entry, e.g. 'loopback,private'")
        networks: list[IPNetwork] = []
        public = False
        for entry in entries:
            if entry.lower() == "public":
                public = True
            elif entry.lower() == "any":
                networks += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
            elif entry.lower() in _NAMED:
                networks += _NAMED[entry.lower()]
            else:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError as exc:
                    raise ConfigError(
                        f"{entry!r} is not a network: use a CIDR (10.0.0.0/8), an address, "
                        "'loopback', 'private', 'public' or 'any'"
                    ) from exc
        return cls(tuple(networks), ",".join(entries), public)

    @classmethod
    def from_env(cls, env: Mapping[str, str], name: str) -> NetworkPolicy | None:
        """The policy ``env[name]`` spells, None when unset (``ConfigError`` naming it)."""
        spec = env.get(name, "").strip()
        try:
            return cls.parse(spec) if spec else None
        except ConfigError as exc:
            raise ConfigError(f"{name}={spec!r}: {exc}") from exc

    @classmethod
    def default_for(cls, bind_host: str) -> NetworkPolicy:
        """Loopback only for a service bound to loopback; loopback and private ranges else."""
        if is_loopback_host(bind_host):
            return cls.parse("loopback")
        return cls.parse("loopback,private")

    def within(self, other: NetworkPolicy) -> bool:
        """Whether every address this policy allows, ``other`` allows too."""
        if self.public and not other.public:
            return False
        return all(
            any(net.version == wider.version and net.subnet_of(wider) for wider in other.networks)  # type: ignore[arg-type]
            for net in self.networks
        )

    def __and__(self, other: NetworkPolicy) -> NetworkPolicy:
        """The addresses both policies allow (``spec`` says both). A public address allowed by
        one side's ``public`` alone and by a listed network of the other is left out: the
        intersection may be narrower than exact, never wider."""
        # Two CIDR blocks are nested or disjoint: an overlap is the smaller of the two.
        both = [
            mine if mine.subnet_of(theirs) else theirs  # type: ignore[arg-type]
            for mine in self.networks
            for theirs in other.networks
            if mine.version == theirs.version and mine.overlaps(theirs)
        ]
        return NetworkPolicy(
            tuple(dict.fromkeys(both)),
            f"{self.spec} and {other.spec}",
            self.public and other.public,
        )

    def allows(self, address: str | IPAddress) -> bool:
        """Whether one address is inside the policy (and not always refused)."""
        try:
            ip = _unmapped(ipaddress.ip_address(address) if isinstance(address, str) else address)
        except ValueError:
            return False
        if any(ip in net for net in _ALWAYS_REFUSED if net.version == ip.version):
            return False
        if self.public and _is_public(ip):
            return True
        return any(ip in net for net in self.networks if net.version == ip.version)

    async def resolve(self, host: str, port: int | None = None) -> list[str]:
        """Every address ``host`` resolves to, each checked; ``NetworkRefused`` otherwise."""
        host = host.strip("[]")
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except (OSError, UnicodeError) as exc:
                raise NetworkRefused(f"host {host!r} does not resolve") from exc
            addresses = sorted({str(info[4][0]) for info in infos})
        if not addresses:
            raise NetworkRefused(f"host {host!r} does not resolve")
        for address in addresses:
            if not self.allows(address):
                raise NetworkRefused(
                    f"host {host!r} is {address}, outside the allowed networks ({self.spec})"
                )
        return addresses

    async def check_url(self, url: str) -> None:
        """``NetworkRefused`` unless ``url`` is http(s) and its host resolves inside the policy."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NetworkRefused(f"{url!r} is not an http(s) URL with a host")
        try:
            port = parts.port
        except ValueError as exc:
            raise NetworkRefused(f"{url!r} has an invalid port") from exc
        await self.resolve(parts.hostname, port)
