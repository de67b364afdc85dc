"""``create_http_client(policy)``: the registry's one HTTP client for registered URLs.

Whoever registers chooses the URL the registry then fetches (the card) and probes (``/health``)
forever, so every connection it opens is checked against the operator's ``NetworkPolicy``
(``--allow-networks``) at connect time, not only at registration: the transport's network
backend resolves the host itself, refuses the connection unless EVERY address lies inside the
policy, and connects to an address it checked. A name that later rebinds to a forbidden address
(``169.254.169.254``, an internal database) is therefore refused on the next connection too.

A refused connection raises ``AddressRefused``, an ``httpcore.ConnectError``: httpx turns it into
``httpx.ConnectError`` (so any caller treats it as "unreachable"), with the ``AddressRefused`` as
its ``__cause__`` for callers that tell the two apart (``registry.outbound.bounded_get``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

import httpcore
import httpx

from mesh.netpolicy import NetworkPolicy

__all__ = ["AddressRefused", "GuardedBackend", "create_http_client"]


class AddressRefused(httpcore.ConnectError):
    """The host is, or resolves to, an address outside the policy (or always refused).

    ``host`` is the host as the URL names it; ``allowed`` the policy as the operator wrote it.
    The message names the address, so it belongs in the registry's log, not in an answer."""

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

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._addresses(host, port, timeout)
        if not addresses:
            raise httpcore.ConnectError(f"host {host!r} does not resolve")
        for address in addresses:
            # Every address, not just the one we would use: a name that mixes an allowed
            # address with a forbidden one is someone trying their luck.
            if not self.policy.allows(address):
                raise AddressRefused(host, address, self.policy.spec)
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


class _GuardedTransport(httpx.AsyncHTTPTransport):
    def __init__(self, policy: NetworkPolicy) -> None:
        super().__init__(trust_env=False)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
        # httpx has no public seam for the network backend: swap the pool it built for one
        # on ours (same defaults). httpx is pinned below 1.0, where this is stable.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(policy),
        )


def create_http_client(policy: NetworkPolicy, *, timeout_s: float) -> httpx.AsyncClient:
    """The client for every request to a registered URL (cards, ``/health`` probes).

    Connections go only to addresses ``policy`` allows (see the module docstring); no
    redirects (a 30x would send the fetch to a path or query the URL rules refuse), no
    proxies from the environment, ``timeout_s`` per connect/read (callers put one deadline on the
    whole answer with ``registry.outbound.bounded_get``)."""
    return httpx.AsyncClient(
        transport=_GuardedTransport(policy),
        timeout=httpx.Timeout(timeout_s),
        follow_redirects=False,
        trust_env=False,
    )
