"""``create_http_client(policy)``: an HTTP client that connects only where a ``NetworkPolicy``
allows, checked when each connection is made.

The registry fetches and probes URLs that whoever registers chose; a node sends the mesh token to
the peers that discovery names. Checking a URL's host once (at registration, or every 30 s in
``mesh._trust``) is not enough: the client would resolve the name again when it connects, and a
name that rebinds in between (DNS answers with a TTL of 0) reaches a forbidden address
(``169.254.169.254``, an internal database, a stranger's host) with whatever the request carries.
So the transport's network backend (``GuardedBackend``) resolves the host itself, refuses the
connection unless EVERY address lies inside the policy, and connects to an address it checked,
never to the name again.

A refused connection raises ``AddressRefused``, an ``httpcore.ConnectError``: httpx turns it into
``httpx.ConnectError`` (so any caller treats it as "unreachable"), with the ``AddressRefused`` as
its ``__cause__`` for callers that tell the two apart (``mesh._outbound.bounded_get``).

``plain_http``: a narrower policy for ``http://`` URLs (a node with a token sends it in clear only
to loopback and private addresses, whatever its peers' networks).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

import httpcore
import httpx

from mesh._netpolicy import NetworkPolicy
from mesh._pool import create_transport

__all__ = ["AddressRefused", "GuardedBackend", "create_http_client"]

_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


class AddressRefused(httpcore.ConnectError):
    """The host is, or resolves to, an address outside the policy (or always refused).

    ``host`` is the host as the URL names it; ``allowed`` the policy as the operator wrote it.
    The message names the address: it belongs in a log or in the operator's own error, not in an
    answer to whoever chose the URL."""

    def __init__(self, host: str, address: str, allowed: str) -> None:
        super().__init__(f"host {host!r} is {address}, outside the allowed networks ({allowed})")
        self.host = host
        self.address = address
        self.allowed = allowed


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to addresses ``policy`` allows."""

    def __init__(
        self, policy: NetworkPolicy, inner: httpcore.AsyncNetworkBackend | None = None
    ) -> None:
        self.policy = policy
        self._inner = inner or httpcore.AnyIOBackend()

    async def _addresses(self, host: str, port: int, limit_s: float | None) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            pass
        try:
            async with asyncio.timeout(limit_s):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host!r} took too long") from exc
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"host {host!r} does not resolve: {exc}") from exc
        # getaddrinfo's order is the system's preference; keep it, once each.
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    async def allowed_addresses(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds the lookup)
    ) -> list[str]:
        """The addresses ``host`` resolves to (in the system's order), to connect to instead
        of the name; ``AddressRefused`` unless every one is inside the policy."""
        addresses = await self._addresses(host, port, timeout)
        if not addresses:
            raise httpcore.ConnectError(f"host {host!r} does not resolve")
        for address in addresses:
            # Every address, not just the one we would use: a name that mixes an allowed
            # address with a forbidden one is someone trying their luck.
            if not self.policy.allows(address):
                raise AddressRefused(host, address, self.policy.spec)
        return addresses

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.allowed_addresses(host, port, timeout)
        last: Exception | None = None
        for address in addresses:
            try:
                # The checked address, never the name again: no second lookup to rebind.
                # TLS still verifies (and sends SNI for) the URL's host: httpcore passes it
                # to start_tls from the request's origin, not from this stream.
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not an allowed network")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _guarded_transport(policy: NetworkPolicy, limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    return create_transport(limits=limits, network_backend=GuardedBackend(policy))


def create_http_client(
    policy: NetworkPolicy,
    *,
    timeout: httpx.Timeout | float,
    limits: httpx.Limits = _LIMITS,
    plain_http: NetworkPolicy | None = None,
) -> httpx.AsyncClient:
    """A client whose every connection goes only to addresses ``policy`` allows (see the
    module docstring); ``http://`` URLs only to those both ``policy`` and ``plain_http`` allow.

    No redirects (a 30x would send the request somewhere nobody checked the URL of), no proxies
    from the environment (a proxy would connect on our behalf, past the check), ``timeout`` per
    connect/read/pool wait (``mesh._outbound.bounded_get`` puts one deadline on a whole answer).
    The pool is a ``mesh._pool.ReclaimingPool``: requests cancelled while queued (a deadline)
    never leak its slots."""
    mounts: dict[str, httpx.AsyncBaseTransport] = {}
    if plain_http is not None and not policy.within(plain_http):
        # Its own pool: a connection is checked once, when it is made, for one scheme.
        mounts["http://"] = _guarded_transport(policy & plain_http, limits)
    return httpx.AsyncClient(
        transport=_guarded_transport(policy, limits),
        mounts=mounts or None,
        timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
    )
