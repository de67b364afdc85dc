"""Versions 6 and 7 of the ``tasks`` component, the indexes a task's row enters made cheaper to
enter. 6: retention's index ``a2a_tasks_ended`` made again with its condition as comparisons
instead of ``state in (...)``, which SQLite evaluated at every insert of a task's row by
building a temporary b-tree of the four states first (~30,000 instructions a row). 7 (SQLite):
the listing's index ``a2a_tasks_by_time`` ascending, so a new task's entry lands at its right
end. A database at version 5 is migrated in place and retention (the count, the oldest-first
deletes) still finds exactly the terminal tasks and ListTasks pages them in the same order, on
both backends; on SQLite the indexes still serve those reads, without a sort, and a task's
insert builds no temporary b-tree."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import ListTasksRequest, Task, TaskState, TaskStatus

from mesh._a2a import store
from mesh._a2a.push_configs import PushConfigStore
from mesh._a2a.store import SqliteTaskStore
from mesh._a2a.waits import TASKS_SCHEMA_V2
from mesh._sqlite import Database

CTX = ServerCallContext()
Opener = Callable[[], Awaitable[Database]]
HOUR_NS = 3600 * 10**9
NOW_NS = 1_800_000_000 * 10**9
S = TaskState
# Every state a stored task can be in, the terminal ones (retention's) marked.
STATES = {
    S.TASK_STATE_SUBMITTED: False,
    S.TASK_STATE_WORKING: False,
    S.TASK_STATE_INPUT_REQUIRED: False,
    S.TASK_STATE_AUTH_REQUIRED: False,
    S.TASK_STATE_COMPLETED: True,
    S.TASK_STATE_FAILED: True,
    S.TASK_STATE_CANCELED: True,
    S.TASK_STATE_REJECTED: True,
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the backend's database (the same one each time): as a node starting again."""
    if request.param == "sqlite":
        return lambda: Database.open(tmp_path / "node.db")
    from mesh._pg import PgDatabase

    url = request.getfixturevalue("pg_database")
    return lambda: PgDatabase.open(url)


def _v5_steps(db: Database) -> list[str]:
    """The steps a version-5 mesh ran for the tasks component, as it ran them."""
    v5 = store.TASKS_SCHEMA_V5 if db.dialect == "sqlite" else store._NO_OP
    return [store._SCHEMA, TASKS_SCHEMA_V2, store.TASKS_SCHEMA_V3, store.TASKS_SCHEMA_V4, v5]


def _row(task_id: str, state: TaskState, at_ns: int) -> tuple[object, ...]:
    task = Task(id=task_id, context_id=f"c-{task_id}", status=TaskStatus(state=state))
    task.status.timestamp.FromNanoseconds(at_ns)
    return ("", task_id, task.context_id, int(state), at_ns, task.SerializeToString(), None, at_ns)


async def _at_version_5(db: Database) -> list[tuple[object, ...]]:
    """The database as a version-5 node left it: two tasks of every state, an old and a new,
    and three running ones of one status time (the listing orders them by id)."""
    assert await db.migrate("tasks", _v5_steps(db)) == 5
    rows = []
    for i, state in enumerate(STATES):
        rows.append(_row(f"old-{i}", state, NOW_NS - 10 * HOUR_NS + i))
        rows.append(_row(f"new-{i}", state, NOW_NS + i))
    rows += [_row(f"tie-{i}", S.TASK_STATE_WORKING, NOW_NS - 5 * HOUR_NS) for i in range(3)]

    def write(conn: sqlite3.Connection) -> None:
        conn.executemany("insert into a2a_tasks values (?, ?, ?, ?, ?, ?, ?, ?)", rows)

    await db.write(write)
    return rows


async def _index_sql(db: Database) -> str:
    if db.dialect == "sqlite":
        sql = "select sql from sqlite_schema where name = 'a2a_tasks_ended'"
    else:
        sql = "select indexdef from pg_indexes where indexname = 'a2a_tasks_ended'"
    row = await db.read(lambda conn: conn.execute(sql).fetchone())
    return str(row[0]).lower()


def _listed(index_sql: str) -> bool:
    """Whether the index's condition is a list (SQLite's ``in (...)``, as PostgreSQL shows it:
    ``= any (array[...])``)."""
    return " in (" in index_sql or "any (array" in index_sql


async def test_a_version_5_database_migrates_and_retention_finds_the_terminal_tasks(
    opener: Opener,
) -> None:
    old = await opener()
    try:
        rows = await _at_version_5(old)
        assert _listed(await _index_sql(old))
    finally:
        await old.aclose()
    db = await opener()  # the node starts again, on this code
    try:
        await _migrated_and_swept(db, rows)
    finally:
        await db.aclose()


