"""``PeerLink``: how a ``remote()`` toolset reaches the instances of its peer agent.

It resolves the instances (discovery, or the fixed URL), admits each URL before the URL gets a
call (``mesh._trust``: the URL's network, the name on its card, the mesh token only to a verified
member), keeps one ``A2APeer`` per URL, and shows the instances' circuit breakers: one gauge
series per resolved instance, one log line per change.

Its clients are the node's (``bind``, from the node's lifespan). Used on its own (a script with a
``Runner``), it opens its own on first use, from the environment (``standalone_setup``: the
variables ``mesh serve`` reads, read as it opens them), opens them again on a new event loop
(those of the old loop cannot be used there), and ``aclose`` closes them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from mesh._errors import AgentNotFound, DiscoveryError, PeerRefused, RemoteError
from mesh._netpolicy import NetworkPolicy
from mesh._resilience import BreakerBoard, BreakerState
from mesh._trust import Admitted, PeerTrust

if TYPE_CHECKING:
    from mesh._a2a.client import A2APeer
    from mesh._discovery.client import DiscoveryClient
    from mesh._metrics import BreakerState as MetricBreakerState
    from mesh._metrics import NodeMetrics
    from mesh._settings import ConsulTLS, MeshSettings

__all__ = ["PeerLink", "StandaloneSetup", "standalone_setup"]

log = logging.getLogger("mesh._remote")

_BREAKER_NAMES: dict[BreakerState, MetricBreakerState] = {
    BreakerState.CLOSED: "closed",
    BreakerState.HALF_OPEN: "half-open",
    BreakerState.OPEN: "open",
}


@dataclass(frozen=True)
class StandaloneSetup:
    """What a toolset used outside a node connects with (a node binds its own instead)."""

    #: Where peers may be: ``MESH_PEER_NETWORKS``, else any network (link-local never).
    networks: NetworkPolicy
    #: The registry's URL (``MESH_REGISTRY``) or ``consul://host:port`` (``MESH_DISCOVERY``).
    discovery: str
    #: ``MESH_REGISTRY_TOKEN``, or ``CONSUL_HTTP_TOKEN`` for Consul.
    token: str | None
    #: ``CONSUL_CACERT`` and the client certificate, for ``consul+https://``.
    consul_tls: ConsulTLS | None = None


def standalone_setup(settings: MeshSettings) -> StandaloneSetup:
    """What a ``remote()`` toolset outside a node connects with, from ``settings`` (a script's
    are read from its environment by ``mesh._settings.environment`` as the toolset opens its
    clients). Outside a node there is no token to protect: any network, unless
    ``MESH_PEER_NETWORKS`` narrows it."""
    networks = settings.peer_networks or NetworkPolicy.parse("any")
    return StandaloneSetup(
        networks, settings.discovery_location, settings.discovery_token, settings.consul_tls
    )


class PeerLink:
    """The instances of the peer agent ``peer`` (or the one at ``url``), and the clients that
    reach them (see the module docstring). ``peer`` names the peer in errors, logs and metrics:
    the agent's name, or for ``remote(url)`` the name its card gives."""

    def __init__(
        self,
        peer: str,
        *,
        url: str | None,
        named: bool,
        deadline_s: float,
        breakers: BreakerBoard,
    ) -> None:
        self.peer = peer
        self.url = url
        self.named = named
        self.deadline_s = deadline_s
        self.breakers = breakers
        self.instances: list[str] = []
        self.metrics: NodeMetrics | None = None
        self._discovery: DiscoveryClient | None = None
        self._http: httpx.AsyncClient | None = None
        self._owned: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._peers: dict[str, A2APeer] = {}
        # Until a node binds its own (token and MESH_PEER_NETWORKS), or ready() opens this
        # link's own client: the card must name the agent asked for.
        self._trust = PeerTrust()
        # The largest answer read from a peer (None: A2APeer's default, 32 MiB).
        self._max_answer_bytes: int | None = None
        # Whether the breaker series show the current instances.
        self._exported = False
        self._watching = False

    # -- lifecycle --------------------------------------------------------------------------
    def bind(
        self,
        *,
        discovery: DiscoveryClient | None = None,
        http: httpx.AsyncClient | None = None,
        metrics: NodeMetrics | None = None,
        trust: PeerTrust | None = None,
        max_answer_bytes: int | None = None,
    ) -> None:
        """Use these clients, metrics and peer checks instead of opening its own."""
        if max_answer_bytes is not None:
            self._max_answer_bytes = max_answer_bytes
            self._peers.clear()
        if trust is not None:
            self._trust = trust
            self._peers.clear()
        if discovery is not None:
            self._discovery = discovery
        if http is not None:
            self._http = http
            self._peers.clear()
        if metrics is not None:
            self.metrics = metrics
            self._exported = False
        self._loop = None  # bound resources belong to the running loop

    async def aclose(self) -> None:
        """Close what this link opened itself (never what ``bind`` gave it)."""
        for peer in self._peers.values():
            await peer.aclose()
        self._peers.clear()
        owned, self._owned = self._owned, []
        for resource in owned:
            await resource.aclose()
            if resource is self._http:
                self._http = None
            if resource is self._discovery:
                self._discovery = None
        if self._watching:
            self.breakers.remove_listener(self._breaker_changed)
            self._watching = False
        self._loop = None  # the next use starts over (and watches the breakers again)

    def is_ready(self) -> bool:
        """Whether ``ready`` would return at once: its client is open on this event loop (every
        call after the first one; a call asks this first, no coroutine made for it)."""
        return (
            self._http is not None
            and (self._discovery is not None or self.url is not None)
            and self._loop is asyncio.get_running_loop()
        )

    async def ready(self) -> httpx.AsyncClient:
        """The HTTP client for this peer's instances (opening this link's own, the first time
        on this event loop, when none was bound)."""
        loop = asyncio.get_running_loop()
        http = self._http
        found = self._discovery is not None or self.url is not None
        if http is not None and found and self._loop is loop:
            return http  # every call after the first one
        if self._lock is None or self._loop is not loop:
            # First use, or a new event loop (a test, a script): resources of the old one
            # cannot be used here.
            self._lock = asyncio.Lock()
            if self._loop is not None and self._owned:
                self._owned = []
                self._http = None
                self._discovery = None
                self._peers.clear()
            self._loop = loop
        async with self._lock:
            if not self._watching:
                self.breakers.add_listener(self._breaker_changed)
                self._watching = True
            if self._http is None or (self._discovery is None and self.url is None):
                self._open_own()
        assert self._http is not None
        return self._http

    def _open_own(self) -> None:
        from mesh._discovery import create_backend
        from mesh._discovery.client import DiscoveryClient
        from mesh._netguard import create_http_client
        from mesh._settings import environment
        from mesh._tls import trust

        settings = environment()
        if settings.tls_ca is not None:
            # A script is its own edge: its HTTPS peers verify against its MESH_TLS_CA (a
            # node's entry point has set the same already).
            trust(settings.tls_ca)
        setup = standalone_setup(settings)
        if self._http is None:
            # Checked before each URL is used (PeerTrust, for a clear refusal) and as each
            # connection is made (the client), like a node's.
            self._http = create_http_client(
                setup.networks, timeout=httpx.Timeout(self.deadline_s + 5.0, connect=2.0)
            )
            self._owned.append(self._http)
            if self._trust.networks is None:
                self._trust = PeerTrust(networks=setup.networks)
                self._peers.clear()
        if self._discovery is None and self.url is None:
            self._discovery = DiscoveryClient(
                create_backend(setup.discovery, token=setup.token, consul_tls=setup.consul_tls)
            )
            self._owned.append(self._discovery)

    # -- instances --------------------------------------------------------------------------
    async def targets(self, skill: str) -> list[str]:
        """The URLs of the peer's instances now; ``RemoteError`` "unavailable" when discovery
        knows none or cannot answer."""
        if not self.is_ready():
            await self.ready()
        if self.url is not None:
            found = [self.url]
        else:
            assert self._discovery is not None
            try:
                instances = await self._discovery.require(agent=self.peer)
            except AgentNotFound as exc:
                raise RemoteError.unavailable(self.peer, skill, str(exc)) from exc
            except DiscoveryError as exc:
                detail = f"cannot reach discovery ({exc})"
                raise RemoteError.unavailable(self.peer, skill, detail) from exc
            found = [i.url.rstrip("/") for i in instances]
        if found != self.instances:
            self.instances = found
            # Breakers (and their series) of targets discovery no longer names go: whoever
            # registers chooses the URLs, and junk registrations must not pile up.
            self.breakers.retain(found)
            self._exported = False
        if not self._exported:
            self._export_breakers()
        return list(found)

    def forget_instances(self) -> None:
        """An instance was unavailable: resolve again next time (not from discovery's cache)."""
        if self._discovery is not None:
            self._discovery.invalidate(agent=self.peer)

    def peer_at(self, url: str) -> A2APeer:
        """The ``A2APeer`` for ``url`` (not admitted: see ``admit``)."""
        http = self._http
        assert http is not None, "ready() first"
        peer = self._peers.get(url)
        if peer is None or peer.http is not http:
            # Imported here, once per new peer: not an import statement per call.
            from mesh._a2a.client import CARD_TIMEOUT_S, MAX_ANSWER_BYTES, A2APeer

            # A card read outside any call (declaring tools) is bounded by the call's deadline.
            peer = self._peers[url] = A2APeer(
                http,
                url,
                card_timeout_s=min(CARD_TIMEOUT_S, self.deadline_s),
                max_answer_bytes=self._max_answer_bytes or MAX_ANSWER_BYTES,
            )
        return peer

    async def admit(self, url: str, skill: str) -> tuple[A2APeer, Admitted]:
        """The peer at ``url`` once ``mesh._trust`` verified it (its calls then carry the token).
        A refused URL, or one whose card cannot be read, is ``unavailable``: the retry tries
        the next instance."""
        peer = self.peer_at(url)
        try:
            admitted = await self._trust.admit(
                url, self.peer if self.named else None, peer.fetch_card_dict
            )
        except PeerRefused as exc:
            peer.headers = {}
            peer.credential = None
            raise RemoteError.unavailable(self.peer, skill, str(exc)) from exc
        except RemoteError as exc:
            raise RemoteError.unavailable(self.peer, skill, str(exc)) from exc
        peer.headers = dict(admitted.headers)
        peer.credential = admitted.credential
        return peer, admitted

    # -- visibility -------------------------------------------------------------------------
    def _breaker_changed(self, target: str, state: BreakerState) -> None:
        if target not in self.instances and target != self.url:
            return  # a board shared with another toolset: its instance, not ours
        log.warning(
            "circuit breaker peer=%s target=%s state=%s", self.peer, target, state.name.lower()
        )
        self._export_breakers()

    def _export_breakers(self) -> None:
        """One breaker series per resolved target, from the first resolution on (closed until
        it changes: a healthy mesh shows its breakers instead of no series), and none for
        targets no longer resolved (``NodeMetrics.breaker_states`` bounds the count)."""
        if self.metrics is None:
            return
        targets = self.instances or ([self.url] if self.url else [])
        states = {t: _BREAKER_NAMES[self.breakers.state(t)] for t in targets}
        self.metrics.breaker_states(self.peer, states)
        self._exported = True
