"""``Database``: the node's one SQLite file, one connection, committed from the event loop.

Every store of a node (sessions, A2A tasks, idempotency keys) shares one ``Database``: one
connection, so one writer (SQLite's rule anyway) and no per-request connection. WAL keeps
readers from other processes (``mesh`` CLI, backups) unblocked.

Group commit: ``read`` and ``write`` calls queue up on the event loop and are run together as
one batch; the writes of a batch share one ``begin immediate ... commit`` (each in its own
savepoint, so a write that raises is rolled back alone and its caller gets the error). A
``write`` returns only after its commit, so whatever a caller acknowledges after
``await db.write(...)`` is on disk. A node serving one request at a time has no company for
its writes: after ``ALONE_AFTER`` batches in a row of one write each, ``write_now`` commits a
write where it is asked, without the queue's future and turn of the loop (the task store's
awaited saves), and every ``PROBE_EVERY``-th goes through the queue again to find company.

Where a batch runs: on the event loop's own thread, when that cannot stall it. A batch is a few
statements and, with ``synchronous=normal`` in WAL, a commit is a write to the WAL file without
fsync: ~0.1 ms, less than handing it to a thread and back (executor queue, futex wake, the GIL
handed over twice, the loop's self-pipe: ~0.3 ms of CPU a request, docs/performance.md "The
database thread"). What may block goes to the database thread (one, ``mesh-sqlite``) instead:

* a WAL checkpoint (the copy into the database file and its fsync): the connection's
  auto-checkpoint is off, and the thread checkpoints on a second connection of its own,
  ``PASSIVE`` (beside the writer) every ``CHECKPOINT_EVERY`` commits; when the writer kept the
  WAL from starting over and it passed ``WAL_RESTART_FRAMES``, the rest is copied holding the
  connection (the loop's batches meanwhile go to the thread, after it), so the WAL stays
  bounded;
* a lock held by another connection (the ``mesh`` CLI, a backup, a second process): on the loop
  the connection does not wait (busy timeout 0); a busy batch goes to the thread, which waits up
  to 5 s as before;
* a slow disk: a batch that took more than ``SLOW_BATCH_S`` on the loop sends the batches after
  it to the thread for ``SLOW_HOLD_S`` (logged as a warning, at most once a minute);
* a long statement (a listing's scan no index serves, a big delete: CPU in SQLite, which waits
  for no disk when the pages are cached): a batch still running on the loop after
  ``LOOP_BUDGET_S`` is interrupted (SQLite's progress handler), rolled back and run again
  whole on the thread, where the statement releases the GIL and the loop runs on (its
  operations may thus run twice, as on PostgreSQL: SQL only);
* the heavy known operations (``migrate``, ``ensure_schema``, ``ping``, closing; retention's
  sweeps, inside ``Database.on_thread()``), and whatever runs while the thread holds the
  connection (a lock decides who uses it: never both at once);
* a writer faster than the checkpoints: past ``2 * CHECKPOINT_EVERY`` commits during one,
  batches wait for it on the thread, so the WAL stays bounded.

While a batch runs on the thread, what is queued meanwhile goes together in the next one, as
before. Under load on the loop, the batch is what the requests of one loop iteration queued.
``PgDatabase`` (``mesh._pg``) runs every batch on its thread: a round trip to a server is not
something to wait for on the loop.

    db = await Database.open(path)
    rows = await db.read(lambda conn: conn.execute("select ...").fetchall())
    await db.write(lambda conn: conn.execute("insert ..."))   # atomic, committed on return
    await db.aclose()

Schemas: ``await db.migrate("tasks", [ddl_v1, ddl_v2])`` brings a component's tables to the
last version, recording it in ``mesh_schema``; ``ensure_schema`` runs one idempotent script.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mesh._errors import StoreError

__all__ = ["Database"]

T = TypeVar("T")

log = logging.getLogger("mesh.sqlite")

_COMPONENT = re.compile(r"[a-z_][a-z0-9_]*")

#: How long a ``write_soon`` may wait for company before it is flushed on its own.
DEFER_S = 0.005
#: A batch that took longer on the event loop sends the batches after it to the database
#: thread for ``SLOW_HOLD_S`` (a slow or saturated disk; a loaded host's preemption too).
SLOW_BATCH_S = 0.002
SLOW_HOLD_S = 1.0
#: Commits between two checkpoints (``PASSIVE``) on the database thread: SQLite's own
#: auto-checkpoint (1,000 pages) came every ~250 commits of a node's small transactions.
CHECKPOINT_EVERY = 200
#: A WAL longer than this after a checkpoint beside the writer (it kept appending while the
#: checkpoint ran, so the WAL never started over) is checkpointed again holding the writer
#: back: ~16 MB at 4 KiB pages.
WAL_RESTART_FRAMES = 4000
#: How long a batch on the database thread waits for a lock another connection holds.
_BUSY_WAIT_MS = 5000
_WARN_EVERY_S = 60.0

#: Inside ``Database.on_thread()``: the operations started go to the database thread.
_ON_THREAD: ContextVar[bool] = ContextVar("mesh_sqlite_on_thread", default=False)
#: A batch still running on the loop after this long is interrupted, rolled back and run on
#: the thread: a statement that is long in CPU (a scan no index serves, a big delete), with
#: the pages cached, waits for no disk, so ``SLOW_BATCH_S`` would not tell it.
LOOP_BUDGET_S = 0.02
# SQLite VM instructions between two looks at the clock (~tens of microseconds of a scan).
_PROGRESS_OPS = 10_000
#: ``write_now`` runs a write at once only after this many batches of writes in a row held
#: one write each: nothing came to share their commits (a node serving one request at a time).
ALONE_AFTER = 8
#: Of the writes ``write_now`` could run at once, every ``PROBE_EVERY``-th goes through the
#: queue all the same: the writes queued behind it while it waits for its turn of the loop
#: (requests that came together) show the company is back, and the queue's group commit with it.
PROBE_EVERY = 16


@dataclass(slots=True)
class _Op:
    """One queued ``read`` or ``write``: run ``fn(conn)``, report to ``future``."""

    fn: Callable[[sqlite3.Connection], Any]
    write: bool
    #: None for ``write_now``'s op, which is run where it is made and never queued.
    future: asyncio.Future[Any] | None


# One outcome per op of a batch: (True, value) or (False, exception).
_Outcome = tuple[bool, Any]


class _Busy(Exception):
    """A batch on the loop met a lock another connection holds: the thread runs it."""


def _busy(exc: BaseException) -> bool:
    """A lock held by another connection (SQLITE_BUSY and its extended codes), or a batch on
    the loop interrupted past ``LOOP_BUDGET_S`` (SQLITE_INTERRUPT)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in (5, 9)


