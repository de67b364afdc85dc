"""``Prober``: the registry's liveness loop.

Every ``interval_s`` it GETs each instance's ``/health`` and combines that with the heartbeat TTL:

- no heartbeat for longer than ``ttl_s``            -> critical ("no heartbeat for 31s")
- ``/health`` unreachable (refused, timeout)        -> critical ("health check failed: ...")
- ``/health`` answers, but not 200                  -> warning  ("/health answered 503 (failing)")
- ``/health`` answers 200                           -> passing

An instance critical for longer than ``remove_after_s`` is removed. Status changes are written
(with time and reason) only when they change, and logged once each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import httpx

from mesh.discovery.base import Status
from registry.metrics import RegistryMetrics
from registry.store import InstanceRecord, RegistryStore

__all__ = ["Prober"]

log = logging.getLogger("registry.prober")


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
        metrics: RegistryMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._http = http
        self.interval_s = interval_s
        self._timeout_s = min(timeout_s, max(interval_s, 0.1))
        self._ttl_s = ttl_s
        self._remove_after_s = remove_after_s
        self._metrics = metrics
        self._clock = clock
        # Heartbeats could not arrive while the registry was down: the TTL counts from start-up.
        self._started_at = clock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="registry-prober")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad tick (disk hiccup) must not stop liveness for good
                log.exception("probe round failed")
            await asyncio.sleep(self.interval_s)

    async def tick(self) -> None:
        """One probe round over every instance."""
        instances = await self._store.instances()
        results = await asyncio.gather(*(self._check(i) for i in instances))
        now = self._clock()
        for inst, (status, reason) in zip(instances, results, strict=True):
            if status != inst.status:
                log.info(
                    "%s %s (%s): %s -> %s: %s",
                    inst.agent,
                    inst.instance_id,
                    inst.url,
                    inst.status,
                    status,
                    reason,
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
                # Same status, new detail (e.g. another 503 body): keep the reason current
                # without moving status_changed_at.
                await self._store.set_status(
                    inst.instance_id, status, reason, inst.status_changed_at
                )
        if self._metrics is not None:
            await self._export()

    async def _check(self, inst: InstanceRecord) -> tuple[Status, str]:
        now = self._clock()
        silent_for = now - max(inst.last_heartbeat_at, self._started_at)
        if silent_for > self._ttl_s:
            return "critical", f"no heartbeat for {silent_for:.0f}s (ttl {self._ttl_s:g}s)"
        try:
            response = await self._http.get(inst.url + "/health", timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            return "critical", f"health check failed: {type(exc).__name__} {exc}".strip()
        if response.status_code == 200:
            return "passing", "health ok"
        detail = ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = f" ({response.json().get('status')})"
        return "warning", f"/health answered {response.status_code}{detail}"

    async def _export(self) -> None:
        assert self._metrics is not None
        instances = await self._store.instances()
        gauge = self._metrics.instances
        gauge.clear()
        for inst in instances:
            gauge.labels(agent=inst.agent, status=inst.status).inc()
