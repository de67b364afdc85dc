"""Consul as the discovery backend (``MESH_DISCOVERY=consul://host:8500``).

A node registers as a Consul *service*: name = agent name, id = instance id, address and port
from its advertised URL, tags = its skill ids and ``MESH_TAG`` (which marks mesh services in a
catalog shared with others), meta = version, card path and URL. Consul itself keeps the node's
health with an HTTP check on ``/health`` and reaps a node that stays critical
(``DeregisterCriticalServiceAfter``, 10 minutes by default), so a heartbeat only verifies the
service still exists.

Callers find passing instances through the health API, read *stale* (any server answers, so
lookups go on while the servers elect a leader, as Prometheus' Consul discovery reads). Each
query is then kept current by a *blocking query* (``index``/``wait``) running in the background,
by the rules of Consul's "Blocking Queries" page: an index that goes backwards restarts at 0, one
that is not positive at 1, and a watch makes at most one request per ``min_interval_s``. So a
``find`` on the hot path of a delegation is a dictionary read, and a replica that fails its check
disappears from the answers within Consul's propagation time rather than after a cache TTL.
When Consul does not answer (an agent restarting), the last answer is served for up to
``max_stale_s`` while the watch retries with backoff.

py-consul's client is synchronous (requests): short calls run in worker threads; the blocking
queries, which hold a connection for up to ``wait``, run in daemon threads so a stopping
process never waits on them. A ``requests.Session`` is not safe to share between threads, so
each request checks out a client of its own from a small pool. This is the only module that
imports ``consul``.

    backend = ConsulBackend("consul://127.0.0.1:8500", token=settings.discovery_token)
    await backend.register(Registration(instance_id="b1", agent="credit-bureau", url=..., ...))
    instances = await backend.find(agent="credit-bureau")
    await backend.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import urlsplit

import consul
import requests
from consul.callback import CB
from consul.exceptions import (
    ACLDisabled,
    ACLPermissionDenied,
    BadRequest,
    ClientError,
    ConsulException,
)
from consul.std import parse_duration

from mesh._discovery.base import Instance, Registration, Status, UnknownInstance
from mesh._errors import ConfigError, DiscoveryError

if TYPE_CHECKING:
    from mesh._settings.settings import ConsulTLS

__all__ = [
    "MESH_TAG",
    "ConsulBackend",
    "ConsulCheck",
    "QueryCache",
    "go_wait",
    "instance_from_entry",
    "next_index",
    "parse_consul_url",
    "service_registration",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

DEFAULT_PORT = 8500
# Marks a Consul service as a mesh node (other services share the catalog: consul itself, ...).
MESH_META_KEY = "card_path"
#: The tag every mesh service carries: the catalog's services with it are the ones watched.
#: A ':' is in no mesh skill id (lowercase letters, digits, '-', '_'), so no skill shadows it.
MESH_TAG = "mesh:node"
# Consul's reaper runs every 30 s and refuses DeregisterCriticalServiceAfter under a minute.
_MIN_DEREGISTER_S = 60.0
_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_STATUS_RANK: dict[str, int] = {"passing": 0, "warning": 1, "critical": 2}
# What Consul's register endpoint takes as service meta (agent/structs/structs.go): anything
# else is refused with a 400, so a registration is checked against it before it is sent.
_META_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_META_MAX_VALUE = 512
_META_MAX_PAIRS = 64


@dataclass(frozen=True)
class ConsulCheck:
    """The HTTP check Consul runs against each node (Go durations, e.g. ``"5s"``).
    ``ConfigError`` for a duration Consul would not take, or ``deregister_after`` under the
    minute Consul's reaper needs."""

    path: str = "/health"
    interval: str = "5s"
    timeout: str = "3s"
    # A node critical this long is removed from the catalog; it registers again on its next
    # heartbeat if it comes back. Long, so a node whose /health says 503 for a while (its model
    # provider down) stays registered and comes back by its check alone.
    deregister_after: str = "10m"

    def __post_init__(self) -> None:
        for name in ("interval", "timeout", "deregister_after"):
            value = getattr(self, name)
            if not _GO_DURATION.match(value):
                raise ConfigError(
                    f"Consul check {name}={value!r} is not a Go duration: write e.g. '5s' or '10m'"
                )
        if parse_duration(self.deregister_after) < _MIN_DEREGISTER_S:
            raise ConfigError(
                f"Consul check deregister_after={self.deregister_after!r} is under Consul's "
                "minimum of one minute (its reaper runs every 30 s): use '1m' or more "
                "(the default is '10m')"
            )


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
        "tags": [*registration.skills, MESH_TAG],
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
        skills=tuple(t for t in service.get("Tags") or () if t != MESH_TAG),
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
    # When a direct fetch last failed: within a ttl of it, lookups get the last answer without
    # asking again (a hung agent would cost each of them the request timeout).
    failed_at: float = float("-inf")


