"""Retention: how long ``node.db`` keeps what is over (docs/node.md, "Retention").

Without it a node's database grows forever: every terminal task (with its idempotency keys, push
configs and trace row) and every session stays. ``Sweeper`` runs in the node's lifespan and,
every ``RetentionPolicy.interval_s``, deletes

* terminal tasks (COMPLETED, FAILED, CANCELED, REJECTED) whose status is older than
  ``tasks_for_s``, then the oldest beyond ``tasks_max``, each with what belongs only to it: the
  idempotency keys of the messages in its history, its push configs and queued deliveries, its
  resume point (normally gone when it ended) and, on PostgreSQL, its runner row; the task's row
  is its trace row. A task running or waiting for input is never touched, nor one whose push
  notification is still queued and not yet given up (a delivery left past its expiry goes);
* sessions not updated for ``sessions_for_s``, with their events, except a session whose turn
  runs here now (``SessionLocks``) or whose context has a task that is not terminal or waiting
  on a resume point.

Each batch (``BATCH`` rows at most) is one short write through the ``Database`` queue, so the
requests' writes commit between them; a sweep never holds the database for long. A repeated
message whose task was deleted is a new message: it runs again (docs/node.md).

On SQLite the freed pages go to the file's freelist and new rows reuse them: the file stops
growing at its high-water mark but does not shrink. A file created with
``pragma auto_vacuum = incremental`` gets its free pages back to the filesystem after each
sweep (``pragma incremental_vacuum``); measured in docs/performance.md, "On disk".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.push_configs import PushConfigStore, delete_configs_of
from mesh._a2a.store import Ended, SqliteTaskStore, open_contexts
from mesh._sessions.sqlite import SqliteSessionStore, UserCursor
from mesh._sqlite import Database

if TYPE_CHECKING:
    from collections.abc import Callable

    from mesh._settings import NodeSettings

__all__ = ["BATCH", "RetentionPolicy", "SweepReport", "Sweeper"]

log = logging.getLogger("mesh.retention")

#: Rows one write deletes at most (tasks or sessions): a few milliseconds of the database.
BATCH = 200
#: Batches one sweep runs at most per kind; what is left waits for the next sweep.
MAX_BATCHES = 500
#: Free pages one write gives back to the filesystem (auto_vacuum=incremental; ~10 us each).
VACUUM_PAGES = 512
#: Deleted-row kinds (the metric's label values).
KINDS = ("tasks", "message_keys", "push_configs", "sessions")


@dataclass(frozen=True)
class RetentionPolicy:
    """What a node keeps: terminal tasks for ``tasks_for_s`` seconds and at most ``tasks_max``
    of them, sessions idle for at most ``sessions_for_s``; None turns a limit off. Swept every
    ``interval_s`` seconds, ``batch`` rows per write."""

    tasks_for_s: float | None = 7 * 86400.0
    tasks_max: int | None = 100_000
    sessions_for_s: float | None = 30 * 86400.0
    interval_s: float = 60.0
    batch: int = BATCH

    @classmethod
    def from_settings(cls, settings: NodeSettings) -> RetentionPolicy:
        return cls(
            tasks_for_s=settings.retain_tasks_for_s,
            tasks_max=settings.retain_tasks_max,
            sessions_for_s=settings.retain_sessions_for_s,
            interval_s=settings.retention_interval_s,
        )

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.tasks_for_s, self.tasks_max, self.sessions_for_s))

    def describe(self) -> dict[str, Any]:
        """The policy as /introspect shows it."""
        return {
            "tasks_for_s": self.tasks_for_s,
            "tasks_max": self.tasks_max,
            "sessions_for_s": self.sessions_for_s,
            "interval_s": self.interval_s,
        }


@dataclass
class SweepReport:
    """One sweep: rows deleted by kind, writes, how long it took, when it ended."""

    deleted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    batches: int = 0
    seconds: float = 0.0
    ended_at: float = 0.0
    #: SQLite: pages returned to the filesystem (a file made with auto_vacuum=incremental).
    vacuumed_pages: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "deleted": dict(self.deleted),
            "batches": self.batches,
            "seconds": round(self.seconds, 4),
            "ended_at": self.ended_at,
            "vacuumed_pages": self.vacuumed_pages,
        }


class _Metrics:
    def __init__(self, registry: CollectorRegistry, agent: str) -> None:
        deleted = Counter(
            "mesh_retention_deleted_total",
            "Rows retention deleted from the node's database, by kind.",
            ["agent", "kind"],
            registry=registry,
        )
        self.deleted = {kind: deleted.labels(agent, kind) for kind in KINDS}
        self.seconds = Gauge(
            "mesh_retention_last_sweep_seconds",
            "How long the last retention sweep took (its batches and the waits between them).",
            ["agent"],
            registry=registry,
        ).labels(agent)


class Sweeper:
    """Applies ``policy`` to a node's database: ``sweep()`` once, or ``start()`` every
    ``policy.interval_s`` until ``aclose()``. ``tasks`` None: the node keeps no tasks
    (store=memory); ``sessions`` None: no sessions (no LLM). ``in_use(user, session)``: a turn
    of that session runs in this process (``SessionLocks.busy``)."""

    def __init__(
        self,
        policy: RetentionPolicy,
        db: Database,
        *,
        tasks: SqliteTaskStore | None = None,
        sessions: SqliteSessionStore | None = None,
        in_use: Callable[[str, str], bool] | None = None,
        registry: CollectorRegistry | None = None,
        agent: str = "",
        pause_s: float = 0.0,
    ) -> None:
        self.policy = policy
        self._db = db
        self._tasks = tasks
        self._sessions = sessions
        self._in_use = in_use
        self._pause_s = pause_s
        self._metrics = _Metrics(registry, agent) if registry is not None else None
        self._task: asyncio.Task[None] | None = None
        #: The last sweep that ran to its end (None before the first).
        self.last: SweepReport | None = None
        #: Sweeps ended (tests wait on it).
        self.sweeps = 0

    def describe(self) -> dict[str, Any]:
        """The policy and the last sweep, for /introspect."""
        return {
            **self.policy.describe(),
            "enabled": self.policy.enabled,
            "last_sweep": None if self.last is None else self.last.describe(),
        }

    # -- one sweep ------------------------------------------------------------------------
    async def sweep(self) -> SweepReport:
        """Delete what the policy no longer keeps, batch after batch, on the database's thread
        (a batch of deletes, or of vacuumed pages, takes milliseconds: not on the event loop)."""
        with self._db.on_thread():
            return await self._sweep()

    async def _sweep(self) -> SweepReport:
        report = SweepReport()
        started = time.perf_counter()
        if self._tasks is not None:
            await self._sweep_tasks(self._tasks, report)
        if self._sessions is not None and self.policy.sessions_for_s is not None:
            await self._sweep_sessions(self._sessions, self.policy.sessions_for_s, report)
        report.vacuumed_pages = await self._vacuum()
        report.seconds = time.perf_counter() - started
        report.ended_at = time.time()
        self.last = report
        self.sweeps += 1
        if self._metrics is not None:
            self._metrics.seconds.set(report.seconds)
        if any(report.deleted.values()):
            log.info(
                "retention: deleted %s in %d write(s), %.3f s",
                ", ".join(f"{n} {k}" for k, n in report.deleted.items() if n),
                report.batches,
                report.seconds,
            )
        return report

    def _count(self, report: SweepReport, kind: str, n: int) -> None:
        report.deleted[kind] += n
        if self._metrics is not None and n:
            self._metrics.deleted[kind].inc(n)

    async def _between(self) -> None:
        # Whatever requests queued meanwhile goes to the database before the next batch.
        await asyncio.sleep(self._pause_s)

    async def _sweep_tasks(self, store: SqliteTaskStore, report: SweepReport) -> None:
        policy = self.policy
        await PushConfigStore(self._db).initialize()  # its tables (once per process)

        def belongings(conn: sqlite3.Connection, deleted: Ended) -> None:
            keys = IdempotencyKeys.release_ended(conn, deleted)
            configs = delete_configs_of(conn, [(owner, t.id) for owner, t in deleted])
            self._count(report, "message_keys", keys)
            self._count(report, "push_configs", configs)

        async def batches(before_ns: int | None, budget: int) -> None:
            for _ in range(MAX_BATCHES):
                if budget <= 0:
                    return
                limit = min(policy.batch, budget)
                deleted = await store.delete_ended(before_ns, limit, belongings)
                report.batches += 1
                self._count(report, "tasks", len(deleted))
                budget -= len(deleted)
                if len(deleted) < limit:
                    return
                await self._between()

        if policy.tasks_for_s is not None:
            before_ns = time.time_ns() - int(policy.tasks_for_s * 1e9)
            await batches(before_ns, 2**62)
        if policy.tasks_max is not None:
            excess = await store.count_ended() - policy.tasks_max
            await batches(None, excess)

    async def _sweep_sessions(
        self, store: SqliteSessionStore, idle_s: float, report: SweepReport
    ) -> None:
        in_use = self._in_use
        tasks = self._tasks

        def keep(conn: sqlite3.Connection, found: list[tuple[str, str]]) -> set[tuple[str, str]]:
            kept = {k for k in found if in_use is not None and in_use(*k)}
            if tasks is not None:  # a session id is its A2A context id
                busy = open_contexts(conn, sorted({sid for _, sid in found}))
                kept.update(k for k in found if k[1] in busy)
            return kept

        before = time.time() - idle_s
        cursor: UserCursor | None = None
        for _ in range(MAX_BATCHES):
            deleted, after = await store.delete_idle(before, self.policy.batch, keep, cursor)
            report.batches += 1
            self._count(report, "sessions", deleted)
            if after is None or (deleted == 0 and after == cursor):
                return  # past the last user, or only sessions in use left where it stands
            cursor = after
            await self._between()

    async def _vacuum(self) -> int:
        """SQLite with auto_vacuum=incremental: give free pages back, ``VACUUM_PAGES`` per
        write (a few milliseconds each)."""
        if self._db.dialect != "sqlite":
            return 0

        def run(conn: sqlite3.Connection) -> int:
            if conn.execute("pragma auto_vacuum").fetchone()[0] != 2:
                return 0
            free = int(conn.execute("pragma freelist_count").fetchone()[0])
            # Python's sqlite3 steps a pragma once, and one step of incremental_vacuum frees
            # one page: one page per statement.
            for _ in range(min(free, VACUUM_PAGES)):
                conn.execute("pragma incremental_vacuum(1)")
            return free - int(conn.execute("pragma freelist_count").fetchone()[0])

        total = 0
        for _ in range(MAX_BATCHES):
            freed = await self._db.write(run)
            total += freed
            if freed < VACUUM_PAGES:
                return total
            await self._between()
        return total

    # -- in the lifespan ------------------------------------------------------------------
    def start(self) -> None:
        """Sweep now and every ``interval_s`` in a background task (nothing when the policy
        is all off)."""
        if self.policy.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._forever(), name="mesh-retention"
            )

    async def _forever(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # the database away for a moment: next round
                log.warning("retention sweep failed: %s", exc)
            await asyncio.sleep(self.policy.interval_s)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
