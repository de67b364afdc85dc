"""Schema migrations of node.db (``Database.migrate``), the resume points of waiting tasks
(``WaitStore``) and the one recovery rule at start-up (``SqliteTaskStore.recover``), on real
SQLite files."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import Message, Role, Task, TaskState, TaskStatus

from mesh._a2a.store import SqliteTaskStore
from mesh._a2a.waits import WaitStore
from mesh._asks import Question
from mesh._errors import StoreError
from mesh._sqlite import Database

CTX = ServerCallContext()

# The DDL of a2a_tasks as mesh wrote it before migrations existed (version 1, no mesh_schema).
_V1 = """
create table a2a_tasks (owner text not null, id text not null, context_id text not null,
    state integer not null, updated_at integer not null, data blob not null,
    primary key (owner, id)) without rowid;
"""


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("select name from sqlite_master where type = 'table'").fetchall()
    finally:
        conn.close()
    return {r[0] for r in rows}


def _version(path: Path, component: str) -> int | None:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "select version from mesh_schema where component = ?", (component,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else int(row[0])


async def test_a_new_file_gets_every_version(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        await SqliteTaskStore(db).initialize()
    finally:
        await db.aclose()
    assert {"a2a_tasks", "mesh_waits", "mesh_questions", "mesh_children"} <= _tables(
        tmp_path / "node.db"
    )
    assert _version(tmp_path / "node.db", "tasks") == 7


async def test_a_file_from_before_migrations_keeps_its_tasks_and_gains_the_new_tables(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.db"
    conn = sqlite3.connect(path)
    conn.executescript(_V1)
    task = Task(id="old", context_id="c", status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
    conn.execute(
        "insert into a2a_tasks values ('', 'old', 'c', ?, 1, ?)",
        (int(TaskState.TASK_STATE_COMPLETED), task.SerializeToString()),
    )
    conn.commit()
    conn.close()
    db = await Database.open(path)
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        got = await store.get("old", CTX)
        assert got is not None
        assert got.status.state == TaskState.TASK_STATE_COMPLETED
    finally:
        await db.aclose()
    assert "mesh_waits" in _tables(path)
    assert _version(path, "tasks") == 7


async def test_each_step_runs_once_and_a_failed_step_leaves_the_version_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.db"
    db = await Database.open(path)
    try:
        steps = ["create table a (x integer);", "insert into a values (1);"]
        assert await db.migrate("demo", steps) == 2
    finally:
        await db.aclose()
    db = await Database.open(path)
    try:
        # Again in a new process: nothing runs twice; a broken third step changes nothing.
        with pytest.raises(StoreError, match="no such table"):
            await db.migrate("demo", [*steps, "insert into nowhere values (1);"])
        assert await db.read(lambda c: c.execute("select count(*) from a").fetchone()[0]) == 1
    finally:
        await db.aclose()
    assert _version(path, "demo") == 2


async def test_a_file_from_a_newer_mesh_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    db = await Database.open(path)
    try:
        await db.migrate("demo", ["create table a (x integer);", "select 1;", "select 2;"])
    finally:
        await db.aclose()
    db = await Database.open(path)
    try:
        with pytest.raises(StoreError, match="version 3, newer than this mesh knows"):
            await db.migrate("demo", ["create table a (x integer);"])
    finally:
        await db.aclose()


# -- the recovery rule --------------------------------------------------------------------------

QUESTION = Question(id="q-0", text="Approve?")


def _stored(task_id: str, state: TaskState) -> Task:
    task = Task(id=task_id, context_id=f"c-{task_id}", status=TaskStatus(state=state))
    task.history.append(Message(role=Role.ROLE_USER, message_id=f"m-{task_id}"))
    task.status.message.CopyFrom(Message(role=Role.ROLE_AGENT, message_id=f"s-{task_id}"))
    return task


async def test_the_one_recovery_rule_decides_every_task_that_is_not_terminal(
    tmp_path: Path,
) -> None:
    waiting = TaskState.TASK_STATE_INPUT_REQUIRED
    working = TaskState.TASK_STATE_WORKING
    cases = {
        # task id: (state on disk, resume point: (state, deadline) or None)
        "no-point": (working, None),
        "asked-by-a2a": (waiting, None),  # waiting without a resume point: left as it is
        "expired": (waiting, ("waiting", time.time() - 1)),
        "waits": (waiting, ("waiting", time.time() + 3600)),
        "answered": (waiting, ("resuming", None)),
        "unsaved-wait": (working, ("waiting", None)),  # crash between the point and the state
        "done": (TaskState.TASK_STATE_COMPLETED, ("resuming", None)),
    }
    db = await Database.open(tmp_path / "node.db")
    try:
        store, waits = SqliteTaskStore(db), WaitStore(db)
        await store.initialize()
        for task_id, (state, point) in cases.items():
            await store.save(_stored(task_id, state), CTX)
            if point is None:
                continue
            await waits.suspend(
                owner="",
                task_id=task_id,
                context_id=f"c-{task_id}",
                skill="review",
                request=b"",
                deadline=point[1],
                question=QUESTION,
                seq=0,
            )
            if point[0] == "resuming":
                await waits.answer("", task_id, "q-0", "yes")
    finally:
        await db.aclose()

    db = await Database.open(tmp_path / "node.db")
    try:
        store, waits = SqliteTaskStore(db), WaitStore(db)
        await store.initialize()
        recovery = await store.recover()

        async def state(task_id: str) -> TaskState:
            task = await store.get(task_id, CTX)
            assert task is not None
            return task.status.state

        # 1. no resume point: FAILED interrupted
        assert [t.id for _, t in recovery.ended] == ["no-point"]
        assert await state("no-point") == TaskState.TASK_STATE_FAILED
        assert await state("asked-by-a2a") == waiting
        # 2. deadline passed: FAILED deadline, its resume point gone
        assert [t.id for _, t in recovery.expired] == ["expired"]
        expired = await store.get("expired", CTX)
        assert expired is not None
        assert expired.status.state == TaskState.TASK_STATE_FAILED
        assert expired.metadata["error"]["reason"] == "deadline"
        assert await waits.load("", "expired") is None
        # 3. an open question: stays waiting, its deadline to be armed
        assert [(t, d is not None) for _, t, _, d in recovery.waiting] == [("waits", True)]
        assert await state("waits") == waiting
        # 4. nothing to wait for: WORKING, to run again
        assert sorted(t for _, t, _ in recovery.resume) == ["answered", "unsaved-wait"]
        assert await state("answered") == working
        answered = await waits.load("", "answered")
        assert answered is not None
        assert [r.answer for r in answered.replay()] == ["yes"]
        # The resume point of a task that ended is forgotten.
        assert await waits.load("", "done") is None
        # A second pass finds nothing new to end.
        again = await store.recover()
        assert (again.ended, again.expired) == ([], [])
    finally:
        await db.aclose()
