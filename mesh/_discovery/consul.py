"""Consul as the discovery backend (``MESH_DISCOVERY=consul://host:8500``).

A node registers as a Consul *service*: name = agent name, id = instance id, address and port
from its advertised URL, tags = its skill ids, meta = version, card path and URL. Consul itself
keeps the node's health with an HTTP check on ``/health`` and reaps a node that stays critical
(``DeregisterCriticalServiceAfter``), so a heartbeat only verifies the service still exists.

Callers find passing instances through the health API. Each query is then kept current by a
*blocking query* (``index``/``wait``) running in the background, so a ``find`` on the hot path
of a delegation is a dictionary read, and a replica that fails its check disappears from the
answers within Consul's propagation time rather than after a cache TTL.

py-consul's client is synchronous (requests): short calls run in worker threads; the blocking
queries, which hold a connection for up to ``wait``, run in daemon threads so a stopping
process never waits on them. This is the only module that imports ``consul``.

    backend = ConsulBackend("consul://127.0.0.1:8500", token=os.environ.get("CONSUL_HTTP_TOKEN"))
    await backend.register(Registration(instance_id="b1", agent="credit-bureau", url=..., ...))
    instances = await backend.find(agent="credit-bureau")
    await backend.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import consul
import requests
from consul.exceptions import ACLDisabled, ACLPermissionDenied, BadRequest, ConsulException

from mesh._discovery.base import Instance, Registration, Status, UnknownInstance
from mesh._errors import ConfigError, DiscoveryError

__all__ = [
    "ConsulBackend",
    "ConsulCheck",
    "QueryCache",
    "instance_from_entry",
    "parse_consul_url",
    "service_registration",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

DEFAULT_PORT = 8500
# Marks a Consul service as a mesh node (other services share the catalog: consul itself, ...).
MESH_META_KEY = "card_path"
_STATUS_RANK: dict[str, int] = {"passing": 0, "warning": 1, "critical": 2}
# What Consul's register endpoint takes as service meta (agent/structs/structs.go): anything
# else is refused with a 400, so a registration is checked against it before it is sent.
_META_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_META_MAX_VALUE = 512
_META_MAX_PAIRS = 64


@dataclass(frozen=True)
class ConsulCheck:
    """The HTTP check Consul runs against each node (Go durations, e.g. ``"5s"``)."""

    path: str = "/health"
    interval: str = "5s"
    timeout: str = "3s"
    # A node critical this long is removed from the catalog; it registers again on its next
    # heartbeat if it comes back.
    deregister_after: str = "1m"


def parse_consul_url(url: str) -> tuple[str, str, int]:
    """``consul://host[:port]`` -> ``("http", host, port)``; ``consul+https://`` -> https."""
    parts = urlsplit(url)
    schemes = {"consul": "http", "consul+http": "http", "consul+https": "https"}
    if parts.scheme not in schemes or not parts.hostname:
        raise ConfigError(
            f"MESH_DISCOVERY={url!r} is not a Consul address: use consul://HOST:8500 "
            "(or consul+https://HOST:8501)"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ConfigError(f"MESH_DISCOVERY={url!r}: the port is not a number") from exc
    return schemes[parts.scheme], parts.hostname, port


def service_registration(
    registration: Registration, check: ConsulCheck | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``consul.Consul().agent.service.register`` for a node.
    ``ConfigError`` naming the field for what Consul would refuse: a URL that is not http(s)
    with a host, service meta beyond Consul's limits (a URL or joined tags over 512
    characters)."""
    check = check or ConsulCheck()
    parts = urlsplit(registration.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"agent {registration.agent!r} advertises {registration.url!r}, which is not an "
            "http(s) URL with a host; set MESH_PUBLIC_URL to the address Consul can reach"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    base = registration.url.rstrip("/")
    meta = {
        **registration.meta,
        "version": registration.version,
        MESH_META_KEY: registration.card_path,
        "url": base,
    }
    if registration.tags:
        meta["tags"] = ",".join(registration.tags)
    _check_meta(registration.agent, meta)
    return {
        "name": registration.agent,
        "service_id": registration.instance_id,
        "address": parts.hostname,
        "port": port,
        "tags": list(registration.skills),
        "meta": meta,
        "check": {
            "Name": f"{registration.agent} {check.path}",
            "HTTP": base + check.path,
            "Method": "GET",
            "Interval": check.interval,
            "Timeout": check.timeout,
            "DeregisterCriticalServiceAfter": check.deregister_after,
        },
    }


def _check_meta(agent: str, meta: dict[str, str]) -> None:
    """``ConfigError`` naming the field, unless Consul stores ``meta`` as it is."""
    if len(meta) > _META_MAX_PAIRS:
        raise ConfigError(
            f"agent {agent!r} has {len(meta)} service meta entries; Consul keeps at most "
            f"{_META_MAX_PAIRS}: register fewer"
        )
    for key, value in meta.items():
        if not _META_KEY.match(key) or key.startswith("consul-"):
            raise ConfigError(
                f"agent {agent!r}: Consul refuses the service meta key {key!r}: use letters, "
                "digits, '_' and '-' (at most 128, not starting 'consul-')"
            )
        if len(value) <= _META_MAX_VALUE:
            continue
        limit = f"more than the {_META_MAX_VALUE} characters Consul keeps in a service meta value"
        if key == "url":
            raise ConfigError(
                f"agent {agent!r}: url: its URL is {len(value)} characters, {limit}; advertise "
                "a shorter one (MESH_PUBLIC_URL)"
            )
        if key == "tags":
            raise ConfigError(
                f"agent {agent!r}: tags: its tags take {len(value)} characters joined, {limit}; "
                "give the agent fewer or shorter tags"
            )
        raise ConfigError(
            f"agent {agent!r}: service meta {key!r} is {len(value)} characters, {limit}"
        )


def _worst(statuses: list[str]) -> Status:
    # Maintenance mode and unknown states count as critical: never route to them.
    rank = max((_STATUS_RANK.get(s, 2) for s in statuses), default=0)
    statuses_by_rank: tuple[Status, ...] = ("passing", "warning", "critical")
    return statuses_by_rank[rank]


def instance_from_entry(entry: dict[str, Any]) -> Instance | None:
    """One ``/v1/health/service`` entry -> ``Instance``; ``None`` for a non-mesh service.

    The status is the worst of the entry's checks (the node's serf check included).
    """
    service = entry.get("Service") or {}
    meta = {str(k): str(v) for k, v in (service.get("Meta") or {}).items()}
    if MESH_META_KEY not in meta:
        return None
    url = meta.get("url")
    if not url:
        host = service.get("Address") or (entry.get("Node") or {}).get("Address", "")
        host = f"[{host}]" if ":" in host else host
        url = f"http://{host}:{service.get('Port', 80)}"
    return Instance(
        instance_id=str(service.get("ID", "")),
        agent=str(service.get("Service", "")),
        url=url,
        version=meta.get("version", ""),
        status=_worst([str(c.get("Status", "")) for c in entry.get("Checks") or []]),
        skills=tuple(service.get("Tags") or ()),
        meta=meta,
    )


async def _in_daemon_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a daemon thread: unlike ``to_thread``, exit never waits for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():  # the waiter was cancelled
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="mesh-consul-watch", daemon=True).start()
    return await future


Fetch = Callable[[K, str | None, float], tuple[str | None, T]]


@dataclass
class _Entry(Generic[T]):
    index: str | None
    value: T
    fetched_at: float
    used_at: float
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class QueryCache(Generic[K, T]):
    """Consul query results, each kept current by a background blocking-query loop.

    ``fetch(key, index, wait_s)`` is synchronous and returns ``(index, value)``: with
    ``index=None`` it answers at once; with an index it may block up to ``wait_s`` for a change.
    ``get(key)`` answers from the cache while its watch is alive and recent; otherwise it
    fetches directly (so errors reach the caller) and (re)starts the watch. A watch that nobody
    read for ``idle_after`` seconds stops; its entry then lives ``ttl`` seconds.
    """

    def __init__(
        self,
        fetch: Fetch[K, T],
        *,
        direct: Callable[[Callable[[], tuple[str | None, T]]], Awaitable[tuple[str | None, T]]],
        wait_s: float = 30.0,
        ttl: float = 2.0,
        idle_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._direct = direct
        self.wait_s = wait_s
        self.ttl = ttl
        self.idle_after = idle_after
        self._clock = clock
        self._entries: dict[K, _Entry[T]] = {}
        self._closed = False

    def _fresh(self, entry: _Entry[T], now: float) -> bool:
        watching = entry.task is not None and not entry.task.done()
        # A live blocking query returns at least every wait (+ Consul's jitter of wait/16).
        limit = self.ttl + (self.wait_s * 17 / 16 if watching else 0.0)
        return now - entry.fetched_at <= limit

    async def get(self, key: K) -> T:
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and self._fresh(entry, now):
            entry.used_at = now
            return entry.value
        index, value = await self._direct(lambda: self._fetch(key, None, self.wait_s))
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(index, value, self._clock(), self._clock())
        else:
            entry.index, entry.value, entry.fetched_at = index, value, self._clock()
            entry.used_at = entry.fetched_at
        if not self._closed and (entry.task is None or entry.task.done()):
            entry.task = asyncio.create_task(self._watch(key, entry), name=f"consul-watch {key}")
        return value

    def invalidate(self) -> None:
        """Forget every answer (after this process changed the catalog itself)."""
        for entry in self._entries.values():
            entry.fetched_at = float("-inf")

    async def _watch(self, key: K, entry: _Entry[T]) -> None:
        while not self._closed and self._clock() - entry.used_at <= self.idle_after:
            index = entry.index
            try:
                new_index, value = await _in_daemon_thread(
                    functools.partial(self._fetch, key, index, self.wait_s)
                )
            except Exception as exc:
                # The next get() fetches directly and reports the error to its caller.
                log.debug("consul watch %s stopped: %r", key, exc)
                return
            entry.value, entry.fetched_at = value, self._clock()
            # Consul's rule: an index that goes backwards (or is not positive) restarts at 0.
            entry.index = new_index if _index_ok(index, new_index) else "0"

    async def aclose(self) -> None:
        self._closed = True
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _index_ok(old: str | None, new: str | None) -> bool:
    try:
        return new is not None and int(new) > 0 and (old is None or int(new) >= int(old))
    except ValueError:
        return False


_Instances = tuple[Instance, ...]
_Catalog = dict[str, list[str]]


class ConsulBackend:
    """``DiscoveryBackend`` on a Consul agent (register on the agent, find via health API)."""

    def __init__(
        self,
        address: str = f"consul://127.0.0.1:{DEFAULT_PORT}",
        *,
        token: str | None = None,
        check: ConsulCheck | None = None,
        wait_s: float = 30.0,
        ttl: float = 2.0,
        timeout_s: float = 5.0,
    ) -> None:
        scheme, host, port = parse_consul_url(address)
        self.address = address
        self.check = check or ConsulCheck()
        self._client = consul.Consul(
            host=host, port=port, scheme=scheme, token=token, connections_timeout=timeout_s
        )
        # py-consul prefers CONSUL_HTTP_TOKEN over the argument; the caller's token wins here.
        self._client.token = token
        self._services: QueryCache[tuple[str, str | None, bool], _Instances] = QueryCache(
            self._fetch_service, direct=self._direct, wait_s=wait_s, ttl=ttl
        )
        self._catalog: QueryCache[str, _Catalog] = QueryCache(
            self._fetch_catalog, direct=self._direct, wait_s=wait_s, ttl=ttl
        )

    # -- translation of py-consul / requests errors, in one place ------------------------------
    async def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except (ACLPermissionDenied, ACLDisabled) as exc:
            raise DiscoveryError(
                f"Consul at {self.address} refused to {what}: permission denied; set "
                f"CONSUL_HTTP_TOKEN to a token allowed to do it ({exc})"
            ) from exc
        except BadRequest as exc:
            # Consul answered, and said what is wrong with the request (its 400 body).
            reason = str(exc).removeprefix("400 ").strip()
            raise DiscoveryError(f"Consul at {self.address} refused to {what}: {reason}") from exc
        except (ConsulException, requests.RequestException, OSError, ValueError) as exc:
            raise DiscoveryError(
                f"Consul at {self.address} could not {what}: {exc!r}; is the Consul agent "
                "running and is MESH_DISCOVERY right?"
            ) from exc

    async def _direct(self, fn: Callable[[], T]) -> T:
        return await self._call("answer a query", fn)

    def _fetch_service(
        self, key: tuple[str, str | None, bool], index: str | None, wait_s: float
    ) -> tuple[str | None, _Instances]:
        name, tag, passing = key
        new_index, entries = self._client.health.service(
            name, passing=passing or None, tag=tag, index=index, wait=f"{int(wait_s)}s"
        )
        found = (instance_from_entry(e) for e in entries or [])
        return new_index, tuple(i for i in found if i is not None)

    def _fetch_catalog(
        self, key: str, index: str | None, wait_s: float
    ) -> tuple[str | None, _Catalog]:
        new_index, services = self._client.catalog.services(index=index, wait=f"{int(wait_s)}s")
        return new_index, {str(k): list(v or []) for k, v in (services or {}).items()}

    # -- DiscoveryBackend -----------------------------------------------------------------------
    async def register(self, registration: Registration) -> None:
        """Register (or re-register: same id replaces) the node as a Consul service.
        ``DiscoveryError`` if Consul refuses it, or would (``service_registration``)."""
        try:
            kwargs = service_registration(registration, self.check)
        except ConfigError as exc:
            # A DiscoveryError, as the backend contract says: the node's registrar logs it
            # (and keeps trying) instead of ending on an error nobody sees.
            raise DiscoveryError(f"Consul at {self.address} cannot register: {exc}") from exc
        ok = await self._call(
            f"register {registration.agent!r}",
            lambda: self._client.agent.service.register(**kwargs),
        )
        if not ok:
            raise DiscoveryError(
                f"Consul at {self.address} did not register {registration.agent!r}"
            )
        self._services.invalidate()
        self._catalog.invalidate()

    async def heartbeat(self, instance_id: str) -> None:
        """Consul's own check keeps health; this only verifies the service still exists."""
        services = await self._call("list its services", lambda: self._client.agent.services())
        if instance_id not in (services or {}):
            raise UnknownInstance(
                f"Consul at {self.address} no longer knows instance {instance_id!r}"
            )

    async def deregister(self, instance_id: str) -> None:
        """Remove the service (and its check); an unknown id is not an error."""
        await self._call(
            f"deregister {instance_id!r}",
            lambda: self._client.agent.service.deregister(instance_id),
        )
        self._services.invalidate()
        self._catalog.invalidate()

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        """Instances of ``agent`` and/or offering ``skill`` (a Consul tag); passing by default."""
        if agent is not None:
            names = [agent]
        else:
            catalog = await self._catalog.get("services")
            names = sorted(n for n, tags in catalog.items() if skill is None or skill in tags)
        found = await asyncio.gather(
            *(self._services.get((name, skill, passing_only)) for name in names)
        )
        return [i for group in found for i in group]

    async def ping(self) -> None:
        """Raise ``DiscoveryError`` unless Consul answers and its cluster has a leader."""
        leader = await self._call("say who leads its cluster", self._client.status.leader)
        if not leader:
            raise DiscoveryError(f"Consul at {self.address} answers but has no cluster leader")

    async def aclose(self) -> None:
        await self._services.aclose()
        await self._catalog.aclose()
        # Close the pooled sockets now rather than leave them to the garbage collector.
        self._client.http.session.close()
