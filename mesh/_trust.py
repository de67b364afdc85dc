"""``PeerTrust``: which peer URLs a node delegates to, and which of them get the mesh token.

Discovery names the URLs of an agent's instances, and in an open registry anyone can put a URL
there. So before a delegation goes to a URL (and before its card is believed), the node checks
that URL, once and again after ``ttl_s``:

1. **network**: every address its host resolves to lies in the allowed networks (the node's
   ``MESH_PEER_NETWORKS``; default loopback for a node bound to loopback, loopback and private
   ranges for one bound beyond), checked after DNS resolution (``mesh._netpolicy``);
2. **identity**: the agent card served at the URL (fetched WITHOUT the token: cards are public)
   names the agent that was asked for.

With a mesh token, also (the token must not reach anyone else):

3. plain ``http`` only to loopback and private addresses (elsewhere it would cross networks in
   clear: serve the peer over https);
4. when the card lists interface URLs, one of them has the URL's origin (scheme, host, port): a
   member's card copied and served from another address names the member's address.

A URL that passes gets the token on every call (``Admitted.headers``); one that fails gets no call
at all: ``PeerRefused`` says why and what to set, and is logged once per URL. A URL the operator
wrote into ``remote(url=...)`` is checked the same way, except that without an agent name there
is no name to match.

A verdict lasts ``ttl_s``, but the network rules (1 and 3) hold for every connection: the calls
go through a client built by ``mesh._netguard.create_http_client`` with the same networks (and
``PLAIN_HTTP_NETWORKS`` for plain http when there is a token), which resolves the host itself and
connects only to an address it checked. A name that rebinds after the check to an address
outside them reaches nothing. The card is read within a byte cap and one deadline
(``A2APeer.fetch_card_dict``).

Without keys this is the minimum that keeps the token inside the operator's networks and off
impostors that do not even claim the right name; an impostor serving a copy of a member's card
from an allowed network still passes. With keys (``verifier``: the node has ``MESH_KEYS``, and so
the mesh's root), before any credential is sent or any answer believed, also:

5. the card is signed by a key the mesh's root certifies for the agent the card names
   (``mesh._a2a.signing.verify_card``: unsigned, another root's, altered or expired: refused);
6. the URL about to be called is one of that verified card's interface URLs (exactly: scheme,
   host, port and path), so a genuine signed card copied to another address is refused there.

With keys, the credential of an admitted peer is the node's own call token, minted fresh for
each call and addressed to the verified agent (``identity``; ``mesh._identity``), instead of the
shared mesh token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from mesh._errors import NetworkRefused, PeerRefused
from mesh._netpolicy import NetworkPolicy

__all__ = ["PLAIN_HTTP_NETWORKS", "Admitted", "PeerRefused", "PeerTrust"]

log = logging.getLogger("mesh._trust")

#: Where plain http may carry the token: the networks ``NetworkPolicy`` calls loopback and private.
PLAIN_HTTP_NETWORKS = NetworkPolicy.parse("loopback,private")
# Verdicts kept at once; past it the oldest go (URLs come from discovery: not ours to bound).
_MAX_ENTRIES = 1024

#: Reads the card at the URL being checked (its JSON form), without the token.
CardFetcher = Callable[[], Awaitable[Mapping[str, Any]]]
#: The agent a card's signature certifies (``PeerRefused`` saying why none): rule 5.
CardVerifier = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Admitted:
    """A verified peer URL: the headers its calls carry (the token, when there is one) and the
    card it served while being checked."""

    headers: dict[str, str]
    card: Mapping[str, Any]
    #: Headers made fresh for each call (the caller identity token), over ``headers``.
    credential: Callable[[], dict[str, str]] | None = None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def _interface_urls(card: Mapping[str, Any]) -> list[str]:
    interfaces = card.get("supportedInterfaces")
    return [
        str(i["url"])
        for i in (interfaces if isinstance(interfaces, list) else [])
        if isinstance(i, Mapping) and i.get("url")
    ]


def _normal(url: str) -> tuple[tuple[str, str, int | None], str]:
    try:
        return _origin(url), urlsplit(url).path.rstrip("/")
    except ValueError:  # a port that is no number: matches nothing
        return ("", "", None), url


@dataclass
class PeerTrust:
    """The checks of the module docstring, for one node (or one script's ``remote()``, which
    sends no token). ``networks`` None and no token: no network check."""

    token: str | None = None
    networks: NetworkPolicy | None = None
    ttl_s: float = 30.0
    verifier: CardVerifier | None = None
    #: Mints this node's call token for an audience (the verified peer's name).
    identity: Callable[[str], str] | None = None
    clock: Callable[[], float] = time.monotonic
    _verdicts: dict[tuple[str, str | None], tuple[float, Admitted | PeerRefused]] = field(
        default_factory=dict, repr=False
    )
    _logged: set[str] = field(default_factory=set, repr=False)

    @property
    def _credentials(self) -> bool:
        """Whether admitted peers get a credential (the token, or call tokens)."""
        return self.token is not None or self.identity is not None

    async def admit(self, url: str, agent: str | None, fetch_card: CardFetcher) -> Admitted:
        """``Admitted`` for ``url`` as an instance of ``agent`` (None: any agent), else
        ``PeerRefused``. ``fetch_card`` reads the card at ``url`` without the token; its own
        errors (the peer is down) pass through and are not remembered."""
        key = (url, agent)
        now = self.clock()
        found = self._verdicts.get(key)
        if found is not None and found[0] > now:
            verdict = found[1]
        else:
            try:
                verdict = await self._check(url, agent, fetch_card)
            except PeerRefused as refused:
                verdict = refused
            if len(self._verdicts) >= _MAX_ENTRIES:
                self._verdicts.pop(next(iter(self._verdicts)))
            self._verdicts[key] = (now + self.ttl_s, verdict)
        if isinstance(verdict, PeerRefused):
            if url not in self._logged:
                if len(self._logged) >= _MAX_ENTRIES:
                    self._logged.clear()
                self._logged.add(url)
                log.warning("peer refused: %s", verdict)
            raise verdict
        return verdict

    async def _check(self, url: str, agent: str | None, fetch_card: CardFetcher) -> Admitted:
        parts = urlsplit(url)
        if self.networks is not None or self._credentials:
            await self._check_network(url, parts.scheme)
        card = await fetch_card()
        if self.verifier is not None:
            try:
                self.verifier(card)
            except PeerRefused as exc:
                raise PeerRefused(f"{url} is not a verified member of this mesh: {exc}") from None
        name = card.get("name")
        if agent is not None and name != agent:
            raise PeerRefused(
                f"{url} is not a verified member of this mesh: its agent card names "
                f"{name!r}, not {agent!r}; something else is registered under that name "
                f"(see: mesh show {agent})"
            )
        if self.verifier is not None:
            listed = _interface_urls(card)
            if _normal(url) not in {_normal(u) for u in listed}:
                raise PeerRefused(
                    f"{url} is not a verified member of this mesh: its signed card is that of "
                    f"the instance at {', '.join(sorted(set(listed))) or 'no address'}, not "
                    f"{url} (a copied card); if that node is yours, set its MESH_PUBLIC_URL to "
                    "the address it is registered under"
                )
        elif self.token is not None:
            interfaces = card.get("supportedInterfaces")
            listed = [
                str(i["url"])
                for i in (interfaces if isinstance(interfaces, list) else [])
                if isinstance(i, Mapping) and i.get("url")
            ]
            if listed and not any(_origin(u) == _origin(url) for u in listed):
                raise PeerRefused(
                    f"{url} is not a verified member of this mesh: its card says it is served at "
                    f"{', '.join(sorted(set(listed)))}, not at {url}, so the mesh token is not "
                    "sent there; if that node is yours, set its MESH_PUBLIC_URL to the address "
                    "it is registered under"
                )
        if self.identity is not None:
            mint, audience = self.identity, str(name)

            def credential() -> dict[str, str]:
                return {"Authorization": f"Bearer {mint(audience)}"}

            return Admitted({}, card, credential)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return Admitted(headers, card)

    async def _check_network(self, url: str, scheme: str) -> None:
        policy = self.networks or NetworkPolicy.parse("any")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise PeerRefused(
                f"{url} is not a verified member of this mesh: not an http(s)://host[:port] URL"
            )
        try:
            addresses = await policy.resolve(parts.hostname, port)
        except NetworkRefused as exc:
            raise PeerRefused(
                f"{url} is not a verified member of this mesh: {exc}; if that peer is yours, "
                f"add its network to MESH_PEER_NETWORKS (now {policy.spec})"
            ) from exc
        if self._credentials and scheme == "http":
            public = [a for a in addresses if not PLAIN_HTTP_NETWORKS.allows(a)]
            if public:
                raise PeerRefused(
                    f"{url} is plain http to {public[0]}, outside loopback and private "
                    "networks: the mesh token would cross them in clear; serve that peer over "
                    "https"
                )