try:  # Linux: a thread's own resource usage
    from resource import RUSAGE_THREAD, getrusage

    def _waits() -> int:
        """How often this thread has waited (blocked: on the disk, a lock) so far: a thread
        only preempted by a busy host does not count (those switches are involuntary)."""
        return getrusage(RUSAGE_THREAD).ru_nvcsw

except ImportError:  # elsewhere a slow batch is told by its time alone

    def _waits() -> int:
        return -1


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute("pragma journal_mode=wal")
    # NORMAL is durable across process crashes in WAL mode (only an OS crash can lose the last
    # transactions), at a fraction of FULL's fsync cost; and a commit does not fsync at all,
    # which is what lets the event loop commit itself.
    conn.execute("pragma synchronous=normal")
    # Never wait on the loop: a busy batch goes to the thread, which sets _BUSY_WAIT_MS.
    conn.execute("pragma busy_timeout=0")
    # Checkpoints are the thread's (Database._checkpoint): never inside a commit on the loop.
    conn.execute("pragma wal_autocheckpoint=0")
    conn.execute("pragma foreign_keys=on")
    return conn


def _connect_checkpointer(path: str) -> sqlite3.Connection:
    # PASSIVE checkpoints wait for nobody: no busy timeout.
    return sqlite3.connect(path, check_same_thread=False, isolation_level=None)