class QueryCache(Generic[K, T]):
    """Consul query results, each kept current by a background blocking-query loop.

    ``fetch(key, index, wait_s)`` is synchronous and returns ``(index, value)``: with
    ``index=None`` it answers at once; with an index it may block up to ``wait_s`` for a change.
    ``get(key)`` answers from the cache while its watch is alive and recent; otherwise it
    fetches directly and (re)starts the watch. A direct fetch that fails is answered with the
    last value if it is at most ``max_stale_s`` older than a fresh one would be, else the error
    reaches the caller. A watch makes at most one request per ``min_interval_s`` (Consul's
    docs ask watchers of a churning query to rate limit) and retries a failed one with backoff;
    one that nobody read for ``idle_after`` seconds stops.
    """

    def __init__(
        self,
        fetch: Fetch[K, T],
        *,
        direct: Callable[[Callable[[], tuple[str | None, T]]], Awaitable[tuple[str | None, T]]],
        wait_s: float = 30.0,
        ttl: float = 2.0,
        idle_after: float = 120.0,
        max_stale_s: float = 300.0,
        min_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._direct = direct
        self.wait_s = wait_s
        self.ttl = ttl
        self.idle_after = idle_after
        self.max_stale_s = max_stale_s
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._entries: dict[K, _Entry[T]] = {}
        self._closed = False

    def _limit(self, entry: _Entry[T]) -> float:
        watching = entry.task is not None and not entry.task.done()
        # A live blocking query returns at least every wait (+ Consul's jitter of wait/16).
        return self.ttl + (self.wait_s * 17 / 16 if watching else 0.0)

    async def get(self, key: K) -> T:
        now = self._clock()
        entry = self._entries.get(key)
        if entry is not None and (
            now - entry.fetched_at <= self._limit(entry)
            or (
                now - entry.failed_at <= self.ttl
                and now - entry.fetched_at <= self._limit(entry) + self.max_stale_s
            )
        ):
            entry.used_at = now
            return entry.value
        try:
            index, value = await self._direct(lambda: self._fetch(key, None, self.wait_s))
        except Exception as exc:
            if entry is None or now - entry.fetched_at > self._limit(entry) + self.max_stale_s:
                raise
            entry.failed_at = now
            log.warning(
                "consul: serving the answer of %.0fs ago for %s: %s",
                now - entry.fetched_at,
                key,
                exc,
            )
            entry.used_at = now
            self._ensure_watch(key, entry)
            return entry.value
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(index, value, self._clock(), self._clock())
        else:
            entry.index, entry.value, entry.fetched_at = index, value, self._clock()
            entry.used_at = entry.fetched_at
        entry.index = next_index(None, index)
        self._ensure_watch(key, entry)
        return value

    def _ensure_watch(self, key: K, entry: _Entry[T]) -> None:
        if not self._closed and (entry.task is None or entry.task.done()):
            entry.task = asyncio.create_task(self._watch(key, entry), name=f"consul-watch {key}")

    def invalidate(self) -> None:
        """Forget every answer (after this process changed the catalog itself)."""
        for entry in self._entries.values():
            entry.fetched_at = float("-inf")

    async def _watch(self, key: K, entry: _Entry[T]) -> None:
        loop = asyncio.get_running_loop()
        last_start = float("-inf")
        failures = 0
        while not self._closed and self._clock() - entry.used_at <= self.idle_after:
            delay = self.min_interval_s - (loop.time() - last_start)
            if failures:
                # Doubling from 0.5 s, at most a wait: Consul restarting, or limiting our rate.
                delay = max(delay, min(self.wait_s, 0.5 * 2 ** (failures - 1)))
            if delay > 0:
                await asyncio.sleep(delay)
            last_start = loop.time()
            index = entry.index
            try:
                new_index, value = await _in_daemon_thread(
                    functools.partial(self._fetch, key, index, self.wait_s)
                )
            except Exception as exc:
                failures += 1
                log.debug("consul watch %s failed (%d in a row): %r", key, failures, exc)
                continue
            failures = 0
            entry.value, entry.fetched_at = value, self._clock()
            entry.index = next_index(index, new_index)

    async def aclose(self) -> None:
        self._closed = True
        tasks = [e.task for e in self._entries.values() if e.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def next_index(old: str | None, new: str | None) -> str:
    """The index of the next blocking query, by Consul's rules ("Blocking Queries",
    implementation details): one that went backwards restarts at ``"0"`` (a non-blocking
    read); one that is not positive (a Consul bug) becomes ``"1"``, since ``0`` would not block
    and the watch would spin."""
    try:
        value = int(new or "")
    except ValueError:
        return "0"
    if value <= 0:
        return "1"
    try:
        if old is not None and value < int(old):
            return "0"
    except ValueError:
        pass
    return str(value)


def go_wait(seconds: float) -> str:
    """A blocking query's ``wait`` as a Go duration, in milliseconds: ``"0s"`` would be Consul's
    default of five minutes, not less than a second."""
    return f"{max(1, round(seconds * 1000))}ms"


class _ClientPool:
    """py-consul clients, one per request in flight: a ``requests.Session`` is not safe to
    share between threads, and the watches' daemon threads run concurrently."""

    def __init__(self, make: Callable[[], consul.Consul]) -> None:
        self._make = make
        self._idle: list[consul.Consul] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[[consul.Consul], T]) -> T:
        with self._lock:
            client = self._idle.pop() if self._idle else self._make()
        try:
            return fn(client)
        finally:
            with self._lock:
                closed = self._closed
                if not closed:
                    self._idle.append(client)
            if closed:
                client.http.session.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for client in idle:
            # Close the pooled sockets now rather than leave them to the garbage collector.
            client.http.session.close()


_Instances = tuple[Instance, ...]
_Catalog = dict[str, list[str]]


class ConsulBackend:
    """``DiscoveryBackend`` on a Consul agent (register on the agent, find via health API).

    ``token``: the ACL token (None: what py-consul reads from ``CONSUL_HTTP_TOKEN``, like every
    Consul tool). ``tls``: CA and client certificate for ``consul+https://``. ``max_stale_s``:
    how long the last answer stands in for one Consul cannot give (an agent restarting).
    """

    def __init__(
        self,
        address: str = f"consul://127.0.0.1:{DEFAULT_PORT}",
        *,
        token: str | None = None,
        tls: ConsulTLS | None = None,
        check: ConsulCheck | None = None,
        wait_s: float = 30.0,
        ttl: float = 2.0,
        timeout_s: float = 5.0,
        max_stale_s: float = 300.0,
        min_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        scheme, host, port = parse_consul_url(address)
        self.address = address
        self.check = check or ConsulCheck()
        verify: bool | str = True if tls is None else tls.verify_arg
        cert = None if tls is None else tls.cert_arg

        def make() -> consul.Consul:
            client = consul.Consul(
                host=host,
                port=port,
                scheme=scheme,
                token=token,
                verify=verify,
                cert=cert,
                connections_timeout=timeout_s,
            )
            if token is not None:
                # py-consul prefers CONSUL_HTTP_TOKEN over the argument; a given token wins.
                client.token = token
            return client

        self._pool = _ClientPool(make)

        def cache(fetch: Fetch[K, T]) -> QueryCache[K, T]:
            return QueryCache(
                fetch,
                direct=self._direct,
                wait_s=wait_s,
                ttl=ttl,
                max_stale_s=max_stale_s,
                min_interval_s=min_interval_s,
                clock=clock,
            )

        self._services: QueryCache[tuple[str, str | None, bool], _Instances] = cache(
            self._fetch_service
        )
        self._catalog: QueryCache[str, _Catalog] = cache(self._fetch_catalog)

    def __repr__(self) -> str:
        return f"ConsulBackend({self.address!r})"

    # -- translation of py-consul / requests errors, in one place ------------------------------
    async def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except ACLPermissionDenied as exc:
            raise DiscoveryError(
                f"Consul at {self.address} refused to {what}: permission denied ({exc}); set "
                "CONSUL_HTTP_TOKEN to a token whose policy allows it (docs/production.md, "
                "'ACL policy')"
            ) from exc
        except ACLDisabled as exc:
            raise DiscoveryError(
                f"Consul at {self.address} refused to {what}: {exc}; its ACLs are disabled, so "
                "unset CONSUL_HTTP_TOKEN"
            ) from exc
        except BadRequest as exc:
            # Consul answered, and said what is wrong with the request (its 400 body).
            reason = str(exc).removeprefix("400 ").strip()
            raise DiscoveryError(f"Consul at {self.address} refused to {what}: {reason}") from exc
        except ClientError as exc:
            if str(exc).startswith("429"):
                raise DiscoveryError(
                    f"Consul at {self.address} is limiting the rate of requests and did not "
                    f"{what} ({exc}); mesh retries with backoff: raise Consul's limits "
                    "(limits.http_max_conns_per_client, limits.request_limits) if it persists"
                ) from exc
            raise DiscoveryError(f"Consul at {self.address} refused to {what}: {exc}") from exc
        except ConsulException as exc:
            message = str(exc)
            if "No cluster leader" in message:
                raise DiscoveryError(
                    f"Consul at {self.address} could not {what}: its servers have no leader "
                    f"({message}); they elect one once a quorum of them is up"
                ) from exc
            raise DiscoveryError(f"Consul at {self.address} could not {what}: {message}") from exc
        except (requests.RequestException, OSError, ValueError) as exc:
            raise DiscoveryError(
                f"Consul at {self.address} could not {what}: {exc!r}; is the Consul agent "
                "running and is MESH_DISCOVERY right?"
            ) from exc

    async def _direct(self, fn: Callable[[], T]) -> T:
        return await self._call("answer a query", fn)

    def _with(self, fn: Callable[[consul.Consul], T]) -> Callable[[], T]:
        """``fn`` on a client of the pool, to run in a worker thread."""
        return functools.partial(self._pool.run, fn)

    def _fetch_service(
        self, key: tuple[str, str | None, bool], index: str | None, wait_s: float
    ) -> tuple[str | None, _Instances]:
        name, skill, passing = key
        # Stale: any server answers, so reads go on while the servers have no leader.
        params: list[tuple[str, str]] = [("stale", "1")]
        if index is not None:
            params += [("index", index), ("wait", go_wait(wait_s))]
        if passing:
            params.append(("passing", "1"))
        if skill is not None:
            # `tag=` is deprecated for the health endpoint; a filter on Service.Tags is not.
            params.append(("filter", f"{json.dumps(skill)} in Service.Tags"))

        def get(client: consul.Consul) -> tuple[str | None, Any]:
            return client.http.get(  # type: ignore[no-any-return]
                CB.json(index=True),
                f"/v1/health/service/{name}",
                params=params,
                headers=client.prepare_headers(),
            )

        new_index, entries = self._pool.run(get)
        found = (instance_from_entry(e) for e in entries or [])
        return new_index, tuple(i for i in found if i is not None)

    def _fetch_catalog(
        self, key: str, index: str | None, wait_s: float
    ) -> tuple[str | None, _Catalog]:
        new_index, services = self._pool.run(
            lambda client: client.catalog.services(
                index=index, wait=go_wait(wait_s), consistency="stale"
            )
        )
        # Only mesh services: the rest of the catalog (consul itself, databases...) is never
        # watched.
        return new_index, {
            str(k): [t for t in v if t != MESH_TAG]
            for k, v in (services or {}).items()
            if MESH_TAG in (v or [])
        }

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
            self._with(lambda client: client.agent.service.register(**kwargs)),
        )
        if not ok:
            raise DiscoveryError(
                f"Consul at {self.address} did not register {registration.agent!r}"
            )
        self._services.invalidate()
        self._catalog.invalidate()

    async def heartbeat(self, instance_id: str) -> None:
        """Consul's own check keeps health; this only verifies the service still exists."""
        services = await self._call(
            "list its services", self._with(lambda client: client.agent.services())
        )
        if instance_id not in (services or {}):
            raise UnknownInstance(
                f"Consul at {self.address} no longer knows instance {instance_id!r}"
            )

    async def deregister(self, instance_id: str) -> None:
        """Remove the service (and its check); an id this agent does not hold is not an error
        (a node stopping after Consul reaped it). See ``remove`` for one that must go."""
        with contextlib.suppress(UnknownInstance):
            await self.remove(instance_id)

    async def remove(self, instance_id: str) -> None:
        """Deregister the service from this agent, or ``UnknownInstance`` if this agent does not
        hold it: Consul answers 404 for a service registered through another agent, which only
        that agent can remove (the catalog's copy would come back by anti-entropy)."""
        removed = await self._call(
            f"deregister {instance_id!r}",
            self._with(lambda client: client.agent.service.deregister(instance_id)),
        )
        self._services.invalidate()
        self._catalog.invalidate()
        if not removed:
            raise UnknownInstance(
                f"the Consul agent at {self.address} does not hold instance {instance_id!r}; "
                "deregister it through the agent it registered with"
            )

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        """Instances of ``agent`` and/or offering ``skill`` (a Consul tag); passing by default.
        Without ``agent``: the services the catalog marks as mesh services (``MESH_TAG``)."""
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
        leader = await self._call(
            "say who leads its cluster", self._with(lambda client: client.status.leader())
        )
        if not leader:
            raise DiscoveryError(f"Consul at {self.address} answers but has no cluster leader")

    async def aclose(self) -> None:
        await self._services.aclose()
        await self._catalog.aclose()
        self._pool.close()
