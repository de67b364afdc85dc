"""``SqliteTaskStore``: durable A2A tasks in the node's one SQLite file.

A task is stored as its protobuf bytes (``SerializeToString``: the cheapest faithful encoding)
plus the few columns ``ListTasks`` filters and sorts on. Rows are scoped by owner (the
authenticated user, ``''`` when anonymous) exactly like the SDK's ``InMemoryTaskStore``, and the
listing order and page tokens are the SDK's: ``(status timestamp, id)`` descending.

The SDK mutates the task object it saved in place afterwards, so the bytes are taken on the
event loop before the write is handed to the database thread.

Write-behind: the SDK saves a task on every event (SUBMITTED, WORKING, each artifact, the final
state) and reads it back several times per request. The store keeps the latest state of each
in-flight task in memory and persists only what a reader must find after a restart: the first
save of a task in this process, every terminal state and every interrupted state
(input-required, auth-required). Those saves return after their commit, and the SDK answers a
blocking request only after it saved the final state, so a task acknowledged as finished is on
disk. Intermediate states live in memory until then (a crash leaves the task in its first saved
state, never ahead of what a client saw as final). ``get`` answers in-flight tasks from memory,
and task ids this node just generated (``id_generator``) are known to be absent without a read.
``list`` writes the in-memory states first, so a listing is never behind ``get``.

For a new task of a blocking send the first save is queued but not awaited: the client hears
of the task only with its final state, whose commit comes after (same queue, in order), so
the promise holds with one wait less. Streaming sends await it (the client sees the task at
once, and its idempotency key rides in that transaction).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any

from a2a.server.agent_execution.active_task import INTERRUPTED_TASK_STATES, TERMINAL_TASK_STATES
from a2a.server.context import ServerCallContext
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import ListTasksCursor, decode_list_tasks_cursor, encode_list_tasks_cursor

from mesh.sqlite import Database

__all__ = ["BLOCKING_SEND", "SqliteTaskStore"]

_SETTLED = TERMINAL_TASK_STATES | INTERRUPTED_TASK_STATES
log = logging.getLogger("mesh.a2a")

#: True while a blocking SendMessage (not streaming, not return_immediately) is handled; set
#: by the request handler, inherited by the SDK's consumer task that saves the new task.
BLOCKING_SEND: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mesh_blocking_send", default=False
)
# Fresh ids not yet saved: normally one per request in flight. A bound against a leak from
# requests that end before their first save; clearing only costs a read per id.
_MAX_FRESH = 10_000
TaskKey = tuple[str, str]  # (owner, task id)
Statement = Callable[[sqlite3.Connection], object]

_SCHEMA = """
create table if not exists a2a_tasks (
    owner text not null,
    id text not null,
    context_id text not null,
    state integer not null,
    -- status timestamp in ns, -1 without one (sorts last, like the SDK's in-memory store)
    updated_at integer not null,
    data blob not null,
    primary key (owner, id)
) without rowid;
create index if not exists a2a_tasks_by_time on a2a_tasks (owner, updated_at desc, id desc);
create index if not exists a2a_tasks_by_context on a2a_tasks (owner, context_id, updated_at desc);
"""

_UPSERT = (
    "insert into a2a_tasks (owner, id, context_id, state, updated_at, data) "
    "values (?, ?, ?, ?, ?, ?) on conflict (owner, id) do update set "
    "context_id = excluded.context_id, state = excluded.state, "
    "updated_at = excluded.updated_at, data = excluded.data"
)


def _timestamp_ns(task: Task) -> int:
    if task.HasField("status") and task.status.HasField("timestamp"):
        return int(task.status.timestamp.ToNanoseconds())
    return -1


class _FreshIds(IDGenerator):
    """Task ids for new tasks (uuid4, like the SDK's), remembered as not stored yet."""

    def __init__(self, fresh: set[str]) -> None:
        self._fresh = fresh

    def generate(self, context: IDGeneratorContext) -> str:
        task_id = str(uuid.uuid4())
        if len(self._fresh) >= _MAX_FRESH:
            self._fresh.clear()
        self._fresh.add(task_id)
        return task_id


def _fail_staged(staged: list[tuple[Statement, asyncio.Future[None]]], exc: BaseException) -> None:
    for _, future in staged:
        if future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)


def _settle_staged(
    staged: list[tuple[Statement, asyncio.Future[None]]], done: asyncio.Future[Any], task_id: str
) -> None:
    """Report an unawaited write to the statements that rode on it."""
    if done.cancelled():
        _fail_staged(staged, asyncio.CancelledError())
        return
    exc = done.exception()
    if exc is not None:
        # The final save of the task (queued after this one) reports the failure to the caller.
        log.warning("write for task %s failed: %s", task_id, exc)
        _fail_staged(staged, exc)
        return
    for _, future in staged:
        if not future.done():
            future.set_result(None)


def _parse(data: bytes) -> Task:
    task = Task()
    task.ParseFromString(data)
    return task


class SqliteTaskStore(TaskStore):
    """A2A ``TaskStore`` over ``mesh.sqlite.Database`` (table ``a2a_tasks``).

    Call ``await store.initialize()`` once before use (creates the table).
    """

    def __init__(self, db: Database, owner_resolver: OwnerResolver = resolve_user_scope) -> None:
        self._db = db
        self._owner = owner_resolver
        # In-flight tasks: the latest state (bytes), maybe newer than the row on disk.
        self._live: dict[TaskKey, bytes] = {}
        self._dirty: set[TaskKey] = set()
        # Ids generated here and never saved: get() knows they are absent.
        self._fresh: set[str] = set()
        # Statements to commit with the next persisted save of a task (idempotency keys).
        self._staged: dict[TaskKey, list[tuple[Statement, asyncio.Future[None]]]] = {}

    async def initialize(self) -> None:
        await self._db.ensure_schema("a2a_tasks", _SCHEMA)

    def id_generator(self) -> IDGenerator:
        """The task id generator for the request handler (see ``get``)."""
        return _FreshIds(self._fresh)

    def write_with_task(self, owner: str, task_id: str, fn: Statement) -> asyncio.Future[None]:
        """Commit ``fn(conn)`` in the same transaction as the next persisted save of the task
        (its first save in this process), or on its own when that save already happened.
        The future resolves once it is committed."""
        key = (owner, task_id)
        if key in self._live:
            written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._db.write_soon(fn).add_done_callback(
                lambda done: _settle_staged([(fn, written)], done, task_id)
            )
            return written
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._staged.setdefault(key, []).append((fn, future))
        return future

    async def save(self, task: Task, context: ServerCallContext) -> None:
        owner = self._owner(context)
        key = (owner, task.id)
        data = task.SerializeToString()
        state = task.status.state
        settled = state in _SETTLED
        if key in self._live and not settled:
            self._live[key] = data  # write-behind: persisted with the next settled state
            self._dirty.add(key)
            return
        # A new task of a blocking send: nobody learns of it before its final state, which is
        # committed after this row (one queue, in order), so the first write is not awaited.
        lazy = not settled and task.id in self._fresh and BLOCKING_SEND.get()
        self._fresh.discard(task.id)
        self._live[key] = data
        self._dirty.discard(key)
        row = (owner, task.id, task.context_id, int(state), _timestamp_ns(task), data)
        staged = self._staged.pop(key, [])

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(_UPSERT, row)
            for fn, _ in staged:
                fn(conn)

        if lazy:
            self._db.write_soon(write).add_done_callback(
                lambda done: _settle_staged(staged, done, task.id)
            )
            return
        try:
            await self._db.write(write)
        except BaseException as exc:
            _fail_staged(staged, exc)
            raise
        finally:
            # Settled tasks leave memory once their row is committed (or failed to be).
            if settled and self._live.get(key) is data:
                del self._live[key]
        for _, future in staged:
            if not future.done():
                future.set_result(None)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        owner = self._owner(context)
        live = self._live.get((owner, task_id))
        if live is not None:
            return _parse(live)
        if task_id in self._fresh:
            return None

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "select data from a2a_tasks where owner = ? and id = ?", (owner, task_id)
            ).fetchone()

        row = await self._db.read(read)
        return None if row is None else _parse(row[0])

    async def _write_dirty(self) -> None:
        """Persist the in-memory states of in-flight tasks (before a listing)."""
        rows = []
        for key in list(self._dirty):
            task = _parse(self._live[key])
            rows.append(
                (
                    *key,
                    task.context_id,
                    int(task.status.state),
                    _timestamp_ns(task),
                    self._live[key],
                )
            )
        self._dirty.clear()
        if rows:
            await self._db.write(lambda conn: conn.executemany(_UPSERT, rows))

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        await self._write_dirty()
        where = ["owner = ?"]
        args: list[Any] = [self._owner(context)]
        if params.context_id:
            where.append("context_id = ?")
            args.append(params.context_id)
        if params.status:
            where.append("state = ?")
            args.append(int(params.status))
        if params.HasField("status_timestamp_after"):
            where.append("updated_at >= ?")
            args.append(int(params.status_timestamp_after.ToNanoseconds()))
        count_sql = f"select count(*) from a2a_tasks where {' and '.join(where)}"
        count_args = list(args)
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise InvalidParamsError(f"Invalid page token: {params.page_token}")
            ts = -1 if cursor.timestamp_ns is None else cursor.timestamp_ns
            where.append("(updated_at, id) < (?, ?)")
            args.extend([ts, cursor.task_id])
        page_size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        # One row more than the page tells whether there is a next page.
        page_sql = (
            f"select data, updated_at, id from a2a_tasks where {' and '.join(where)} "
            "order by updated_at desc, id desc limit ?"
        )

        def read(conn: sqlite3.Connection) -> tuple[int, list[Any]]:
            total = conn.execute(count_sql, count_args).fetchone()[0]
            rows = conn.execute(page_sql, [*args, page_size + 1]).fetchall()
            return int(total), rows

        total, rows = await self._db.read(read)
        next_token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            last_ts, last_id = rows[-1][1], rows[-1][2]
            next_token = encode_list_tasks_cursor(
                ListTasksCursor(timestamp_ns=None if last_ts < 0 else last_ts, task_id=last_id)
            )
        return ListTasksResponse(
            tasks=[_parse(r[0]) for r in rows],
            next_page_token=next_token,
            total_size=total,
            page_size=page_size,
        )

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        owner = self._owner(context)
        self._live.pop((owner, task_id), None)
        self._dirty.discard((owner, task_id))
        await self._db.write(
            lambda conn: conn.execute(
                "delete from a2a_tasks where owner = ? and id = ?", (owner, task_id)
            )
        )
