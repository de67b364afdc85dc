"""``Database``: the node's one SQLite file, one connection, one thread.

Every store of a node (sessions, A2A tasks, idempotency keys) shares one ``Database``. All
statements run on a single dedicated thread that owns the connection, so the event loop never
blocks on disk and there is exactly one writer (SQLite's rule anyway) with no per-request
connection. WAL keeps readers from other processes (``mesh`` CLI, backups) unblocked.

Group commit: ``read`` and ``write`` calls queue up on the event loop and a flusher hands
everything queued to the database thread in one hop; the writes of that batch share one
``begin immediate ... commit`` (each in its own savepoint, so a write that raises is rolled back
alone and its caller gets the error). A ``write`` returns only after its commit, so whatever a
caller acknowledges after ``await db.write(...)`` is on disk. Under load, concurrent requests
share a commit and a thread hop instead of paying one each.

    db = await Database.open(path)
    rows = await db.read(lambda conn: conn.execute("select ...").fetchall())
    await db.write(lambda conn: conn.execute("insert ..."))   # atomic, committed on return
    await db.aclose()

Schemas: ``await db.migrate("tasks", [ddl_v1, ddl_v2])`` brings a component's tables to the
last version, recording it in ``mesh_schema``; ``ensure_schema`` runs one idempotent script.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mesh._errors import StoreError

__all__ = ["Database"]

T = TypeVar("T")

_COMPONENT = re.compile(r"[a-z_][a-z0-9_]*")

#: How long a ``write_soon`` may wait for company before it is flushed on its own.
DEFER_S = 0.005


@dataclass(slots=True)
class _Op:
    """One queued ``read`` or ``write``: run ``fn(conn)``, report to ``future``."""

    fn: Callable[[sqlite3.Connection], Any]
    write: bool
    future: asyncio.Future[Any]


# One outcome per op of a batch: (True, value) or (False, exception).
_Outcome = tuple[bool, Any]


class Database:
    #: Which SQL the connection speaks (``mesh._pg.PgDatabase``: "postgresql"; the stores
    #: write SQLite's, translated there) and the driver's error class.
    dialect = "sqlite"
    driver_error: type[Exception] = sqlite3.Error

    def __init__(self, conn: sqlite3.Connection, executor: ThreadPoolExecutor, path: str) -> None:
        self._conn = conn
        self._executor = executor
        self.path = path
        self._closed = False
        self._schemas: set[str] = set()
        self._queue: list[_Op] = []
        self._flusher: asyncio.Task[None] | None = None
        self._deferred: asyncio.TimerHandle | None = None
        #: Batches handed to the database thread and transactions committed (tests, bench).
        self.batches = 0
        self.commits = 0

    @classmethod
    async def open(cls, path: str | Path) -> Database:
        """Open (creating the file and its folder) with WAL. ``":memory:"`` works too."""
        path = str(path)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mesh-sqlite")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("pragma journal_mode=wal")
            # NORMAL is durable across process crashes in WAL mode (only an OS crash can lose
            # the last transactions), at a fraction of FULL's fsync cost.
            conn.execute("pragma synchronous=normal")
            conn.execute("pragma busy_timeout=5000")
            conn.execute("pragma foreign_keys=on")
            return conn

        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, connect)
        except sqlite3.Error as exc:
            executor.shutdown(wait=False)
            raise StoreError(f"cannot open database {path}: {exc}") from exc
        return cls(conn, executor, path)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the database thread (in the next batch)."""
        result: T = await self._enqueue(fn, write=False)
        return result

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` atomically (all of it is committed, or none) and return once it is
        committed. Writes queued together share one transaction (group commit). On PostgreSQL
        ``fn`` may run twice when another write of its batch failed, never once it has read a
        result (``mesh._pg.PgDatabase._run_batch``): what it does besides SQL before its first
        read must bear that."""
        result: T = await self._enqueue(fn, write=True)
        return result

    def write_soon(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue a ``write`` now, without waiting: it commits in queue order, so any write
        queued after it and awaited implies this one is committed too. It goes to the
        database thread with the next awaited operation, or after ``DEFER_S`` at most. The
        future reports the outcome (await it or read it, so an error is not lost)."""
        future: asyncio.Future[T] = self._enqueue(fn, write=True, defer=True)
        return future

    def _enqueue(
        self, fn: Callable[[sqlite3.Connection], Any], *, write: bool, defer: bool = False
    ) -> Any:
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Op(fn, write, future))
        if self._flusher is None:
            if not defer:
                self._start_flush()
            elif self._deferred is None:
                # Nobody waits for it: let it ride with the next awaited operation (one hop
                # for both), or go on its own shortly.
                self._deferred = loop.call_later(DEFER_S, self._start_flush)
        return future

    def _start_flush(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        if self._flusher is None and self._queue:
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush(), name="mesh-sqlite-flush"
            )

    async def _flush(self) -> None:
        """Hand everything queued to the database thread, batch after batch, until empty.
        While one batch runs, the next one accumulates: that is the group commit."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    outcomes = await loop.run_in_executor(self._executor, self._run_batch, batch)
                except asyncio.CancelledError:
                    closed = StoreError(f"database {self.path}: flush cancelled")
                    for op in batch + self._queue:
                        if not op.future.done():
                            op.future.set_exception(closed)
                    self._queue = []
                    raise
                except Exception as exc:  # the executor is gone (closing): fail the batch
                    outcomes = [(False, exc)] * len(batch)
                for op, (ok, value) in zip(batch, outcomes, strict=True):
                    if op.future.done():  # the caller was cancelled
                        continue
                    if ok:
                        op.future.set_result(value)
                    elif isinstance(value, self.driver_error):
                        op.future.set_exception(StoreError(f"database {self.path}: {value}"))
                    else:
                        op.future.set_exception(value)
        finally:
            self._flusher = None

    def _run_batch(self, batch: list[_Op]) -> list[_Outcome]:
        """On the database thread: the batch's reads and writes in order, writes in one
        transaction, each write in a savepoint."""
        conn = self._conn
        self.batches += 1
        writes = any(op.write for op in batch)
        if writes:
            try:
                conn.execute("begin immediate")
            except self.driver_error as exc:
                return [(False, exc)] * len(batch)
        outcomes: list[_Outcome] = []
        for op in batch:
            if not op.write:
                try:
                    outcomes.append((True, op.fn(conn)))
                except Exception as exc:
                    outcomes.append((False, exc))
                continue
            conn.execute("savepoint op")
            try:
                value = op.fn(conn)
                # In the try: on PostgreSQL the write's statements may still be in flight,
                # and their error is raised here (mesh._pg.PgConnection).
                conn.execute("release op")
            except Exception as exc:
                conn.execute("rollback to op")
                conn.execute("release op")
                outcomes.append((False, exc))
                continue
            outcomes.append((True, value))
        if writes:
            try:
                conn.execute("commit")
                self.commits += 1
            except self.driver_error as exc:
                if conn.in_transaction:
                    conn.execute("rollback")
                return [
                    (False, exc) if op.write else o for op, o in zip(batch, outcomes, strict=True)
                ]
        return outcomes

    async def migrate(self, component: str, steps: Sequence[str]) -> int:
        """Bring ``component``'s tables to version ``len(steps)``: run each SQL script of
        ``steps`` past the version recorded in table ``mesh_schema`` (0 when none), each in its
        own transaction with the new version, so a crash leaves the file at one version or the
        next. Version 1 is a component's first DDL (written ``if not exists``: files made before
        migrations existed have its tables but no version). Once per process and component.
        Returns the version. A file from a newer mesh (a version past ``steps``) is refused:
        its tables may not mean what this code thinks."""
        if component in self._schemas:
            return len(steps)

        def run(conn: sqlite3.Connection) -> int:
            conn.execute(
                "create table if not exists mesh_schema "
                "(component text primary key, version integer not null) without rowid"
            )
            row = conn.execute(
                "select version from mesh_schema where component = ?", (component,)
            ).fetchone()
            version = 0 if row is None else int(row[0])
            if version > len(steps):
                raise StoreError(
                    f"database {self.path}: its '{component}' tables are at version {version}, "
                    f"newer than this mesh knows ({len(steps)}): upgrade mesh, or use another "
                    "data dir"
                )
            for number, script in enumerate(steps[version:], start=version + 1):
                # executescript commits what is open first; the script's own transaction makes
                # the step and its version one commit.
                try:
                    conn.executescript(
                        f"begin immediate;\n{script}\n;"
                        "insert into mesh_schema (component, version) "
                        f"values ('{component}', {number}) "
                        "on conflict (component) do update set version = excluded.version;\n"
                        "commit;"
                    )
                except sqlite3.Error:
                    if conn.in_transaction:
                        conn.execute("rollback")
                    raise
            return len(steps)

        if not _COMPONENT.fullmatch(component):  # it is written into the script
            raise ValueError(f"component name {component!r}: use [a-z_][a-z0-9_]*")
        version = await self._submit(run)
        self._schemas.add(component)
        return version

    async def ensure_schema(self, name: str, script: str) -> None:
        """Create tables once per process (``script`` must be idempotent: IF NOT EXISTS)."""
        if name in self._schemas:
            return
        await self._submit(lambda conn: conn.executescript(script))
        self._schemas.add(name)

    async def _submit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn)
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from exc

    async def ping(self) -> None:
        """Cheap health check: raises ``StoreError`` when the file cannot be read."""
        await self._submit(lambda conn: conn.execute("select 1").fetchone())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._start_flush()
        if self._flusher is not None:  # let queued writes commit
            await asyncio.shield(self._flusher)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._conn.close)
        self._closed = True
        self._executor.shutdown(wait=True)
