"""``PgDatabase``: the node's stores on PostgreSQL, shared by every replica of an agent.

Design (docs/architecture.md, "Storage backends"): the SQL stores (tasks, idempotency keys,
sessions) are written once, against ``mesh._sqlite.Database``: each of their operations is a
function of a connection, run in one transaction on the database's own thread, with group
commit. ``PgDatabase`` is that same ``Database`` (same queue, batches, savepoints, ``migrate``)
over one PostgreSQL connection, so a store gets a second backend without a second copy of it.
The stores write one dialect, SQLite's common subset with PostgreSQL (``on conflict ... do
update``, row-value comparison, ``coalesce``), and the few differences are translated here, in
one place:

- placeholders: ``?`` becomes ``%s`` (and a literal ``%`` becomes ``%%``);
- ``insert or ignore into ...`` becomes ``insert into ... on conflict do nothing``;
- DDL: ``blob`` is ``bytea``, ``real`` is ``double precision``, ``integer`` is ``bigint`` (a ns
  timestamp does not fit PostgreSQL's 32-bit integer), ``integer primary key autoincrement`` an
  identity column, and ``without rowid`` is dropped;
- rows answer by index and by column name, like ``sqlite3.Row``; bytea comes back as ``bytes``.

Migrations are versioned per component in ``mesh_schema`` as on SQLite; replicas starting
together take a transaction-level advisory lock, so one of them migrates and the others find
the version done. A store that calls ``ensure_schema`` (one idempotent script) gets it as version 1
of a component of that name.

Driver: psycopg 3 (the ``postgres`` extra), because the stores' statements are synchronous
functions of a connection run on the database thread, and psycopg 3 is the driver that offers a
synchronous DB-API connection (asyncpg is asyncio-only and would mean a second copy of every
store).

Connections: writes and reads are served apart.

- Writes keep ``Database``'s group commit on one writer connection and its one thread: the
  writes queued together share one transaction, so a second writer would only split the
  commits. A writer taken from the pool per batch measured the same CPU and round trips, and
  would wait behind busy readers for a connection (docs/performance.md, "On PostgreSQL"). A
  writer connection the server dropped is opened again (``PgConnection``). A batch's
  statements go in one psycopg pipeline, sent when a result is needed: a batch of two writes or
  more is first sent whole, without savepoints, and only when something in it fails is it
  rolled back and run again write by write in savepoints (``PgDatabase._run_batch``), so a
  write's function may run twice on PostgreSQL (the stores' do SQL and return what they read;
  what they change in memory they change after the await). A typed task on a shared database
  took 15 round trips, then 7, now about 2 (docs/performance.md, "On PostgreSQL").
- Reads (``read``, ``ping``) go to a ``psycopg_pool.ConnectionPool`` served by as many reader
  threads as it has connections at most (``MESH_PG_POOL_MIN`` / ``MESH_PG_POOL_MAX``, 1 and 4),
  so a ``GetTask``, ``ListTasks`` or session read never waits behind a write batch or a slow
  commit, and several run at once. A read sees what is committed, as another replica does (the
  stores on a shared database are written for that: what a caller awaited is committed; a
  ``write_soon`` nobody awaited yet may not be seen by a read, where on the one SQLite
  connection it would be). A pooled connection found broken (the server restarted, the backend
  was terminated) is dropped, the pool's idle ones checked, and the read sent once more (a read
  changes nothing). ``MESH_PG_POOL_MAX=0``: no pool, reads queue with the writes as on SQLite.

The URL's password is never in a log line, an error or ``path`` (``redacted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import select
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import psycopg
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from mesh._errors import StoreError
from mesh._sqlite import _COMPONENT, Database, _Op, _Outcome

__all__ = ["PgDatabase", "is_postgres_url", "redacted"]

#: Reader connections by default (``MESH_PG_POOL_MIN`` / ``MESH_PG_POOL_MAX``).
POOL_MIN, POOL_MAX = 1, 4
#: Seconds a read waits for a pooled connection (all busy, or being replaced while the server
#: is away) before it fails: a health check or a GetTask answers an outage within this.
POOL_WAIT_S = 10.0

T = TypeVar("T")

_SCHEMES = ("postgresql://", "postgres://")
# A lock id of our own for migrations (pg_advisory_xact_lock takes a bigint): "mesh" in ASCII.
_MIGRATE_LOCK = 0x6D657368


def is_postgres_url(value: str) -> bool:
    """Whether ``value`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return value.startswith(_SCHEMES)


def redacted(url: str) -> str:
    """``url`` without its password (for logs, errors and /introspect)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """A statement of the stores' dialect in PostgreSQL's."""
    out = sql.replace("%", "%%").replace("?", "%s")
    if _IGNORE.search(out):
        out = _IGNORE.sub("insert into", out).rstrip().rstrip(";") + " on conflict do nothing"
    return out


_IGNORE = re.compile(r"\binsert\s+or\s+ignore\s+into\b", re.IGNORECASE)
_DDL = [
    (
        re.compile(r"\binteger\s+primary\s+key\s+autoincrement\b", re.I),
        "bigint generated by default as identity primary key",
    ),
    (re.compile(r"\)\s*without\s+rowid", re.I), ")"),
    (re.compile(r"\bblob\b", re.I), "bytea"),
    (re.compile(r"\breal\b", re.I), "double precision"),
    (re.compile(r"\binteger\b", re.I), "bigint"),
]


def translate_ddl(script: str) -> str:
    """A schema script of the stores' dialect in PostgreSQL's."""
    for pattern, replacement in _DDL:
        script = pattern.sub(replacement, script)
    return script


class _Row(tuple[Any, ...]):
    """A result row by index or by column name, like ``sqlite3.Row``."""

    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], _Row]:
    names = {d.name: i for i, d in enumerate(cursor.description or [])}

    def make(values: Sequence[Any]) -> _Row:
        row = _Row(values)
        row._names = names
        return row

    return make


class _Cursor(psycopg.Cursor[Any]):
    """A cursor whose ``rowcount`` waits for its statement's result in pipeline mode, as its
    ``fetch*`` methods do (psycopg's would read -1 until the pipeline is synced)."""

    @property
    def rowcount(self) -> int:
        self._fetch_pipeline()
        return self._rowcount

    #: The ``PgConnection`` that sent it in a pipeline (None otherwise).
    owner: PgConnection | None = None

    def _fetch_pipeline(self) -> None:
        if self.owner is not None:  # a store reads a result (counted even if it fails)
            self.owner.reads += 1
        if self.pgresult is None and self._conn._pipeline is not None:
            PgConnection.round_trips += 1  # a flush, and the wait for this result
            super()._fetch_pipeline()


class PgConnection:
    """The part of ``sqlite3.Connection`` the stores use, over a psycopg connection in
    autocommit mode (``Database`` runs ``begin`` / savepoints / ``commit`` itself).

    Round trips: inside a transaction the statements go in one psycopg pipeline, sent when
    something needs an answer. A statement whose result a store reads (``fetch*``,
    ``rowcount``) sends what is queued and waits for that result; the end of a write
    (``release op``) waits only when the write left results nobody read, so its errors are
    raised inside the write (``Database`` then rolls back to its savepoint, as on SQLite);
    ``commit`` sends what is left and waits. ``begin``, the savepoints and a store's
    statements thus share trips: a claim (insert, read its row count, commit) is two, where
    one statement per trip was five (docs/performance.md, "On PostgreSQL").

    A connection the server dropped (a restart, a failover, an idle timeout) is opened again
    when a statement outside a transaction, or ``begin``, finds it gone, and that statement is
    sent once more: outside a transaction nothing was done (the stores write only between
    ``begin`` and ``commit``). ``begin`` rides in the pipeline of the statements after it
    unless the idle connection has something to read (the server's goodbye: it is sent on
    its own, where a loss is seen and the connection opened again). Lost inside a
    transaction, the transaction fails: its writes are not retried. Over a pool's connection
    (``raw``, a reader's) nothing is opened again here: the pool replaces it
    (``PgDatabase.read``).
    """

    #: Round trips to the server on writer connections, since the process started (the bench's
    #: ``BENCH_COUNT_PG``): a statement sent alone, a pipeline synced or flushed for a result.
    round_trips = 0

    def __init__(self, url: str, raw: psycopg.Connection[Any] | None = None) -> None:
        self._url = url
        self._owned = raw is None
        self.raw = _open(url) if raw is None else raw
        self._tx = False
        #: Connections opened again after a loss (tests).
        self.reconnects = 0
        # The transaction's pipeline (None outside one) and whether statements were sent in
        # it since the last wait for their results.
        self._pipe: psycopg.Pipeline | None = None
        self._pipe_cm: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None
        self._unread = False
        #: False while ``PgDatabase._run_batch`` checks the writes' outcomes itself: the end of
        #: a write then waits for nothing.
        self.checked = True
        #: The stores' statements sent in the transaction's pipeline, in order, and results a
        #: store waited for and got (``PgDatabase._run_batch``).
        self.sent: list[_Cursor] = []
        self.reads = 0
        # The pipelined transaction's begin: answered by the server once it read the rest.
        self._begin: _Cursor | None = None

    def execute(self, sql: str, params: Iterable[Any] = ()) -> psycopg.Cursor[Any]:
        if self._pipe is not None:
            if not self.raw.closed:
                return self._in_pipeline(sql, params)
            self._drop_pipeline()  # lost mid-transaction: below, as without a pipeline
        if sql == "begin immediate":  # SQLite's write lock up front; PostgreSQL locks rows
            sql = "begin"
        if sql == "begin" and self._owned and not self.raw.closed and not _readable(self.raw):
            self._tx = True
            # Held: the pipeline ends when its context manager is closed (or collected).
            self._pipe_cm = self.raw.pipeline()
            self._pipe = self._pipe_cm.__enter__()
            self._begin = self._send("begin", None)
            self.sent = []
            return self.raw.cursor()
        query, args = translate(sql), tuple(params) or None
        if sql in ("commit", "rollback"):
            self._tx = False
        elif sql == "begin":
            self._tx = True
        fresh = (sql == "begin" or not self._tx) and self._owned
        if self.raw.closed:
            if not fresh:
                raise psycopg.OperationalError(
                    "the connection to PostgreSQL was lost mid-transaction"
                )
            self._reopen()
        try:
            return self._run(query, args)
        except psycopg.OperationalError:
            if not (fresh and self.raw.closed):
                raise
            self._reopen()
            return self._run(query, args)

    def _in_pipeline(self, sql: str, params: Iterable[Any]) -> psycopg.Cursor[Any]:
        """``sql`` inside the transaction's pipeline (see the class's doc)."""
        if sql in ("commit", "rollback"):
            self._tx = False
            self._send(sql, None)
            self._end_pipeline()
            return self.raw.cursor()
        if sql == "rollback to op":
            if self.checked:  # out of an aborted pipeline (the error was raised)
                self._sync(raising=False)
            self._send(sql, None)
            return self.raw.cursor()
        if sql == "release op":
            self._send(sql, None)
            if self._unread and self.checked:  # the write's statements may have failed
                self._sync(raising=True)
            return self.raw.cursor()
        if sql == "savepoint op":
            self._send(sql, None)
            return self.raw.cursor()
        cur = self._send(translate(sql), tuple(params) or None)
        cur.owner = self
        self.sent.append(cur)
        self._unread = True
        return cur

    def settle(self) -> Exception | None:
        """Wait for every answer to what was sent in the pipeline; the first error, if any
        (not raised: the pipeline is usable again after it)."""
        self._unread = False
        PgConnection.round_trips += 1
        assert self._pipe is not None
        try:
            self._pipe.sync()
        except psycopg.Error as exc:
            if self.raw.closed:
                raise
            return exc
        return None

    def unanswered(self, start: int) -> int | None:
        """The index in ``sent`` of the first statement from ``start`` on with no answer yet
        (after ``settle``: the one that failed, or one skipped after a failure)."""
        for index in range(start, len(self.sent)):
            if self.sent[index].pgresult is None:
                return index
        return None

    @property
    def pipelined(self) -> bool:
        return self._pipe is not None

    def _send(self, query: str, args: tuple[Any, ...] | None) -> _Cursor:
        cur = cast(_Cursor, self.raw.cursor(row_factory=_row_factory))
        cur.execute(query, args)
        return cur

    def _sync(self, *, raising: bool) -> None:
        assert self._pipe is not None
        self._unread = False
        PgConnection.round_trips += 1
        try:
            self._pipe.sync()
        except psycopg.Error:
            if raising or self.raw.closed:
                raise

    def _end_pipeline(self) -> None:
        """Send what is queued, wait for all of it, and leave pipeline mode (its first
        error raised)."""
        cm, self._pipe, self._pipe_cm, self._unread = self._pipe_cm, None, None, False
        self.sent = []
        assert cm is not None
        PgConnection.round_trips += 1
        cm.__exit__(None, None, None)

    def _run(self, query: str, args: tuple[Any, ...] | None) -> psycopg.Cursor[Any]:
        if self._owned:
            PgConnection.round_trips += 1
        cur = self.raw.cursor(row_factory=_row_factory)
        cur.execute(query, args)
        return cur

    def _reopen(self) -> None:
        self._drop_pipeline()
        with contextlib.suppress(psycopg.Error):
            self.raw.close()
        self.raw = _open(self._url)
        self.reconnects += 1

    def _drop_pipeline(self) -> None:
        cm, self._pipe, self._pipe_cm, self._unread = self._pipe_cm, None, None, False
        self.sent = []
        if cm is not None:
            with contextlib.suppress(psycopg.Error):
                cm.__exit__(None, None, None)

    def executemany(self, sql: str, rows: Iterable[Iterable[Any]]) -> psycopg.Cursor[Any]:
        cur = self.raw.cursor(row_factory=_row_factory)
        cur.executemany(translate(sql), [tuple(r) for r in rows])
        if self._pipe is not None:  # its row count is whole once every statement answered
            self.reads += 1
            self._sync(raising=True)
        elif self._owned:
            PgConnection.round_trips += 1
        return cur

    @property
    def in_transaction(self) -> bool:
        if self.raw.closed:
            return False
        if self._pipe is not None:
            return True
        return self.raw.info.transaction_status != pq.TransactionStatus.IDLE

    def lost_unread(self) -> bool:
        """Whether the connection is gone and the server never answered the transaction's
        ``begin`` (answers come in order: it did nothing of it, a commit included)."""
        return self.raw.closed and self._begin is not None and self._begin.pgresult is None

    def can_pipeline(self) -> bool:
        """Whether ``begin`` would open a pipeline (see the class's doc)."""
        return self._owned and not self.raw.closed and not _readable(self.raw)

    def abandon(self) -> None:
        """Leave the transaction in flight, whatever state it is in: its writes are undone."""
        self._drop_pipeline()
        self._tx = False
        if not self.raw.closed:
            with contextlib.suppress(psycopg.Error):
                self.raw.execute("rollback")

    def close(self) -> None:
        self._drop_pipeline()
        self.raw.close()


class _RunAgain(Exception):
    """A batch sent whole failed where its writes cannot be told apart: run it again."""


def _readable(raw: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection has bytes waiting: the server said something unasked (its
    goodbye before closing: a restart, a terminated backend, an idle timeout)."""
    try:
        ready, _, _ = select.select([raw.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


class PgDatabase(Database):
    """``Database`` on PostgreSQL: ``await PgDatabase.open("postgresql://...")``."""

    dialect = "postgresql"
    driver_error: type[Exception] = psycopg.Error

    def __init__(
        self,
        conn: PgConnection,
        executor: ThreadPoolExecutor,
        path: str,
        url: str,
        pool: ConnectionPool | None = None,
        metrics: tuple[CollectorRegistry, str] | None = None,
    ) -> None:
        super().__init__(cast(Any, conn), executor, path)
        self._url = url
        #: The readers' connections (None: reads queue with the writes).
        self.pool = pool
        self._readers = (
            None
            if pool is None
            else ThreadPoolExecutor(max_workers=pool.max_size, thread_name_prefix="mesh-pg-read")
        )
        #: Reads sent once more on a fresh connection after theirs was found broken (tests).
        self.read_retries = 0
        #: Batches sent whole that failed and ran again write by write (``_run_batch``).
        self.rerun_batches = 0
        self._metrics: tuple[CollectorRegistry, PoolMetrics] | None = None
        if pool is not None and metrics is not None:
            registry, agent = metrics
            collector = PoolMetrics(pool, agent)
            registry.register(collector)
            self._metrics = (registry, collector)

    @classmethod
    async def open(
        cls,
        path: Any,
        *,
        pool_min: int = POOL_MIN,
        pool_max: int = POOL_MAX,
        metrics: tuple[CollectorRegistry, str] | None = None,
    ) -> PgDatabase:
        """Connect to the database at URL ``path`` (its password is never shown): the writer
        connection, and a pool of ``pool_min`` to ``pool_max`` reader connections (``pool_max``
        0: none, reads queue with the writes). ``metrics``: (registry, agent name) to show
        the pool's state on (``PoolMetrics``) until ``aclose``."""
        if (pool_max and not 1 <= pool_min <= pool_max) or pool_max < 0:
            raise ValueError(f"reader pool {pool_min}..{pool_max}: use 1 <= min <= max, or max 0")
        url = str(path)
        shown = redacted(url)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mesh-pg")
        loop = asyncio.get_running_loop()
        pool, conn = None, None
        try:
            conn = await loop.run_in_executor(executor, _connect, url)
            if pool_max:
                pool = await loop.run_in_executor(executor, _open_pool, url, pool_min, pool_max)
        except psycopg.Error as exc:
            if conn is not None:
                conn.close()
            executor.shutdown(wait=False)
            raise StoreError(f"cannot open database {shown}: {_said(exc, url)}") from exc
        return cls(conn, executor, shown, url, pool, metrics)

    def _run_batch(self, batch: list[_Op]) -> list[_Outcome]:
        """``Database._run_batch`` (each write in a savepoint, alone when it fails) in one
        pipeline that waits for nothing it need not: a store's read of a result waits for it,
        the end of a write does not, so a batch of writes that read nothing is one round trip
        (``begin`` to ``commit``). A statement's error shows at the next wait; the write it
        belongs to is found by its missing answer, rolled back to its savepoint and failed,
        and the writes after it, whose statements the server skipped, run again (they had read
        nothing: the wait that would have answered them raised). Before ``commit``, writes not
        yet answered are waited for when a write of the batch read something (its effects
        stand); otherwise a failing ``commit`` runs the whole batch again write by write
        (``Database``'s way): a write's function may thus run twice, never after it read."""
        conn: PgConnection = self._conn  # type: ignore[assignment]
        if not any(op.write for op in batch) or not conn.can_pipeline():
            return super()._run_batch(batch)
        conn.checked = False
        reads = conn.reads
        try:
            outcomes = self._run_pipelined(batch, conn)
        except _RunAgain:
            conn.abandon()
            conn.checked = True
            self.rerun_batches += 1
            return super()._run_batch(batch)
        except BaseException as exc:
            lost = conn.lost_unread()
            conn.abandon()
            if isinstance(exc, psycopg.Error) and not conn.raw.closed and conn.reads == reads:
                # A statement's error surfaced where no op owns the wait (the next op's
                # savepoint, a rollback): nothing of the batch read a result, so it goes
                # again write by write, each failing alone (seen: a duplicate key failed all
                # five writes of a batch, 1 run in ~15).
                conn.checked = True
                self.rerun_batches += 1
                return super()._run_batch(batch)
            if not lost:
                raise
            # The connection was found gone before the server answered anything of it (its
            # goodbye not yet read when begin was sent): nothing was done, nothing read; the
            # batch goes again, on a connection opened again at its begin.
            conn.checked = True
            self.rerun_batches += 1
            return super()._run_batch(batch)
        finally:
            conn.checked = True
        self.batches += 1
        return outcomes

    def _run_pipelined(self, batch: list[_Op], conn: PgConnection) -> list[_Outcome]:
        given = cast(Any, conn)  # the stores' functions take it as a sqlite3.Connection
        conn.execute("begin immediate")
        if len(batch) == 1:  # alone, it needs no savepoint: its failure is the transaction's
            try:
                value = batch[0].fn(given)
                conn.execute("commit")
            except Exception as exc:
                if conn.raw.closed:
                    raise
                conn.abandon()
                return [(False, exc)]
            self.commits += 1
            return [(True, value)]
        outcomes: list[_Outcome] = [(False, None)] * len(batch)
        starts = [0] * len(batch)  # where each op's statements start in conn.sent
        base, reads, index = 0, conn.reads, 0
        while True:
            while index < len(batch):
                op = batch[index]
                starts[index] = len(conn.sent)
                conn.execute("savepoint op")
                try:
                    outcomes[index] = (True, op.fn(given))
                    conn.execute("release op")
                except Exception as exc:
                    index, base = self._failed(conn, outcomes, starts, base, index, exc)
                    continue
                index += 1
            if conn.unanswered(base) is None:
                break
            if conn.reads == reads:  # nothing read: a failing commit runs it all again
                try:
                    conn.execute("commit")
                except psycopg.Error as exc:
                    raise _RunAgain from exc
                self.commits += 1
                return outcomes
            error = conn.settle()
            if error is None and conn.unanswered(base) is None:
                break
            index, base = self._failed(conn, outcomes, starts, base, len(batch), error)
        try:
            conn.execute("commit")
        except psycopg.Error as exc:
            conn.abandon()
            return [(False, exc) if op.write else o for op, o in zip(batch, outcomes, strict=True)]
        self.commits += 1
        return outcomes

    @staticmethod
    def _failed(
        conn: PgConnection,
        outcomes: list[_Outcome],
        starts: list[int],
        base: int,
        index: int,
        exc: BaseException | None,
    ) -> tuple[int, int]:
        """After an error surfaced in op ``index`` (``len(outcomes)``: before ``commit``):
        fail the op it belongs to, roll that back to its savepoint; the op to run next and the
        new ``base`` of ``conn.sent``."""
        error = conn.settle()
        failed = conn.unanswered(base)
        owner = index
        if failed is not None:
            owner = max(i for i in range(min(index + 1, len(starts))) if starts[i] <= failed)
        if owner < index and not isinstance(exc, psycopg.Error):
            exc = error  # a statement of an earlier op failed: its error, not this op's
        if owner == len(outcomes):  # cannot happen: an op owns every statement
            raise _RunAgain
        outcomes[owner] = (False, exc if exc is not None else error)
        conn.execute("rollback to op")
        conn.execute("release op")
        return owner + 1, len(conn.sent)

    async def read(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` on a reader thread with a pooled connection: not behind the
        writes, and beside other reads. It sees what is committed (see the module's doc)."""
        if self._readers is None:
            return await super().read(fn)
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._readers, self._read_pooled, fn)
        except PoolTimeout as exc:
            raise StoreError(
                f"database {self.path}: no connection to it within {POOL_WAIT_S:.0f} s: is the "
                "server up and the database there? (the log has the connection error)"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"database {self.path}: {_said(exc, self._url)}") from exc

    def _read_pooled(self, fn: Callable[[Any], T]) -> T:
        """On a reader thread: ``fn`` over a pooled connection; once more on another when
        the server dropped that one (the pool discards it on its return)."""
        assert self.pool is not None
        with self.pool.connection() as raw:
            try:
                return fn(PgConnection(self._url, raw))
            except psycopg.OperationalError:
                if not raw.closed:
                    raise
        # The other idle connections are likely gone too (a restart, a failover): the pool
        # checks them all and opens their replacements, then the read goes again.
        self.pool.check()
        self.read_retries += 1
        with self.pool.connection() as raw:
            return fn(PgConnection(self._url, raw))

    async def ping(self) -> None:
        """Cheap health check on a reader's connection (the writer's when there is no pool)."""
        if self._readers is None:
            return await super().ping()
        await self.read(lambda conn: conn.execute("select 1").fetchone())

    async def aclose(self) -> None:
        """Commit what is queued, close the writer, then the pool and its threads."""
        if self._closed:
            return
        await super().aclose()
        if self._metrics is not None:
            registry, collector = self._metrics
            registry.unregister(collector)
            self._metrics = None
        if self.pool is not None and self._readers is not None:
            await asyncio.get_running_loop().run_in_executor(self._readers, self.pool.close)
            self._readers.shutdown(wait=True)

    async def migrate(self, component: str, steps: Sequence[str]) -> int:
        """``Database.migrate`` on PostgreSQL: each step (translated) in its own transaction
        with its version, under an advisory lock so replicas starting together migrate once."""
        if component in self._schemas:
            return len(steps)
        if not _COMPONENT.fullmatch(component):
            raise ValueError(f"component name {component!r}: use [a-z_][a-z0-9_]*")

        def run(conn: PgConnection) -> int:
            raw = conn.raw
            for _ in range(len(steps) + 1):
                with raw.transaction():
                    raw.execute("select pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
                    raw.execute(
                        "create table if not exists mesh_schema "
                        "(component text primary key, version bigint not null)"
                    )
                    row = raw.execute(
                        "select version from mesh_schema where component = %s", (component,)
                    ).fetchone()
                    version = 0 if row is None else int(row[0])
                    if version > len(steps):
                        raise StoreError(
                            f"database {self.path}: its '{component}' tables are at version "
                            f"{version}, newer than this mesh knows ({len(steps)}): upgrade mesh"
                        )
                    if version >= len(steps):
                        return len(steps)
                    raw.execute(translate_ddl(steps[version]).encode())
                    raw.execute(
                        "insert into mesh_schema (component, version) values (%s, %s) "
                        "on conflict (component) do update set version = excluded.version",
                        (component, version + 1),
                    )
            return len(steps)

        version: int = await self._submit(run)
        self._schemas.add(component)
        return version

    async def ensure_schema(self, name: str, script: str) -> None:
        """One idempotent script: on PostgreSQL, version 1 of component ``name``."""
        await self.migrate(name, [script])

    async def _submit(self, fn: Callable[[Any], Any]) -> Any:
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn)
        except psycopg.Error as exc:
            raise StoreError(f"database {self.path}: {_said(exc, self._url)}") from exc


