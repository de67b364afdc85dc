"""The tasks of one trace in the task store (``SqliteTaskStore.trace``, tasks schema version 3)
and their rows (``mesh._a2a.traces``), on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

from a2a.server.context import ServerCallContext
from a2a.server.id_generator import IDGeneratorContext
from a2a.types import Message, Role, Task, TaskState, TaskStatus

from mesh._a2a.store import SqliteTaskStore, mark_blocking_send, mark_single_write
from mesh._a2a.traces import MAX_VALUE_BYTES, TraceTaskRow, tasks_of_trace
from mesh._eval.trace import Trace
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database

CTX = ServerCallContext()
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER = "0af7651916cd43dd8448eb211c80319c"


def _task(
    task_id: str,
    state: TaskState,
    *,
    meta_trace: str | None = None,
    message_trace: str | None = None,
    data: dict[str, object] | None = None,
) -> Task:
    message = Message(role=Role.ROLE_USER, message_id=f"m-{task_id}", context_id=f"c-{task_id}")
    part = message.parts.add()
    if data is not None:
        part.data.struct_value.update(data)
    else:
        part.text = "hello"
    if message_trace:
        message.metadata.update({"traceparent": f"00-{message_trace}-00f067aa0ba902b7-01"})
    task = Task(
        id=task_id, context_id=f"c-{task_id}", status=TaskStatus(state=state), history=[message]
    )
    task.status.timestamp.GetCurrentTime()
    if meta_trace:
        task.metadata.update(
            {
                "traceparent": f"00-{meta_trace}-b7ad6b7169203331-01",
                "skill": "score",
                "caller": "loan-officer",
                # As a node before the camelCase keys wrote them: read all the same.
                "caller_task": "parent-1",
                "usage": {"total_tokens": 12},
            }
        )
    return task


async def test_the_tasks_of_a_trace_running_or_ended_from_an_index(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    db = await Database.open(path)
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        # Ended: the trace from the task's metadata. Running: from its request message.
        await store.save(_task("a", TaskState.TASK_STATE_COMPLETED, meta_trace=TRACE), CTX)
        await store.save(_task("b", TaskState.TASK_STATE_WORKING, message_trace=TRACE), CTX)
        await store.save(_task("c", TaskState.TASK_STATE_COMPLETED, meta_trace=OTHER), CTX)
        await store.save(_task("d", TaskState.TASK_STATE_COMPLETED), CTX)  # no trace at all
        found = await store.trace(TRACE)
        assert [t.id for _, t, _ in found] == ["a", "b"]
        assert all(created is not None and created <= time.time_ns() for _, _, created in found)
        assert [t.id for _, t, _ in await store.trace(TRACE, limit=1)] == ["a"]
        # A later save without a traceparent keeps the trace the task had.
        await store.save(_task("b", TaskState.TASK_STATE_COMPLETED), CTX)
        assert [t.id for _, t, _ in await store.trace(TRACE)] == ["a", "b"]

        answer = await tasks_of_trace(store, db, "credit-bureau", TRACE)
        row = answer.tasks[0]
        assert (row.agent, row.skill, row.caller, row.caller_task) == (
            "credit-bureau",
            "score",
            "loan-officer",
            "parent-1",
        )
        assert (row.state, row.input, row.usage) == ("completed", "hello", {"totalTokens": 12})
        assert answer.truncated is False
        small = await tasks_of_trace(store, db, "credit-bureau", TRACE, max_bytes=600)
        assert small.truncated
        assert len(small.tasks) < 2
    finally:
        await db.aclose()
    conn = sqlite3.connect(path)
    try:
        plan = conn.execute(
            "explain query plan select data, created_at from a2a_tasks where trace_id = ? "
            "order by created_at, id limit ?",
            (TRACE, 5),
        ).fetchall()
    finally:
        conn.close()
    assert "a2a_tasks_by_trace" in " ".join(str(r) for r in plan)


async def test_a_task_saved_first_when_it_settles_started_when_its_id_was_made(
    tmp_path: Path,
) -> None:
    """A function skill's run saves its task once, at its end (``SINGLE_WRITE``): its row's
    start is when the node made its id, so the path view's duration is its run's, not 0."""
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        made = time.time_ns()
        task_id = store.id_generator().generate(IDGeneratorContext())
        await asyncio.sleep(0.02)  # the run: a duration to measure, not a wait for anything
        task = _task(task_id, TaskState.TASK_STATE_COMPLETED, meta_trace=TRACE)
        context = ServerCallContext()
        mark_blocking_send(context)
        mark_single_write(context)
        await store.save(task, context)
        ((_, _, created),) = await store.trace(TRACE)
        assert created is not None
        assert made <= created < task.status.timestamp.ToNanoseconds()
        (row,) = (await tasks_of_trace(store, db, "credit-bureau", TRACE)).tasks
        assert row.started_at is not None
        assert row.ended_at is not None
        assert row.ended_at - row.started_at >= 0.015
    finally:
        await db.aclose()


async def test_long_inputs_are_cut(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        big: dict[str, object] = {"blob": "x" * (MAX_VALUE_BYTES * 2)}
        await store.save(
            _task("a", TaskState.TASK_STATE_COMPLETED, meta_trace=TRACE, data=big), CTX
        )
        (row,) = (await tasks_of_trace(store, db, "n", TRACE)).tasks
        assert isinstance(row.input, str)
        assert row.input.endswith("...[cut]")
        assert len(json.dumps(row.input)) < MAX_VALUE_BYTES + 100
    finally:
        await db.aclose()


def test_the_token_total_of_a_trace_reads_both_spellings_of_usage() -> None:
    """A row of an upgraded node (camelCase) and one of an older node (snake_case) count alike."""

    def row(task_id: str, usage: dict[str, int]) -> TraceTaskRow:
        return TraceTaskRow(
            agent="a", task_id=task_id, context_id="c", state="completed", usage=usage
        )

    rows = [row("new", {"totalTokens": 5}), row("old", {"input_tokens": 2, "output_tokens": 3})]
    assert Trace("t", rows).total_tokens == 10


async def test_a_traces_tool_calls_are_read_on_either_backend(
    either_database: Database,
) -> None:
    """A node's trace answer reads its tasks' tool calls from the session store's events, and
    answers without them when it has no sessions: on PostgreSQL too, which has no
    ``sqlite_master`` (it answered /v1/traces/{id}/tasks with a 500 there)."""
    backend = either_database
    store = SqliteTaskStore(backend)
    await store.initialize()
    await store.save(_task("t", TaskState.TASK_STATE_WORKING, meta_trace=TRACE), CTX)
    # No session store on this node yet: the task, without tool calls.
    (row,) = (await tasks_of_trace(store, backend, "credit-bureau", TRACE)).tasks
    assert (row.task_id, row.tool_calls) == ("t", [])

    # The session store makes its tables as it is first used.
    assert await SqliteSessionStore(backend).get("loan-officer", "c-t") is None
    now = time.time()
    parts = [
        {"function_call": {"id": "call-1", "name": "lookup", "args": {"applicant_id": "APP-1"}}},
        {"function_response": {"id": "call-1", "name": "lookup", "response": {"score": 7}}},
    ]
    event = {"invocation_id": "inv-1", "timestamp": now, "content": {"parts": parts}}

    def add(conn: sqlite3.Connection) -> None:
        # The session of the task's context, its user the task's caller (no owner here).
        conn.execute(
            "insert into mesh_sessions (user_id, id, created_at, updated_at) values (?, ?, ?, ?)",
            ("loan-officer", "c-t", now, now),
        )
        conn.execute(
            "insert into mesh_session_events (user_id, session_id, event_id, author, timestamp, "
            "data) values (?, ?, ?, ?, ?, ?)",
            ("loan-officer", "c-t", "e-1", "credit-bureau", now, json.dumps(event)),
        )

    await backend.write(add)
    await store.save(_task("t", TaskState.TASK_STATE_COMPLETED, meta_trace=TRACE), CTX)
    (row,) = (await tasks_of_trace(store, backend, "credit-bureau", TRACE)).tasks
    assert row.state == "completed"
    assert [(c.name, c.args, c.ok) for c in row.tool_calls] == [
        ("lookup", {"applicant_id": "APP-1"}, True)
    ]
