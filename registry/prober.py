"""``Prober``: the registry's liveness loop.

Every ``interval_s`` it GETs each instance's ``/health`` and combines that with the heartbeat TTL:

- no heartbeat for longer than ``ttl_s``            -> critical ("no heartbeat for 31s (ttl 30s)")
- ``/health`` refused or too large                  -> critical ("health check failed: unreachable")
- ``/health`` too slow (no whole answer in time)    -> unknown: status kept (below)
- ``/health`` answers, but not 200                  -> warning  ("/health answered 503")
- ``/health`` answers 200                           -> passing  ("health ok")
- ``/health`` names another ``instance_id``         -> removed at once: a ghost (below)

The probe asks ``/health?stats=1``: a mesh node adds its window stats to the answer (calls,
errors and latency per edge, tokens, breakers; ``mesh._stats``), which go to ``Traffic`` for the
console's topology and agent views. One request per instance per interval serves both; any
other server ignores the query.

Registered URLs are chosen by whoever registers, so a probe is one ``get_once`` (a
``bounded_get`` on a connection of its own): the whole answer within the probe timeout and
``MAX_HEALTH_BYTES``, or a failure. Each probe's result is
applied as soon as that probe ends, so one instance answering at a byte a second delays nobody
else's status change. Status reasons are fixed texts made by the registry (they are published
on the page and the API): nothing of an answer is repeated but its status code.

A round probes at most ``budget`` instances (``PROBES_PER_ROUND``): with more, they take turns
(each is probed every ceil(instances / budget) rounds), while every instance past its TTL is
found critical in every round (no request needed) and every instance whose heartbeats are late
(a third of the TTL) is probed first. Heartbeats are the primary signal; a killed node is
critical within a round of being late (its port refused), within one TTL at worst.

At most ``concurrency`` probes run at once (``MAX_CONCURRENT_PROBES``, below the client's
``max_connections``): the rest wait their turn here, where waiting is cheap, not in the HTTP
pool, whose bookkeeping costs each arrival a pass over every queued request and connection (a
thousand queued probes froze the registry's event loop for seconds) and where a queued probe
would use up its deadline before it connects. The probe timeout counts from a probe's start, so
waiting never makes an instance critical; with more than ``concurrency`` instances that answer
slowly a round lasts longer (a wave of probe timeouts per ``concurrency`` of them).

A node's ``/health`` names its ``instance_id``. A record whose URL answers with ANOTHER id is a
ghost: the process it named is gone and another one (a restart, or another agent) serves that
URL now. It is removed at once, with one log line, never shown as passing. (A registration at
the same URL supersedes it too, see ``registry.store``; this catches the ghosts no registration
replaces, e.g. rows kept in ``registry.db`` across a registry restart.)

An instance critical for longer than ``remove_after_s`` is removed. Status changes are written
(with time and reason) only when they change, and logged once each.

The registry never blames an instance for its own overload (issue 21). Heartbeats are the primary
signal; a probe is secondary:

- A probe that runs out of time (the deadline, a connect or pool timeout) is **unknown**: it is
  only made while the instance's heartbeats are fresh (registered or heartbeating within the
  TTL), and the registry cannot tell its own slowness (a busy event loop, a full pool) from the
  instance's. Its status stays as it was; the round counts it (``unknown``), and so does
  ``mesh_registry_probes_total{outcome}``. A dead process still turns critical: its port
  refuses at once ("unreachable"); a hung one or a host that vanished stops heartbeating, so it
  is critical within one TTL ("no heartbeat").
- The registry is **behind** when its event loop runs late by more than ``LAG_LIMIT_S`` (then
  requests, heartbeats among them, wait in its queue), when the loop is saturated (its thread
  on the CPU, or waiting for it, ``BUSY_LIMIT`` of the last ``BUSY_WINDOW_S``: then work waits
  outside, in the clients' connections and the kernel's queues, where the loop cannot see it
  run late), or when a probe round takes longer than the interval. It says so in its ``/health`` (``behind``, ``why_behind``) and ``/metrics``
  (``mesh_registry_behind``). While its loop is late it demotes nobody, on a probe or on a
  missed TTL (``deferred`` in the round), until ``_LAG_HOLD_S`` after the last late sample.
  Rounds that merely overrun still give each probe its whole deadline (it counts once a slot is
  free), so their verdicts stand: instances are probed less often, not judged worse. While
  the loop is saturated, heartbeats wait in the clients' connections, so a missed TTL may be
  the registry's: it is a demotion only once the instance has been silent for
  ``SATURATED_TTLS`` TTLs (deferred before), so a registry that stays saturated still finds
  its dead, later. (At 10,000 instances on a starved registry, 7,295 demotions of live instances
  were all for a missed TTL, 7,229 of them silent under two TTLs.) Probe verdicts stand as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from mesh._discovery.base import Status
from mesh._outbound import FetchFailed, get_once
from registry.metrics import RegistryMetrics
from registry.store import InstanceRecord, RegistryStore
from registry.traffic import Traffic

__all__ = [
    "HEALTH_PATH",
    "MAX_CONCURRENT_PROBES",
    "MAX_HEALTH_BYTES",
    "PROBES_PER_ROUND",
    "Prober",
    "RoundInfo",
    "answered_as",
]

log = logging.getLogger("registry.prober")

# A node's /health is a few hundred bytes, with its stats a few KiB (edges are bounded);
# anything far bigger is not one.
MAX_HEALTH_BYTES = 64 * 1024
# What the probe asks: /health, and a mesh node's window stats with it.
HEALTH_PATH = "/health?stats=1"
# Each probe on a connection of its own (``mesh._outbound.get_once``), asking
# ``Connection: close``. Measured at 1,000 instances (tests/bench/probe_connections.py,
# docs/performance.md): half the registry's CPU per probe of the shared keep-alive pool when
# the instances share a host:port, and about the same when each has its own (the pool keeps 20
# connections alive, so it opens new ones anyway). A pool per host reuses its connection only
# if its host is probed again within the keep-alive (5 s), which past the probe budget it is not.
# get_once makes that connection with h11 on asyncio streams, not through httpx's pool.
# Probes in flight at once; the registry's client has room for card fetches beside them.
MAX_CONCURRENT_PROBES = 64
# Probes per round at most (``--probe-budget``). A probe costs the registry ~0.4 ms of CPU
# (~1 ms through httpx), so 10,000 probes every 5 s would take most of a core: past the budget,
# instances are probed in turn, each every ceil(instances / budget) rounds, and heartbeats
# cover the rest.
PROBES_PER_ROUND = 1000

# FetchFailed's fixed reason words, as the status reason says them.
_FAILED = {
    "unreachable": "unreachable",
    "timeout": "no whole answer in time",
    "too_large": f"answer over {MAX_HEALTH_BYTES} bytes",
    "refused": "address outside the allowed networks",
    "tls": "TLS verification failed (its certificate is not from MESH_TLS_CA's CAs)",
}


# The event loop running this late (seconds) means requests wait in the registry's own queue.
LAG_LIMIT_S = 0.5
# How often the loop's lateness is sampled, and how long one late sample keeps the registry behind.
_LAG_SAMPLE_S = 0.1
_LAG_HOLD_S = 10.0

# The loop's thread never idle (running, or runnable and waiting for a CPU) this share of the last
# BUSY_WINDOW_S seconds: the registry is saturated, and requests wait for it outside.
BUSY_LIMIT = 0.9
BUSY_WINDOW_S = 3.0
# While saturated, an instance is critical for a missed TTL only once silent this many TTLs.
SATURATED_TTLS = 2


def _demand_clock() -> Callable[[], float]:
    """Seconds the calling thread has been running or runnable (Linux's schedstat: time on a
    CPU plus time waiting in the run queue), so a registry starved by a busy machine counts
    as busy too; elsewhere its CPU time alone."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"

    def schedstat() -> float:
        with open(path, "rb") as f:
            on_cpu, waiting = f.read().split()[:2]
        return (int(on_cpu) + int(waiting)) / 1e9

    try:
        schedstat()
    except (OSError, ValueError):
        return time.thread_time
    return schedstat