class Database:
    #: Which SQL the connection speaks (``mesh._pg.PgDatabase``: "postgresql"; the stores
    #: write SQLite's, translated there) and the driver's error class.
    dialect = "sqlite"
    driver_error: type[Exception] = sqlite3.Error

    def __init__(
        self,
        conn: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        path: str,
        checkpointer: sqlite3.Connection | None = None,
    ) -> None:
        self._conn = conn
        # BEGIN and COMMIT through one cursor kept for them (SQLite): ``conn.execute`` makes a
        # cursor per statement and drops it, ~1,300 instructions each, twice a transaction.
        # They return no rows, so nothing is left pending on it between transactions.
        self._run_statement: Callable[[str], object] = (
            conn.cursor().execute if self.dialect == "sqlite" else conn.execute
        )
        self._executor = executor
        self.path = path
        self._closed = False
        self._schemas: set[str] = set()
        self._queue: list[_Op] = []
        #: The task handing batches to the database thread, while it has some.
        self._flusher: asyncio.Task[None] | None = None
        #: The loop's turn to run what is queued (``_drain``), while one is scheduled.
        self._draining: asyncio.Handle | None = None
        self._deferred: asyncio.TimerHandle | None = None
        #: Who uses the connection: the loop takes it without waiting, the thread waits.
        self._lock = threading.Lock()
        #: Batches run on the loop (SQLite; ``PgDatabase`` runs them all on its thread).
        self._inline = self.dialect == "sqlite"
        #: Until when (``loop.time()``) batches go to the thread after a slow one.
        self._thread_until = 0.0
        self._warned_at = -_WARN_EVERY_S
        #: Whether the queue holds an operation started inside ``on_thread()``.
        self._heavy = False
        #: Whether the connection now waits for locks (on the thread) or not (on the loop).
        self._waiting = False
        self._checkpointer = checkpointer
        self._checkpoint: asyncio.Future[None] | None = None
        self._checkpoint_at = CHECKPOINT_EVERY
        #: Batches run (on the loop or the thread), of them on the loop, transactions
        #: committed, slow batches on the loop, checkpoints done (tests, bench).
        self.batches = 0
        self.inline_batches = 0
        self.commits = 0
        self.slow_batches = 0
        self.checkpoints = 0
        #: The WAL's length in frames after the last checkpoint.
        self.wal_frames = 0
        #: Batches of writes in a row that held one write each (``write_now``), and the writes
        #: it was asked to run at once since (its probes).
        self._alone = 0
        self._asked_now = 0

    @classmethod
    async def open(cls, path: str | Path) -> Database:
        """Open (creating the file and its folder) with WAL. ``":memory:"`` works too."""
        path = str(path)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mesh-sqlite")

        def connect() -> tuple[sqlite3.Connection, sqlite3.Connection | None]:
            conn = _connect(path)
            if path == ":memory:":  # no WAL, nothing to checkpoint
                return conn, None
            try:
                return conn, _connect_checkpointer(path)
            except sqlite3.Error:
                conn.close()
                raise

        loop = asyncio.get_running_loop()
        try:
            conn, checkpointer = await loop.run_in_executor(executor, connect)
        except sqlite3.Error as exc:
            executor.shutdown(wait=False)
            raise StoreError(f"cannot open database {path}: {exc}") from exc
        return cls(conn, executor, path, checkpointer)

    @staticmethod
    @contextlib.contextmanager
    def on_thread() -> Iterator[None]:
        """Operations started inside (by this task, and tasks it starts) run on the database
        thread, and the batch they are in: work known to be heavy (retention's sweeps, a
        vacuum) that should not hold the event loop for milliseconds.

            with db.on_thread():
                await db.write(delete_a_thousand_rows)
        """
        token = _ON_THREAD.set(True)
        try:
            yield
        finally:
            _ON_THREAD.reset(token)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in the next batch (on the loop's thread or the database's: see the
        module's doc)."""
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
        queued after it and awaited implies this one is committed too. It goes in the batch of
        the next awaited operation, or after ``DEFER_S`` at most. The
        future reports the outcome (await it or read it, so an error is not lost)."""
        future: asyncio.Future[T] = self._enqueue(fn, write=True, defer=True)
        return future

    def flush(self) -> None:
        """Run what ``write_soon`` queued now, not after ``DEFER_S``: someone waits for it."""
        self._start_flush()

    def _enqueue(
        self, fn: Callable[[sqlite3.Connection], Any], *, write: bool, defer: bool = False
    ) -> Any:
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Op(fn, write, future))
        if _ON_THREAD.get():
            self._heavy = True
        if self._flusher is None and self._draining is None:
            if not defer:
                self._start_flush()
            elif self._deferred is None:
                # Nobody waits for it: let it ride with the next awaited operation (one batch
                # for both), or go on its own shortly.
                self._deferred = loop.call_later(DEFER_S, self._start_flush)
        return future

    def _start_flush(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        if self._flusher is None and self._draining is None and self._queue:
            loop = asyncio.get_running_loop()
            if not self._inline:
                self._flusher = loop.create_task(self._flush(), name="mesh-sqlite-flush")
                return
            # At the end of this loop iteration: what the other ready callbacks queue meanwhile
            # goes in the same batch.
            self._draining = loop.call_soon(self._drain)

    def _drain(self) -> None:
        """On the loop: run what is queued as one batch, here when that cannot stall the loop,
        else hand it to the thread (``_flush``)."""
        self._draining = None
        if not self._queue or self._flusher is not None:
            return
        loop = asyncio.get_running_loop()
        heavy, self._heavy = self._heavy, False
        if not heavy and self._may_inline(loop):
            batch, self._queue = self._queue, []
            outcomes = self._run_here(loop, batch)
            if outcomes is not None:
                self._settle(batch, outcomes)
                return
            # Busy (another connection holds the lock, or the thread the connection): the
            # thread runs it, waiting.
            self._queue = batch + self._queue
        self._flusher = loop.create_task(self._flush(), name="mesh-sqlite-flush")

    def _run_here(self, loop: asyncio.AbstractEventLoop, batch: list[_Op]) -> list[_Outcome] | None:
        """``batch`` run on the loop (``_run_inline``; for ``_drain`` and ``write_now``), an
        error raised there its ops' outcome, as on the thread (``_flush``): the batch fails,
        not the loop. None when nothing was done (busy)."""
        started, waits = time.perf_counter(), _waits()
        try:
            outcomes = self._run_inline(batch)
        except Exception as exc:
            outcomes = [(False, exc)] * len(batch)
        if outcomes is not None:
            elapsed = time.perf_counter() - started
            # Slow because the thread waited (the disk), not because the host preempted it.
            if elapsed > SLOW_BATCH_S and (waits < 0 or _waits() != waits):
                self._slow(loop, elapsed)
        return outcomes

    def _may_inline(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the loop may run the next batch itself: SQLite, no slow batch lately, and
        the checkpoint keeping up (past ``2 * CHECKPOINT_EVERY`` commits during one, batches
        wait for it on the thread: a writer faster than the disk does not grow the WAL
        without bound)."""
        if not self._inline or loop.time() < self._thread_until:
            return False
        return self._checkpoint is None or self.commits < self._checkpoint_at + CHECKPOINT_EVERY

    def _slow(self, loop: asyncio.AbstractEventLoop, elapsed: float) -> None:
        self.slow_batches += 1
        self._thread_until = loop.time() + SLOW_HOLD_S
        now = loop.time()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "database %s: a batch took %.1f ms on the event loop (over %.1f ms): batches go "
                "to the database thread for %.1f s; a slow or saturated disk? (%d such batches "
                "so far; this is logged at most once a minute)",
                self.path,
                elapsed * 1000,
                SLOW_BATCH_S * 1000,
                SLOW_HOLD_S,
                self.slow_batches,
            )

    async def _flush(self) -> None:
        """Hand everything queued to the database thread, batch after batch, until empty or
        the loop may run batches again. While one batch runs, the next one accumulates: that
        is the group commit."""
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue, self._heavy = self._queue, [], False
                try:
                    outcomes = await loop.run_in_executor(self._executor, self._run_held, batch)
                except asyncio.CancelledError:
                    closed = StoreError(f"database {self.path}: flush cancelled")
                    for op in batch + self._queue:
                        if op.future is not None and not op.future.done():
                            op.future.set_exception(closed)
                    self._queue = []
                    raise
                except Exception as exc:  # the executor is gone (closing): fail the batch
                    outcomes = [(False, exc)] * len(batch)
                self._settle(batch, outcomes)
                if self._may_inline(loop):
                    break  # the rest, if any, on the loop (_drain)
        finally:
            self._flusher = None
        self._start_flush()

    def _settle(self, batch: list[_Op], outcomes: list[_Outcome]) -> None:
        writes = 0
        for op in batch:
            writes += op.write
        if writes:
            self._alone = self._alone + 1 if writes == 1 else 0
        for op, (ok, value) in zip(batch, outcomes, strict=True):
            if op.future is None or op.future.done():  # the caller was cancelled
                continue
            if ok:
                op.future.set_result(value)
            elif isinstance(value, self.driver_error):
                op.future.set_exception(StoreError(f"database {self.path}: {value}"))
            else:
                op.future.set_exception(value)
        if self.commits >= self._checkpoint_at:
            self._start_checkpoint()

    def write_now(self, fn: Callable[[sqlite3.Connection], T]) -> _Outcome | None:
        """``write(fn)`` run now, on the loop, as a batch of its own: ``(True, its value)`` or
        ``(False, the error write would raise)``, committed or rolled back on return; for a
        write whose caller would await it at once. No future and no turn of the loop, but no
        group commit either: the batch of an awaited write is what the loop's other callbacks
        queue meanwhile (requests that came together), and a write run now has none. So only
        when the node's writes found no company lately (``ALONE_AFTER`` batches in a row of one
        write each), and every ``PROBE_EVERY``-th time through the queue all the same, to see
        whether company came; only when nothing is queued before it and the loop may run a
        batch (``_drain``'s rules). None when it was not run (those, a lock another connection
        holds, the loop's budget passed; on PostgreSQL always): ``await write(fn)`` then."""
        if self._alone < ALONE_AFTER or self._queue:
            return None
        if self._flusher is not None or self._draining is not None:
            return None
        if self._closed or not self._inline or _ON_THREAD.get():
            return None
        self._asked_now += 1
        if self._asked_now % PROBE_EVERY == 0:
            return None
        loop = asyncio.get_running_loop()
        if not self._may_inline(loop):
            return None
        outcomes = self._run_here(loop, [_Op(fn, True, None)])
        if outcomes is None:
            return None  # nothing was done (busy, or rolled back past the budget)
        if self.commits >= self._checkpoint_at:
            self._start_checkpoint()
        ok, value = outcomes[0]
        if not ok and isinstance(value, self.driver_error):
            return False, StoreError(f"database {self.path}: {value}")
        return ok, value

    def _run_inline(self, batch: list[_Op]) -> list[_Outcome] | None:
        """On the loop: the batch, without waiting for any lock; None when one is held (the
        connection by the thread, the database by another connection) and nothing was done."""
        if not self._lock.acquire(blocking=False):
            return None
        conn = self._conn
        deadline = time.perf_counter() + LOOP_BUDGET_S
        conn.set_progress_handler(lambda: time.perf_counter() > deadline, _PROGRESS_OPS)
        try:
            if self._waiting:
                conn.execute("pragma busy_timeout=0")
                self._waiting = False
            try:
                outcomes = self._run_batch(batch)
            except self.driver_error as exc:
                # A statement of the batch's own (a savepoint, its release or rollback)
                # interrupted past the budget: as any of the batch's statements.
                if not _busy(exc):
                    raise
                raise _Busy from exc
        except _Busy:
            conn.set_progress_handler(None, 0)
            if conn.in_transaction:  # interrupted: none of it stays (SQLite may have undone it)
                conn.execute("rollback")
            return None
        finally:
            conn.set_progress_handler(None, 0)
            self._lock.release()
        self.inline_batches += 1
        return outcomes

    def _run_held(self, batch: list[_Op]) -> list[_Outcome]:
        """On the database thread: ``_run_batch`` holding the connection, waiting for locks."""
        with self._lock:
            if self._inline and not self._waiting:
                self._conn.execute(f"pragma busy_timeout={_BUSY_WAIT_MS}")
                self._waiting = True
            return self._run_batch(batch)

    def _run_batch(self, batch: list[_Op]) -> list[_Outcome]:
        """The batch's reads and writes in order, writes in one transaction, each write in a
        savepoint. On the loop (not waiting for locks), a lock another connection holds raises
        ``_Busy`` before anything is done: the thread runs the batch instead. (A read-only
        batch that met one, rare in WAL, e.g. a recovery, is run again whole: reads change
        nothing.) So does a batch interrupted past ``LOOP_BUDGET_S`` (``_run_inline`` rolls
        back what it wrote)."""
        conn = self._conn
        self.batches += 1
        nowait = self._inline and not self._waiting
        writes = any(op.write for op in batch)
        if writes:
            try:
                self._run_statement("begin immediate")
            except self.driver_error as exc:
                if nowait and _busy(exc):
                    raise _Busy from exc
                return [(False, exc)] * len(batch)
        if writes and len(batch) == 1 and self._inline:  # SQLite (PostgreSQL: its own way)
            return self._run_one(batch[0], nowait)
        outcomes: list[_Outcome] = []
        for op in batch:
            if not op.write:
                try:
                    outcomes.append((True, op.fn(conn)))
                except Exception as exc:
                    if nowait and _busy(exc):  # run again whole on the thread
                        raise _Busy from exc
                    outcomes.append((False, exc))
                continue
            conn.execute("savepoint op")
            try:
                value = op.fn(conn)
                # In the try: on PostgreSQL the write's statements may still be in flight,
                # and their error is raised here (mesh._pg.PgConnection).
                conn.execute("release op")
            except Exception as exc:
                if nowait and _busy(exc):  # interrupted: the batch runs again on the thread
                    raise _Busy from exc
                conn.execute("rollback to op")
                conn.execute("release op")
                outcomes.append((False, exc))
                continue
            outcomes.append((True, value))
        if writes:
            try:
                self._commit(conn, nowait)
            except self.driver_error as exc:
                if nowait and _busy(exc) and conn.in_transaction:  # see _commit
                    raise _Busy from exc
                if conn.in_transaction:
                    conn.execute("rollback")
                return [
                    (False, exc) if op.write else o for op, o in zip(batch, outcomes, strict=True)
                ]
        return outcomes

    def _run_one(self, op: _Op, nowait: bool) -> list[_Outcome]:
        """A batch of one write (most of them at low load), its transaction begun: no
        savepoint, its own transaction undoes a failure (two statements less)."""
        conn = self._conn
        try:
            value = op.fn(conn)
        except Exception as exc:
            if nowait and _busy(exc):  # interrupted: the batch runs again on the thread
                raise _Busy from exc
            if conn.in_transaction:
                conn.execute("rollback")
            return [(False, exc)]
        try:
            self._commit(conn, nowait)
        except self.driver_error as exc:
            if nowait and _busy(exc) and conn.in_transaction:  # see _commit
                raise _Busy from exc
            if conn.in_transaction:
                conn.execute("rollback")
            return [(False, exc)]
        return [(True, value)]

    def _commit(self, conn: Any, nowait: bool) -> None:
        """COMMIT the batch's transaction. On the loop, without the budget's progress handler:
        SQLite calls it every ``_PROGRESS_OPS`` steps a cached statement has made over all its
        runs, so a COMMIT would meet it now and then, and once more after its last step, where
        an interrupt says nothing true: the COMMIT has committed, or has failed and rolled
        back, either way with no transaction open (session 33's attack: a write run twice, or
        told committed when it was not). The batch's work is done by then; its COMMIT is what
        is left of it. A lock (busy, the transaction still open) still sends it to the thread."""
        if nowait:
            conn.set_progress_handler(None, 0)
        self._run_statement("commit")
        self.commits += 1

    def _start_checkpoint(self) -> None:
        """Checkpoint on the database thread, on its own connection (one at a time)."""
        if self._checkpointer is None or self._checkpoint is not None or self._closed:
            return
        self._checkpoint_at = self.commits + CHECKPOINT_EVERY
        loop = asyncio.get_running_loop()
        self._checkpoint = loop.run_in_executor(self._executor, self._run_checkpoint)
        self._checkpoint.add_done_callback(self._checkpointed)

    def _run_checkpoint(self) -> None:
        """On the database thread: copy the WAL into the file beside the writer (``PASSIVE``
        waits for nobody). A writer that kept committing meanwhile keeps the WAL from starting
        over (that needs all of it copied when a transaction begins): past
        ``WAL_RESTART_FRAMES``, copy the rest holding the connection, so the next transaction
        starts the WAL over; the loop's batches meanwhile come to this thread, after it."""
        conn = self._checkpointer
        assert conn is not None
        _, frames, _ = conn.execute("pragma wal_checkpoint(passive)").fetchone()
        if frames > WAL_RESTART_FRAMES:  # (what was added while it ran is not in frames)
            with self._lock:
                _, frames, _ = conn.execute("pragma wal_checkpoint(passive)").fetchone()
        self.checkpoints += 1
        self.wal_frames = frames

    def _checkpointed(self, future: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:  # the next one may do better; the file stays consistent
            log.warning("database %s: checkpoint failed: %s", self.path, exc)

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
        """``fn(conn)`` on the database thread, holding the connection (heavy or rare work:
        schemas, health checks), waiting for locks."""
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._held, fn)
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from exc

    def _held(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if not self._waiting:
                self._conn.execute(f"pragma busy_timeout={_BUSY_WAIT_MS}")
                self._waiting = True
            return fn(self._conn)

    async def ping(self) -> None:
        """Cheap health check: raises ``StoreError`` when the file cannot be read."""
        await self._submit(lambda conn: conn.execute("select 1").fetchone())

    async def aclose(self) -> None:
        """Commit what is queued, then close the connections and the thread."""
        if self._closed:
            return
        # Let queued writes commit: on the loop now, or through the thread.
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        while self._queue or self._flusher is not None:
            if self._flusher is not None:
                await asyncio.shield(self._flusher)
                continue
            if self._draining is not None:
                self._draining.cancel()
                self._draining = None
            self._drain()
        self._closed = True  # no checkpoint starts any more
        loop = asyncio.get_running_loop()
        if self._checkpoint is not None:  # its error, if any, is logged (_checkpointed)
            await asyncio.wait([self._checkpoint])
        await loop.run_in_executor(self._executor, self._close_held)
        self._executor.shutdown(wait=True)

    def _close_held(self) -> None:
        with self._lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
            self._conn.close()
