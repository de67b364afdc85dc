"""An LLM turn's task written once: a blocking send's turn on the fast path holds its task's
first save (``mark_first_save_held``) until its final one or ``DEFER_S``, so a turn that
settles sooner writes its ``a2a_tasks`` row once, with its idempotency key; a turn that asks
writes the task's first row before its resume point (``queue_first_save``), which recovery
would drop without it. The node is served in process (its real app and SQLite file), the
rows counted by triggers another connection adds to the file."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.server.context import ServerCallContext
from a2a.server.id_generator import IDGeneratorContext
from a2a.types import Task, TaskState, TaskStatus

from mesh import _sqlite
from mesh._a2a.store import SqliteTaskStore, mark_blocking_send, mark_first_save_held
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.llm_ask_agents import agent as desk_agent

HEADERS = {"A2A-Version": "1.0"}
COMPLETED = "TASK_STATE_COMPLETED"
WAITING = "TASK_STATE_INPUT_REQUIRED"


@asynccontextmanager
async def _serving(data_dir: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    """The desk agent's node in process: a client of its app, and its database file."""
    node = Node(desk_agent, NodeSettings(data_dir=data_dir, registry=None))
    async with node.app.router.lifespan_context(node.app) as state:

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                scope = {**scope, "state": dict(state or {})}
            await node.app(scope, receive, send)

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            yield client, data_dir / "node.db"


async def _send(client: httpx.AsyncClient, text: str) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": uuid.uuid4().hex,
                "parts": [{"text": text}],
            }
        },
    }
    answer = await client.post("/", json=body, headers=HEADERS)
    assert answer.status_code == 200, answer.text
    task: dict[str, Any] = answer.json()["result"]["task"]
    return task


def _run(path: Path, script: str) -> list[Any]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.executescript(script) and conn.execute("select * from counted").fetchall()
    finally:
        conn.close()
    return rows


def _count_rows(path: Path) -> None:
    """Count a2a_tasks row writes, and whether the task's row existed when each resume point
    was inserted."""
    _run(
        path,
        "create table counted (task_writes integer not null, waits_without_task integer not null);"
        "insert into counted values (0, 0);"
        "create trigger count_insert after insert on a2a_tasks "
        "begin update counted set task_writes = task_writes + 1; end;"
        "create trigger count_update after update on a2a_tasks "
        "begin update counted set task_writes = task_writes + 1; end;"
        "create trigger count_wait after insert on mesh_waits "
        "when not exists (select 1 from a2a_tasks t where t.id = new.task_id) "
        "begin update counted set waits_without_task = waits_without_task + 1; end;",
    )


def _counted(path: Path) -> tuple[int, int]:
    (row,) = _run(path, "select 1;")
    return int(row[0]), int(row[1])


def _stored(path: Path, task_id: str) -> tuple[str | None, int]:
    """The task's stored state (its enum number) and how many message keys name it."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("select state from a2a_tasks where id = ?", (task_id,)).fetchone()
        (keys,) = conn.execute(
            "select count(*) from a2a_message_keys where task_id = ?", (task_id,)
        ).fetchone()
    finally:
        conn.close()
    return (None if row is None else str(row[0])), int(keys)


async def test_a_quick_turn_writes_its_task_row_once_with_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every turn settles within DEFER_S here, however loaded the machine.
    monkeypatch.setattr(_sqlite, "DEFER_S", 30.0)
    async with _serving(tmp_path) as (client, path):
        await _send(client, "hello")  # the first request creates every table
        _count_rows(path)
        task = await _send(client, "hello")
        assert task["status"]["state"] == COMPLETED, task
        assert _counted(path) == (1, 0)  # one insert: no first state written, then replaced
        assert _stored(path, task["id"]) == ("3", 1)  # COMPLETED, its key with it
        again = await _send(client, "hello")
        assert again["status"]["state"] == COMPLETED
        assert _counted(path) == (2, 0)


async def test_a_turn_longer_than_defer_s_has_its_first_row_written_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "DEFER_S", 0.0)  # every turn outlasts it
    async with _serving(tmp_path) as (client, path):
        await _send(client, "hello")
        _count_rows(path)
        task = await _send(client, "hello")
        assert task["status"]["state"] == COMPLETED, task
        assert _counted(path) == (2, 0)  # its first state, then its final one
        assert _stored(path, task["id"]) == ("3", 1)


async def test_a_turn_that_asks_has_its_task_row_on_disk_before_its_resume_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "DEFER_S", 30.0)  # the first save is still held when it asks
    async with _serving(tmp_path) as (client, path):
        await _send(client, "hello")
        _count_rows(path)
        task = await _send(client, "pay APP-1 80,000")
        assert task["status"]["state"] == WAITING, task
        writes, waits_without_task = _counted(path)
        assert waits_without_task == 0  # the first row went in before the resume point
        assert writes == 2  # the first state, then the waiting one
        assert _stored(path, task["id"]) == ("6", 1)  # INPUT_REQUIRED, its key


async def test_a_held_first_save_is_on_disk_defer_s_after_it_was_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the hold ends it commits at once: a first save queued when it was made would have
    been on disk ``DEFER_S`` later, not twice that (its run's other writes may be gone in
    another request's batch, so nothing else brings a batch sooner)."""
    monkeypatch.setattr(_sqlite, "DEFER_S", 0.3)
    db = await _sqlite.Database.open(tmp_path / "node.db")
    store = SqliteTaskStore(db)
    await store.initialize()
    context = ServerCallContext()
    mark_blocking_send(context)
    mark_first_save_held(context)
    try:
        task_id = store.id_generator().generate(IDGeneratorContext())
        task = Task(
            id=task_id, context_id="c", status=TaskStatus(state=TaskState.TASK_STATE_WORKING)
        )
        await store.save(task, context)
        # On disk by 1.5 DEFER_S (past DEFER_S, well before 2 DEFER_S): polled until then.
        deadline = time.monotonic() + 0.45
        while not (rows := _rows_of(tmp_path / "node.db", task_id)):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        assert rows == [(int(TaskState.TASK_STATE_WORKING),)]
    finally:
        await db.aclose()


def _rows_of(path: Path, task_id: str) -> list[tuple[int]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("select state from a2a_tasks where id = ?", (task_id,)).fetchall()
    finally:
        conn.close()