# Probes started together when a round is spread over the interval.
_GROUP = 16

_RANK: dict[str, int] = {"passing": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class _Observation:
    status: Status
    reason: str
    # The instance id the answer names, when it names one.
    answered_as: str | None = None
    # Why a fetch failed, for the registry's own log (never published).
    detail: str = ""
    # The answer, parsed, when it was a JSON object that carries stats (for ``Traffic``).
    body: dict[str, Any] | None = None
    answered: bool = False
    # The probe ran out of time with the heartbeats fresh: nothing is known (status kept).
    unknown: bool = False
    # Seconds without a heartbeat, when that is the verdict (a missed TTL).
    silent_s: float = 0.0


@dataclass
class RoundInfo:
    """The last probe round, for the registry's /introspect."""

    rounds: int = 0
    started_at: float = 0.0
    duration_s: float = 0.0
    instances: int = 0
    # Instances probed (the rest waited their turn: see ``PROBES_PER_ROUND``).
    probed: int = 0
    failed: int = 0
    # Probes that ran out of time while heartbeats were fresh (status kept).
    unknown: int = 0
    # Demotions not made because the registry was behind.
    deferred: int = 0


def _parsed(body: bytes) -> dict[str, Any] | None:
    if b'"instance_id"' not in body:  # most answers of other servers: no parse needed
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _named(data: dict[str, Any] | None) -> str | None:
    value = data.get("instance_id") if data is not None else None
    return value if isinstance(value, str) and value else None


def answered_as(body: bytes) -> str | None:
    """The ``instance_id`` a ``/health`` answer names, if it names one (mesh nodes do)."""
    return _named(_parsed(body))


class Prober:
    def __init__(
        self,
        store: RegistryStore,
        http: httpx.AsyncClient,
        *,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        ttl_s: float = 30.0,
        remove_after_s: float = 300.0,
        concurrency: int = MAX_CONCURRENT_PROBES,
        budget: int = PROBES_PER_ROUND,
        warn_at: int | None = None,
        holds: int = 0,
        metrics: RegistryMetrics | None = None,
        traffic: Traffic | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._http = http
        self.interval_s = interval_s
        self._timeout_s = min(timeout_s, max(interval_s, 0.1))
        self._ttl_s = ttl_s
        self._remove_after_s = remove_after_s
        self._slots = asyncio.Semaphore(concurrency)
        self._metrics = metrics
        self.concurrency = concurrency
        self.traffic = traffic or Traffic(clock=clock)
        self.last_round = RoundInfo()
        self._clock = clock
        # Heartbeats could not arrive while the registry was down: the TTL counts from start-up.
        self._started_at = clock()
        self._task: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        # The loop's last lateness, and the last time (monotonic) it was over LAG_LIMIT_S.
        self.loop_lag_s = 0.0
        self._late_at = -_LAG_HOLD_S
        self._late_s = 0.0
        # The loop's share of time busy over the last BUSY_WINDOW_S (``_watch_lag``).
        self.loop_busy = 0.0
        self._round_started: float | None = None
        self._round_unknown = 0
        self._round_deferred = 0
        # Said once as the instances reach warn_at, again only after they fell well below.
        self._warn_at, self._holds = warn_at, holds
        # Probes per round at most, and where the next round's turn starts.
        self._budget = budget
        self._cursor = 0
        self._size_warned = False

    def behind(self) -> list[str]:
        """Why the registry is behind (empty when it is not): its own overload, said in its
        ``/health`` and ``/metrics``; no probe demotes anyone meanwhile."""
        now = time.monotonic()
        why = []
        if now - self._late_at < _LAG_HOLD_S:
            why.append(
                f"event loop {self._late_s:.1f}s late (over {LAG_LIMIT_S:g}s): requests, "
                "heartbeats among them, wait in the registry's queue"
            )
        running = now - self._round_started if self._round_started is not None else 0.0
        overrun = max(running, self.last_round.duration_s)
        if self.loop_busy >= BUSY_LIMIT:
            why.append(
                f"event loop busy {self.loop_busy:.0%} of the last {BUSY_WINDOW_S:g}s: "
                "requests, heartbeats among them, wait for it in their connections (more "
                "instances than one process keeps up with: see docs/performance.md)"
            )
        if overrun > self.interval_s:
            why.append(
                f"a probe round takes {overrun:.1f}s, over the {self.interval_s:g}s interval"
            )
        return why

    def _stretched(self, seen: _Observation) -> bool:
        """A missed TTL the registry may have caused: its loop saturated (heartbeats wait in
        its clients' connections), the instance silent for less than ``SATURATED_TTLS`` TTLs.
        Past that it is demoted all the same, so a registry that stays saturated still finds
        its dead, within that many TTLs."""
        return 0.0 < seen.silent_s <= SATURATED_TTLS * self._ttl_s and self.loop_busy >= BUSY_LIMIT

    def _loop_late(self) -> bool:
        return time.monotonic() - self._late_at < _LAG_HOLD_S

    async def _watch_lag(self) -> None:
        demand = _demand_clock()  # of this thread: the event loop's
        samples: deque[tuple[float, float]] = deque()
        while True:
            before = time.monotonic()
            await asyncio.sleep(_LAG_SAMPLE_S)
            now = time.monotonic()
            self.loop_lag_s = max(0.0, now - before - _LAG_SAMPLE_S)
            samples.append((now, demand()))
            while now - samples[0][0] > BUSY_WINDOW_S:
                samples.popleft()
            (t0, d0), (t1, d1) = samples[0], samples[-1]
            # Only over (most of) a whole window: one busy moment is not saturation.
            spanned = t1 - t0 >= 0.9 * BUSY_WINDOW_S
            self.loop_busy = (d1 - d0) / (t1 - t0) if spanned else 0.0
            if self.loop_lag_s > LAG_LIMIT_S:
                self._late_at, self._late_s = time.monotonic(), self.loop_lag_s
            if self._metrics is not None:
                self._metrics.loop_lag.set(round(self.loop_lag_s, 4))
                self._metrics.behind.set(1 if self.behind() else 0)

    async def start(self) -> None:
        """Run one round now (bounded), so what a restarted registry serves from its store is
        checked before it is served, then keep probing in the background."""
        if self._task is not None:
            return
        self._lag_task = asyncio.create_task(self._watch_lag(), name="registry-loop-lag")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._timeout_s + 1.0):
                await self._round(spread_s=0.0)
        self._task = asyncio.create_task(self._loop(), name="registry-prober")

    async def aclose(self) -> None:
        for task in (self._task, self._lag_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._lag_task = None

    async def _loop(self) -> None:
        # A round starts an interval after the last one started, its probes spread over the
        # first half of it (no burst every interval); one that overran is followed by half an
        # interval of rest, so an overloaded registry is not probing back to back.
        started = time.monotonic()
        while True:
            rest = max(started + self.interval_s - time.monotonic(), self.interval_s / 2)
            await asyncio.sleep(rest)
            started = time.monotonic()
            await self._round(spread_s=self.interval_s / 2)

    async def _round(self, *, spread_s: float) -> None:
        try:
            await self.tick(spread_s=spread_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # one bad tick (disk hiccup) must not stop liveness for good
            log.exception("probe round failed")

    async def tick(self, *, spread_s: float = 0.0) -> None:
        """One probe round over every instance, the probes started evenly over ``spread_s``;
        each result is applied as its probe ends."""
        started, clock0 = self._clock(), time.perf_counter()
        self._round_started = time.monotonic()
        self._round_unknown = self._round_deferred = 0
        try:
            instances = await self._store.instances()
            todo = self._this_round(instances)
            # Started in groups, a pause between them: thousands of timers cost more than this.
            pause = spread_s * _GROUP / len(todo) if todo else 0.0
            async with asyncio.TaskGroup() as group:
                tasks = []
                for k, inst in enumerate(todo):
                    if pause and k and k % _GROUP == 0:
                        await asyncio.sleep(pause)
                    tasks.append(group.create_task(self._probe(inst)))
            seen = [task.result() for task in tasks]
        finally:
            self._round_started = None
        self.traffic.keep(instances)
        self._warn_size(len(instances))
        self.last_round = RoundInfo(
            rounds=self.last_round.rounds + 1,
            started_at=started,
            duration_s=round(time.perf_counter() - clock0, 4),
            instances=len(instances),
            probed=sum(1 for inst in todo if not self._silent(inst)),
            failed=sum(1 for answered in seen if not answered),
            unknown=self._round_unknown,
            deferred=self._round_deferred,
        )
        if self._metrics is not None:
            self._metrics.probe_round.set(self.last_round.duration_s)
            self._metrics.behind.set(1 if self.behind() else 0)
            await self._export()

    def _quiet_s(self, inst: InstanceRecord) -> float:
        """Seconds since its last heartbeat (or since start-up: none could arrive before)."""
        return self._clock() - max(inst.last_heartbeat_at, self._started_at)

    def _silent(self, inst: InstanceRecord) -> bool:
        return self._quiet_s(inst) > self._ttl_s

    def _late(self, inst: InstanceRecord) -> bool:
        """Its heartbeats overdue by a third of the TTL (two missed at a node's default
        interval): probed in the next round, not when its turn comes."""
        return self._quiet_s(inst) > self._ttl_s / 3

    def _this_round(self, instances: list[InstanceRecord]) -> list[InstanceRecord]:
        """Every instance past its TTL (no request: it is critical) and at most ``budget``
        others: the late ones first (oldest heartbeat first), then the rest in turn. With more
        instances than the budget, each is probed every few rounds and its heartbeats (the
        primary signal) speak for it in between; one that stops heartbeating is probed within
        a round of being late, so a killed node (its port refused) is critical well within one
        TTL, where waiting for its turn took up to ceil(instances / budget) rounds past it."""
        fresh = [inst for inst in instances if not self._silent(inst)]
        if len(fresh) <= self._budget:
            return instances
        late = sorted((i for i in fresh if self._late(i)), key=lambda i: i.last_heartbeat_at)
        late = late[: self._budget]
        chosen = {inst.instance_id for inst in late}
        rest = sorted(
            (i for i in fresh if i.instance_id not in chosen), key=lambda i: i.instance_id
        )
        room = self._budget - len(late)
        if rest and room:
            start = self._cursor % len(rest)
            chosen.update(i.instance_id for i in (rest[start:] + rest[:start])[:room])
            self._cursor = start + room
        return [i for i in instances if i.instance_id in chosen or self._silent(i)]

    def _warn_size(self, count: int) -> None:
        if self._warn_at is None:
            return
        if count >= self._warn_at and not self._size_warned:
            self._size_warned = True
            log.warning(
                "%d instances: near the %d this registry should hold (the lower of "
                "--max-instances and what one process keeps up with at the default intervals); "
                "a bigger mesh belongs on Consul (mesh registry --backend consul://HOST:8500, "
                "see docs/production.md)",
                count,
                self._holds,
            )
        elif count < 0.9 * self._warn_at:
            self._size_warned = False

    async def _probe(self, inst: InstanceRecord) -> bool:
        """Probe ``inst`` and apply what was seen; whether it answered."""
        seen = await self._check(inst)
        if seen.answered_as is not None and seen.answered_as != inst.instance_id:
            log.warning(
                "removing %s %s (%s): a ghost, that URL answers as instance %r now",
                inst.agent,
                inst.instance_id,
                inst.url,
                seen.answered_as[:100],
            )
            await self._store.remove(inst.instance_id)
            return True
        if seen.answered:
            self.traffic.observe(inst, seen.body)
        await self._apply(inst, seen)
        return seen.answered

    async def _apply(self, inst: InstanceRecord, seen: _Observation) -> None:
        now = self._clock()
        status, reason = seen.status, seen.reason
        outcome = "unknown" if seen.unknown else status
        if self._metrics is not None:
            self._metrics.probes.labels(outcome=outcome).inc()
        if seen.unknown:
            self._round_unknown += 1
            return
        if _RANK[status] > _RANK[inst.status] and (self._loop_late() or self._stretched(seen)):
            # Neither a probe's verdict nor a missed TTL can be told from the registry's delay.
            self._round_deferred += 1
            return
        if status != inst.status:
            log.info(
                "%s %s (%s): %s -> %s: %s%s",
                inst.agent,
                inst.instance_id,
                inst.url,
                inst.status,
                status,
                reason,
                f" ({seen.detail})" if seen.detail else "",
            )
            await self._store.set_status(inst.instance_id, status, reason, now)
        elif status == "critical" and now - inst.status_changed_at > self._remove_after_s:
            log.warning(
                "removing %s %s (%s): critical for more than %.0fs (%s)",
                inst.agent,
                inst.instance_id,
                inst.url,
                self._remove_after_s,
                reason,
            )
            await self._store.remove(inst.instance_id)
        elif reason != inst.status_reason and status != "critical":
            # Same status, another code (503 -> 500): keep the reason current without moving
            # status_changed_at.
            await self._store.set_status(inst.instance_id, status, reason, inst.status_changed_at)

    async def _check(self, inst: InstanceRecord) -> _Observation:
        silent_for = self._quiet_s(inst)
        if silent_for > self._ttl_s:
            return _Observation(
                "critical",
                f"no heartbeat for {silent_for:.0f}s (ttl {self._ttl_s:g}s)",
                silent_s=silent_for,
            )
        try:
            async with self._slots:
                answer = await get_once(
                    self._http,
                    inst.url + HEALTH_PATH,
                    max_bytes=MAX_HEALTH_BYTES,
                    timeout_s=self._timeout_s,
                )
        except FetchFailed as exc:
            reason = f"health check failed: {_FAILED.get(exc.reason, 'unreachable')}"
            # Out of time (the deadline, or a connect or pool timeout) with fresh heartbeats:
            # the registry's own slowness looks the same from here. A refusal is the instance's.
            timed_out = exc.reason == "timeout" or isinstance(exc.__cause__, httpx.TimeoutException)
            return _Observation("critical", reason, unknown=timed_out, detail=exc.detail)
        body = _parsed(answer.content)
        who = _named(body)
        if answer.status_code == 200:
            return _Observation("passing", "health ok", who, body=body, answered=True)
        reason = f"/health answered {answer.status_code}"
        return _Observation("warning", reason, who, body=body, answered=True)

    async def _export(self) -> None:
        assert self._metrics is not None
        instances = await self._store.instances()
        gauge = self._metrics.instances
        gauge.clear()
        for inst in instances:
            gauge.labels(agent=inst.agent, status=inst.status).inc()
