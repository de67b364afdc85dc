"""A write committed at once (``Database.write_now``: no queued future, no turn of the loop), when
the node's writes found no company lately (a batch after batch of one write: one request at a
time), and the task store's awaited saves that take it. Writes that come together still share
one commit, and a node that was alone finds its company again through the probes. Real SQLite
files, a second real connection for the lock."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import Task, TaskState, TaskStatus

from mesh._a2a.store import SqliteTaskStore
from mesh._errors import StoreError
from mesh._sqlite import ALONE_AFTER, PROBE_EVERY, Database

SCHEMA = "create table if not exists t (k text primary key, v text not null);"
CTX = ServerCallContext()


async def _open(path: Path, *, alone: bool = True) -> Database:
    """The database, after ``ALONE_AFTER`` writes one at a time when ``alone``."""
    db = await Database.open(path)
    await db.ensure_schema("t", SCHEMA)
    if alone:
        for i in range(ALONE_AFTER):
            await db.write(_insert(f"before-{i}"))
    return db


def _on_disk(path: Path, table: str = "t", column: str = "k") -> list[str]:
    """What another process sees (a connection of its own)."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(f"select {column} from {table}").fetchall()
        return sorted(r[0] for r in rows if not str(r[0]).startswith("before-"))
    finally:
        conn.close()


def _insert(key: str) -> Any:
    def write(conn: sqlite3.Connection) -> str:
        conn.execute("insert into t (k, v) values (?, 'v')", (key,))
        return key

    return write


def _in_one_step(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` without the loop: its value if it ends in its first step (it never
    waited), else fail."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    pytest.fail("it waited for the loop")


async def test_a_write_now_is_committed_on_return(tmp_path: Path) -> None:
    db = await _open(tmp_path / "node.db")
    try:
        commits = db.commits
        assert db.write_now(_insert("a")) == (True, "a")
        assert _on_disk(tmp_path / "node.db") == ["a"]  # before the loop ran again
        assert db.commits == commits + 1
    finally:
        await db.aclose()


async def test_a_write_now_waits_for_writes_one_at_a_time_and_leaves_for_company(
    tmp_path: Path,
) -> None:
    db = await _open(tmp_path / "node.db", alone=False)
    try:
        for i in range(ALONE_AFTER):
            assert db.write_now(_insert(f"q{i}")) is None  # not yet: the queue's group commit
            await db.write(_insert(f"q{i}"))
        assert db.write_now(_insert("now")) == (True, "now")
        # Two writes that came together share one commit, and no write runs at once after.
        await asyncio.gather(db.write(_insert("x")), db.write(_insert("y")))
        assert db.write_now(_insert("later")) is None
    finally:
        await db.aclose()


async def test_every_probe_goes_through_the_queue(tmp_path: Path) -> None:
    db = await _open(tmp_path / "node.db")
    try:
        ran = [db.write_now(_insert(f"n{i}")) is not None for i in range(1, 2 * PROBE_EVERY)]
        assert ran.count(False) == 1  # the one PROBE_EVERY-th: await write() instead
        assert not ran[PROBE_EVERY - 1]
    finally:
        await db.aclose()


async def test_a_failing_write_now_reports_the_store_error_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    db = await _open(tmp_path / "node.db")
    try:

        def half(conn: sqlite3.Connection) -> None:
            conn.execute("insert into t (k, v) values ('b', 'v')")
            conn.execute("insert into t (k, v) values ('b', 'again')")  # the key is taken

        outcome = db.write_now(half)
        assert outcome is not None
        ok, error = outcome
        assert ok is False
        assert isinstance(error, StoreError)
        assert "UNIQUE" in str(error)
        assert _on_disk(tmp_path / "node.db") == []
        assert not db._conn.in_transaction
        await db.write(_insert("c"))  # the connection goes on
        assert _on_disk(tmp_path / "node.db") == ["c"]
    finally:
        await db.aclose()


async def test_a_write_now_never_overtakes_a_queued_write(tmp_path: Path) -> None:
    db = await _open(tmp_path / "node.db")
    try:
        queued = db.write_soon(_insert("first"))
        assert db.write_now(_insert("second")) is None  # not run: await write() instead
        assert await db.write(_insert("second")) == "second"
        assert queued.done()
        assert _on_disk(tmp_path / "node.db") == ["first", "second"]
    finally:
        await db.aclose()


async def test_a_write_now_is_not_run_under_a_lock_or_on_the_thread(tmp_path: Path) -> None:
    db = await _open(tmp_path / "node.db")
    other = sqlite3.connect(tmp_path / "node.db", isolation_level=None)
    try:
        other.execute("begin immediate")  # another process writing
        assert db.write_now(_insert("a")) is None
        assert not db._conn.in_transaction
        other.execute("rollback")
        with Database.on_thread():  # heavy work goes to the thread, never on the loop
            assert db.write_now(_insert("a")) is None
        assert db.write_now(_insert("a")) == (True, "a")
    finally:
        other.close()
        await db.aclose()


def _task(task_id: str) -> Task:
    task = Task(
        id=task_id,
        context_id=f"c-{task_id}",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
    )
    task.status.timestamp.FromNanoseconds(1_800_000_000 * 10**9)
    return task


async def _store(path: Path) -> tuple[Database, SqliteTaskStore]:
    db = await Database.open(path)
    store = SqliteTaskStore(db)
    await store.initialize()
    return db, store


async def test_a_settled_save_one_at_a_time_commits_without_the_loop(tmp_path: Path) -> None:
    db, store = await _store(tmp_path / "node.db")
    try:
        for i in range(ALONE_AFTER):
            await store.save(_task(f"t{i}"), CTX)
        _in_one_step(store.save(_task("now"), CTX))
        assert "now" in _on_disk(tmp_path / "node.db", "a2a_tasks", "id")
        assert store.live_state("", "now") is None  # settled: it left memory
    finally:
        await db.aclose()


async def test_saves_that_come_together_share_commits_again_after_a_quiet_spell(
    tmp_path: Path,
) -> None:
    db, store = await _store(tmp_path / "node.db")
    try:
        for i in range(ALONE_AFTER):
            await store.save(_task(f"t{i}"), CTX)
        commits = db.commits
        # Requests that came together: the first ones commit at once, until a probe waits for
        # the loop; those behind it join its batch, and from then on they share commits.
        many = 4 * PROBE_EVERY
        await asyncio.gather(*(store.save(_task(f"c{i}"), CTX) for i in range(many)))
        assert db.commits - commits < PROBE_EVERY + 2
        assert len(_on_disk(tmp_path / "node.db", "a2a_tasks", "id")) == ALONE_AFTER + many
        assert db.write_now(lambda conn: None) is None  # company found: the queue again
    finally:
        await db.aclose()
