"""``CardRoute``: ``GET /.well-known/agent-card.json``, naming the origin the caller used.

A client checks that the card's interface URLs have the origin it fetched the card from (Google
ADK refuses a card fetched from ``http://localhost:8001`` that names ``http://127.0.0.1:8001``).
So the interface URLs are:

* ``MESH_PUBLIC_URL`` when it is set, for every request (the node knows its address);
* else the request's own origin (scheme + ``Host``) when that is a loopback form
  (``localhost``, ``127.0.0.0/8``, ``[::1]``, any port: a port forward keeps working), so a card
  fetched from ``localhost`` names ``localhost``;
* else the node's default URL (``http://<bind host>:<port>``), as before.

Only loopback forms are reflected: a ``Host`` header is the caller's to choose, and a card naming
whatever it said could be cached by a proxy and served to someone else (cache poisoning). A
loopback URL means "this machine" to whoever reads it, so reflecting one sends nobody elsewhere.
Responses that depend on ``Host`` say ``Vary: Host``.

With a ``signer`` (the node has keys: ``mesh._a2a.signing``) each distinct card is signed once,
when first built, and a loopback origin is reflected only when it is the socket the request
came in on (its address, or ``localhost``, and its port): the signature vouches for the
interface URLs, and a node must not sign a card naming another process's loopback port (an
impostor there could ask for one and serve it).

Caching headers: the SDK's weak ``ETag`` (same computation: the card without its signatures,
keys sorted, SHA-256) with ``If-None-Match`` -> 304, ``Cache-Control``, and ``Last-Modified``
(when this process built the card: a node's card changes only when it restarts) with
``If-Modified-Since`` -> 304 (ignored when ``If-None-Match`` is present, as RFC 9110 says).
``HEAD`` is answered like ``GET`` without the body.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import time
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import AgentCard
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mesh._a2a.card import CARD_CACHE_CONTROL, interfaces

if TYPE_CHECKING:
    # With keys only: a node without them never imports PyJWT (tests/test_import_cost.py).
    from mesh._a2a.signing import CardSigner

__all__ = ["CardRoute", "loopback_origin"]

# host[:port], the host a name or an IPv4 address, or [IPv6][:port]. Anything else is not
# reflected (it falls back to the node's URL).
_HOST = re.compile(
    r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>\d{1,5}))?$"
)
#: Origins whose card is kept (each a few KB); past it the cache starts again.
_MAX_ORIGINS = 64


def loopback_origin(scheme: str, host: str | None) -> str | None:
    """``scheme://host[:port]`` when ``host`` (a ``Host`` header) is a loopback form, else None.

    >>> loopback_origin("http", "localhost:8001")
    'http://localhost:8001'
    >>> loopback_origin("http", "evil.example:8001") is None
    True
    """
    if scheme not in ("http", "https") or not host:
        return None
    match = _HOST.match(host)
    if match is None:
        return None
    port = match["port"]
    if port is not None and not 0 < int(port) < 65536:
        return None
    if match["v6"] is not None:
        try:
            loopback = ipaddress.IPv6Address(match["v6"]).is_loopback
        except ValueError:
            return None
        shown = "[::1]"
    else:
        name = match["name"].lower()
        if name == "localhost":
            loopback = True
        else:
            try:
                loopback = ipaddress.IPv4Address(name).is_loopback
            except ValueError:
                return None
        shown = name
    if not loopback:
        return None
    return f"{scheme}://{shown}" + (f":{int(port)}" if port is not None else "")


@dataclass(frozen=True)
class _Served:
    body: bytes
    etag: str


class CardRoute:
    """Serves ``card`` (built for ``url``), its interface URLs following the caller's origin
    unless ``fixed`` (``MESH_PUBLIC_URL`` is set). See the module docstring."""

    def __init__(
        self, card: AgentCard, url: str, *, fixed: bool, signer: CardSigner | None = None
    ) -> None:
        self.card = card
        self.signer = signer
        self.url = url.rstrip("/")
        self.fixed = fixed
        self.built_at = int(time.time())
        self._last_modified = formatdate(self.built_at, usegmt=True)
        self._served: dict[str, _Served] = {}

    def route(self) -> Route:
        """The Starlette route (``GET`` and ``HEAD``)."""
        return Route(AGENT_CARD_WELL_KNOWN_PATH, self.endpoint, methods=["GET"])

    def origin(self, request: Request) -> str:
        """The base URL the card served to ``request`` names."""
        if self.fixed:
            return self.url
        reflected = loopback_origin(request.url.scheme, request.headers.get("host"))
        if reflected is not None and self.signer is not None:
            reflected = reflected if _own_socket(reflected, request) else None
        return reflected or self.url

    def served(self, origin: str) -> _Served:
        """The card's JSON for ``origin``, and its ETag (built once per origin)."""
        found = self._served.get(origin)
        if found is None:
            card = AgentCard()
            card.CopyFrom(self.card)
            del card.supported_interfaces[:]
            card.supported_interfaces.extend(interfaces(origin))
            if self.signer is not None:
                card = self.signer.sign(card)
            data = agent_card_to_dict(card)
            if len(self._served) >= _MAX_ORIGINS:
                self._served.clear()
            found = self._served[origin] = _Served(
                json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode(), _etag(data)
            )
        return found

    async def endpoint(self, request: Request) -> Response:
        served = self.served(self.origin(request))
        headers = {
            "ETag": served.etag,
            "Cache-Control": CARD_CACHE_CONTROL,
            "Last-Modified": self._last_modified,
        }
        if not self.fixed:
            headers["Vary"] = "Host"
        if self._not_modified(request, served.etag):
            return Response(status_code=304, headers=headers)
        return Response(served.body, media_type="application/json", headers=headers)

    def _not_modified(self, request: Request, etag: str) -> bool:
        if_none_match = request.headers.get("if-none-match")
        if if_none_match is not None:
            tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
            return "*" in tags or etag.removeprefix("W/") in tags
        since = request.headers.get("if-modified-since")
        if since is None:
            return False
        try:
            when = parsedate_to_datetime(since)
        except (TypeError, ValueError):
            return False  # not a date: the header is ignored (RFC 9110 13.1.3)
        if when.tzinfo is None:
            return False
        return self.built_at <= when.timestamp()


def _own_socket(origin: str, request: Request) -> bool:
    """Whether ``origin`` (a loopback form) names the socket ``request`` came in on."""
    server = request.scope.get("server")
    if not server:
        return False
    host, _, port = origin.split("://", 1)[1].rpartition(":")
    if not port.isdigit() or int(port) != server[1]:
        return False
    return host == "localhost" or host.strip("[]") == str(server[0])


def _etag(data: dict[str, Any]) -> str:
    """The SDK's card ETag: weak, over the card without its signatures."""
    unsigned = {k: v for k, v in data.items() if k != "signatures"}
    body = json.dumps(unsigned, sort_keys=True, separators=(",", ":"))
    return f'W/"{hashlib.sha256(body.encode()).hexdigest()}"'
