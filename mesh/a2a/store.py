"""``SqliteTaskStore``: durable A2A tasks in the node's one SQLite file.

A task is stored as its protobuf bytes (``SerializeToString``: the cheapest faithful encoding)
plus the few columns ``ListTasks`` filters and sorts on. Rows are scoped by owner (the
authenticated user, ``''`` when anonymous) exactly like the SDK's ``InMemoryTaskStore``, and the
listing order and page tokens are the SDK's: ``(status timestamp, id)`` descending.

The SDK mutates the task object it saved in place afterwards, so the bytes are taken on the
event loop before the write is handed to the database thread.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import ListTasksCursor, decode_list_tasks_cursor, encode_list_tasks_cursor

from mesh.sqlite import Database

__all__ = ["SqliteTaskStore"]

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

    async def initialize(self) -> None:
        await self._db.ensure_schema("a2a_tasks", _SCHEMA)

    async def save(self, task: Task, context: ServerCallContext) -> None:
        row = (
            self._owner(context),
            task.id,
            task.context_id,
            int(task.status.state),
            _timestamp_ns(task),
            task.SerializeToString(),
        )
        await self._db.write(lambda conn: conn.execute(_UPSERT, row))

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        owner = self._owner(context)

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "select data from a2a_tasks where owner = ? and id = ?", (owner, task_id)
            ).fetchone()

        row = await self._db.read(read)
        return None if row is None else _parse(row[0])

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
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
        await self._db.write(
            lambda conn: conn.execute(
                "delete from a2a_tasks where owner = ? and id = ?", (owner, task_id)
            )
        )