async def _migrated_and_swept(db: Database, rows: list[tuple[object, ...]]) -> None:
    tasks = SqliteTaskStore(db)
    await tasks.initialize()  # versions 6 and 7
    await PushConfigStore(db).initialize()  # the outbox retention's delete looks into
    version = await db.read(
        lambda conn: conn.execute(
            "select version from mesh_schema where component = 'tasks'"
        ).fetchone()
    )
    assert int(version[0]) == 7
    index = await _index_sql(db)
    assert not _listed(index)
    assert "state = 3" in index
    assert "state = 7" in index

    terminal = sum(STATES.values())
    assert await tasks.count_ended() == 2 * terminal
    deleted = await tasks.delete_ended(NOW_NS - HOUR_NS, limit=100)
    assert sorted(t.id for _, t in deleted) == sorted(
        f"old-{i}" for i, ended in enumerate(STATES.values()) if ended
    )
    assert await tasks.count_ended() == terminal
    gone = {t.id for _, t in deleted}
    kept = [r for r in rows if r[1] not in gone]
    left = await db.read(lambda conn: conn.execute("select id from a2a_tasks").fetchall())
    assert sorted(r[0] for r in left) == sorted(str(r[1]) for r in kept)
    # ListTasks: newest first (ties by id, descending), paged, as before; on SQLite through
    # the ascending index.
    listed: list[str] = []
    token = ""
    while True:
        page = await tasks.list(ListTasksRequest(page_size=3, page_token=token), CTX)
        listed += [t.id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    newest_first = sorted(kept, key=lambda r: (r[4], r[1]), reverse=True)
    assert listed == [r[1] for r in newest_first]
    # A terminal state is still final for the upsert (its condition was rewritten too).
    await tasks.save(_task("new-4", S.TASK_STATE_WORKING), CTX)  # new-4 is COMPLETED
    stored = await db.read(
        lambda conn: conn.execute("select state from a2a_tasks where id = 'new-4'").fetchone()
    )
    assert stored[0] == int(S.TASK_STATE_COMPLETED)


def _task(task_id: str, state: TaskState) -> Task:
    task = Task(id=task_id, context_id=f"c-{task_id}", status=TaskStatus(state=state))
    task.status.timestamp.FromNanoseconds(NOW_NS + HOUR_NS)
    return task


async def test_the_index_serves_retention_and_an_insert_builds_no_temporary_b_tree(
    tmp_path: Path,
) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        await SqliteTaskStore(db).initialize()
        await PushConfigStore(db).initialize()

        def plans(conn: sqlite3.Connection) -> tuple[str, str, list[str]]:
            count = conn.execute(
                f"explain query plan select count(*) from a2a_tasks where {store._TERMINAL_SQL}"
            ).fetchall()
            oldest = conn.execute(
                f"explain query plan select id from a2a_tasks where {store._TERMINAL_SQL} "
                "and updated_at < ? order by updated_at limit ?",
                (1, 1),
            ).fetchall()
            ops = conn.execute("explain " + store._UPSERT, _row("t", S.TASK_STATE_COMPLETED, 1))
            return (
                str([tuple(r) for r in count]),
                str([tuple(r) for r in oldest]),
                [r[1] for r in ops],
            )

        count, oldest, ops = await db.read(plans)
        assert "a2a_tasks_ended" in count
        assert "a2a_tasks_ended" in oldest
        assert "TEMP B-TREE" not in oldest
        # The condition of the partial index and of the upsert's conflict are comparisons:
        # nothing builds a b-tree of constants (OP_OpenEphemeral) per row.
        assert "OpenEphemeral" not in ops
    finally:
        await db.aclose()


async def test_the_listing_index_is_ascending_and_listings_read_it_backwards_without_a_sort(
    tmp_path: Path,
) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        await SqliteTaskStore(db).initialize()
        order = "order by updated_at desc, id desc limit ?"
        wheres = {
            "owner = ?": ("",),
            "owner = ? and (updated_at, id) < (?, ?)": ("", 1, "t"),  # a page token
            "owner = ? and updated_at >= ?": ("", 1),
            "owner = ? and state = ?": ("", 3),
        }

        def read(conn: sqlite3.Connection) -> tuple[str, dict[str, str]]:
            sql = conn.execute(
                "select sql from sqlite_schema where name = 'a2a_tasks_by_time'"
            ).fetchone()[0]
            found = {}
            for where, args in wheres.items():
                plan = conn.execute(
                    f"explain query plan select data from a2a_tasks where {where} {order}",
                    (*args, 101),
                ).fetchall()
                found[where] = str([tuple(r) for r in plan])
            return str(sql).lower(), found

        sql, plans = await db.read(read)
        assert sql.endswith("(owner, updated_at, id)")
        for where, plan in plans.items():
            assert "a2a_tasks_by_time" in plan, where
            assert "TEMP B-TREE" not in plan, where
    finally:
        await db.aclose()
