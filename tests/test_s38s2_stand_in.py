"""A settled typed task's stand-in is a new empty ``Task`` (session 38, helper S2).

``one_shot`` hands on ``Settled.stand_in`` in place of a held run's final task while the task
is not parsed; the watch around the store (``WatchedTaskStore``) and the store itself read its
id and state from ``Settled`` (``is_of``), not from it. Here, with real SQLite in a temp dir:
saving the stand-in does what saving the parsed task does (the stored row and every column,
GetTask's task, the running set and the waiters woken, the idempotency key committed with it,
a redacted history), over generated tasks; a task that is not a stand-in (another task saved
while a ``Settled`` is in the call's state) is read as itself. And the database's BEGIN and
COMMIT, run through one kept cursor, leave nothing open between transactions.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import Artifact, Message, Part, Role, Task, TaskState, TaskStatus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh._a2a.fastpath_json import SETTLED, Settled
from mesh._a2a.idempotency import WatchedTaskStore
from mesh._a2a.states import TERMINAL_STATES
from mesh._a2a.store import REDACTED, SqliteTaskStore
from mesh._sqlite import Database

_COLUMNS = "owner, id, context_id, state, updated_at, data, trace_id"
_STATES = sorted(int(s) for s in TERMINAL_STATES)


def _task(task_id: str, context_id: str, state: int, at_ns: int, text: str, trace: str) -> Task:
    task = Task(id=task_id, context_id=context_id, status=TaskStatus(state=state))  # type: ignore[arg-type]
    task.status.timestamp.FromNanoseconds(at_ns)
    task.history.append(
        Message(role=Role.ROLE_USER, message_id="m-" + task_id, parts=[Part(text=text)])
    )
    task.artifacts.append(Artifact(artifact_id="a1", name="answer", parts=[Part(text=text)]))
    if trace:
        task.metadata.update({"traceparent": f"00-{trace}-00f067aa0ba902b7-01"})
    return task


def _settled(task: Task, stand_in: bool) -> tuple[Settled, Task]:
    """``task`` as ``one_shot`` hands it on: its stand-in (not parsed), or parsed."""
    row = task.SerializeToString()
    metadata: dict[str, Any] = {}
    if "traceparent" in task.metadata.fields:
        metadata["traceparent"] = task.metadata.fields["traceparent"].string_value
    made = Settled(
        parsed=None if stand_in else Task.FromString(row),
        task_id=task.id,
        context_id=task.context_id,
        state=int(task.status.state),
        at_ns=task.status.timestamp.ToNanoseconds(),
        artifact_id="a1",
        name="answer",
        data={},
        text="",
        metadata=metadata,
        shape=(),
        row=row,
        stand_in=Task() if stand_in else None,
    )
    handed = made.stand_in if stand_in else made.parsed
    assert handed is not None
    assert made.is_of(handed)
    return made, handed


async def _open(tmp: Path) -> tuple[Database, SqliteTaskStore, WatchedTaskStore]:
    db = await Database.open(tmp / f"{uuid.uuid4().hex}.db")
    store = SqliteTaskStore(db)
    await store.initialize()
    await db.ensure_schema(
        "keys", "create table if not exists k (task_id text not null, n integer not null)"
    )
    return db, store, WatchedTaskStore(store)


async def _save(
    tmp: Path, task: Task, stand_in: bool, first: bool, redact: bool
) -> tuple[list[tuple[Any, ...]], Task | None, bool, bool, list[tuple[Any, ...]]]:
    """Save ``task`` settled through the watch (after an unsettled first save when ``first``),
    a waiter registered and a statement staged with it: the stored row, GetTask's task, whether
    the waiter was woken, whether the task still counts as running, the staged rows."""
    db, store, watch = await _open(tmp)
    try:
        if redact:
            store.redact(task.id, "m-" + task.id)
        context = ServerCallContext()
        if first:
            working = Task(id=task.id, context_id=task.context_id)
            working.status.state = TaskState.TASK_STATE_WORKING
            working.history.extend(task.history)
            await watch.save(working, context)
            assert watch.running(task.id)
        staged = store.write_with_task(
            "", task.id, lambda conn: conn.execute("insert into k values (?, 1)", (task.id,))
        )
        waiter = watch.waiter(task.id)
        made, handed = _settled(task, stand_in)
        context.state[SETTLED] = made
        await watch.save(handed, context)
        await staged
        rows = await db.read(
            lambda conn: [
                tuple(r)
                for r in conn.execute(f"select {_COLUMNS} from a2a_tasks order by id").fetchall()
            ]
        )
        keys = await db.read(
            lambda conn: [tuple(r) for r in conn.execute("select * from k").fetchall()]
        )
        got = await store.get(task.id, ServerCallContext())
        return rows, got, waiter.is_set(), watch.running(task.id), keys
    finally:
        await db.aclose()


_ids = st.uuids().map(str)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    task_id=_ids,
    context_id=_ids,
    state=st.sampled_from(_STATES),
    at_ns=st.integers(0, 2**62),  # an INTEGER column holds 64 bits (so does the store)
    text=st.text(max_size=20),
    trace=st.sampled_from(["", "4bf92f3577b34da6a3ce929d0e0e4736"]),
    first=st.booleans(),
    redact=st.booleans(),
)
async def test_a_stand_in_is_saved_as_its_task(
    tmp_path: Path,
    task_id: str,
    context_id: str,
    state: int,
    at_ns: int,
    text: str,
    trace: str,
    first: bool,
    redact: bool,
) -> None:
    task = _task(task_id, context_id, state, at_ns, text, trace)
    theirs = await _save(tmp_path, task, False, first, redact)
    ours = await _save(tmp_path, task, True, first, redact)
    assert ours == theirs
    rows, got, woken, running, keys = ours
    assert woken
    assert not running
    assert keys == [(task_id, 1)]
    assert got is not None
    assert got.status.state == state
    assert got.id == task_id
    if redact:
        assert [p.text for p in got.history[0].parts] == [REDACTED]
    else:
        assert got == task
    assert rows[0][:5] == ("", task_id, context_id, state, at_ns)


async def test_another_task_in_a_settled_call_is_read_as_itself(tmp_path: Path) -> None:
    """A ``Settled`` in the call's state speaks only for its own stand-in: any other task
    saved in that call is read as itself (its id, its state)."""
    db, store, watch = await _open(tmp_path)
    try:
        settled_task = _task("t-settled", "c", int(TaskState.TASK_STATE_COMPLETED), 5, "x", "")
        made, _ = _settled(settled_task, True)
        context = ServerCallContext()
        context.state[SETTLED] = made
        other = Task(id="t-other", context_id="c")
        other.status.state = TaskState.TASK_STATE_WORKING
        await watch.save(other, context)
        assert watch.running("t-other")
        assert not watch.running("t-settled")
        waiter = watch.waiter("t-other")
        other.status.state = TaskState.TASK_STATE_FAILED
        await watch.save(other, context)
        assert waiter.is_set()
        assert not watch.running("t-other")
        got = await store.get("t-other", ServerCallContext())
        assert got == other
        assert await store.get("t-settled", ServerCallContext()) is None
    finally:
        await db.aclose()


async def test_begin_and_commit_leave_nothing_open(tmp_path: Path) -> None:
    """Writes run on the loop (the kept cursor's BEGIN and COMMIT) leave no transaction and no
    statement open: another connection's checkpoint copies the whole WAL and truncates it; a
    failed write is rolled back and the next commits."""
    path = tmp_path / "n.db"
    db = await Database.open(path)
    try:
        await db.ensure_schema("t", "create table if not exists t (n integer primary key)")

        def insert(n: int) -> Callable[[sqlite3.Connection], object]:
            return lambda conn: conn.execute("insert into t values (?)", (n,))

        for n in range(20):
            await db.write(insert(n))
        with pytest.raises(Exception, match="UNIQUE"):
            await db.write(insert(3))
        await db.write(insert(20))
        assert not db._conn.in_transaction
        other = sqlite3.connect(path, isolation_level=None)
        try:
            busy, frames, copied = other.execute("pragma wal_checkpoint(truncate)").fetchone()
            assert busy == 0
            assert frames == copied
            assert other.execute("select count(*) from t").fetchone()[0] == 21
        finally:
            other.close()
        await asyncio.sleep(0)
    finally:
        await db.aclose()