class PoolMetrics:
    """The reader pool's state on /metrics, read from the pool when scraped: connections by
    ``state`` (idle, busy) and reads waiting for one. Labels: the agent, two states."""

    def __init__(self, pool: ConnectionPool, agent: str) -> None:
        self._pool = pool
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        stats = self._pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        connections = GaugeMetricFamily(
            "mesh_pg_pool_connections",
            "Reader connections to PostgreSQL, by state.",
            labels=["agent", "state"],
        )
        connections.add_metric([self._agent, "idle"], idle)
        connections.add_metric([self._agent, "busy"], size - idle)
        yield connections
        waiting = GaugeMetricFamily(
            "mesh_pg_pool_waiting",
            "Reads waiting for a reader connection to PostgreSQL.",
            labels=["agent"],
        )
        waiting.add_metric([self._agent], stats.get("requests_waiting", 0))
        yield waiting


def _connect(url: str) -> PgConnection:
    return PgConnection(url)


_CONNECT_S = 10
_CONNECT: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": _CONNECT_S,
    "cursor_factory": _Cursor,
}


def _open(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, **_CONNECT)


def _open_pool(url: str, min_size: int, max_size: int) -> ConnectionPool:
    """The readers' pool, its first ``min_size`` connections open (or ``PoolTimeout``)."""
    pool: ConnectionPool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs=dict(_CONNECT),
        open=False,
        timeout=POOL_WAIT_S,
        # One worker grows and refills it: a node needs a few connections, not many at once.
        num_workers=1,
        name="mesh-pg-read",
    )
    try:
        pool.open(wait=True, timeout=_CONNECT_S)
    except BaseException:
        pool.close()
        raise
    return pool


def _said(exc: psycopg.Error, url: str) -> str:
    """The driver's message, without the password should it quote the URL."""
    text = str(exc).strip()
    password = urlsplit(url).password
    return text.replace(password, "***") if password else text
