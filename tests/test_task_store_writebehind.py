"""``SqliteTaskStore`` write-behind: in-flight states in memory, first and settled states on
disk before ``save`` returns, idempotency keys committed with the task; and, through a real
node, every task acknowledged as finished survives ``kill -9``."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx
import pytest
from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.id_generator import IDGeneratorContext
from a2a.types import (
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)

from agents.applicants import APPLICANTS
from mesh._a2a.card import build_card
from mesh._a2a.client import A2APeer
from mesh._a2a.dispatcher import SkillDispatcher
from mesh._a2a.executor import MeshExecutor
from mesh._a2a.handler import MeshRequestHandler
from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.store import SqliteTaskStore, mark_blocking_send, mark_single_write
from mesh._sqlite import Database
from tests.node_agents import agent as worker_agent
from tests.support import clean_env, eventually, free_port, running

CTX = ServerCallContext()


def _task(task_id: str, state: TaskState, note: str = "") -> Task:
    task = Task(id=task_id, context_id="ctx-1", status=TaskStatus(state=state))
    if note:
        task.metadata["note"] = note
    return task


def _disk(path: Path, task_id: str) -> TaskState | None:
    """The state another connection (a restarted process) reads."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("select state from a2a_tasks where id = ?", (task_id,)).fetchone()
    finally:
        conn.close()
    return None if row is None else TaskState.ValueType(row[0])


async def _open(tmp_path: Path) -> tuple[Database, SqliteTaskStore]:
    db = await Database.open(tmp_path / "node.db")
    store = SqliteTaskStore(db)
    await store.initialize()
    return db, store


async def test_first_and_terminal_saves_reach_disk_intermediate_ones_stay_in_memory(
    tmp_path: Path,
) -> None:
    db, store = await _open(tmp_path)
    path = tmp_path / "node.db"
    try:
        await store.save(_task("t1", TaskState.TASK_STATE_SUBMITTED), CTX)
        assert _disk(path, "t1") == TaskState.TASK_STATE_SUBMITTED
        commits = db.commits
        await store.save(_task("t1", TaskState.TASK_STATE_WORKING, "step"), CTX)
        assert db.commits == commits  # no write for an intermediate state
        assert _disk(path, "t1") == TaskState.TASK_STATE_SUBMITTED
        got = await store.get("t1", CTX)  # ... but readers in this process see it
        assert got is not None
        assert got.status.state == TaskState.TASK_STATE_WORKING
        assert got.metadata["note"] == "step"
        await store.save(_task("t1", TaskState.TASK_STATE_COMPLETED, "done"), CTX)
        assert _disk(path, "t1") == TaskState.TASK_STATE_COMPLETED
    finally:
        await db.aclose()
    # A new process (fresh store on the same file) reads the terminal task.
    db, store = await _open(tmp_path)
    try:
        got = await store.get("t1", CTX)
        assert got is not None
        assert got.status.state == TaskState.TASK_STATE_COMPLETED
        assert got.metadata["note"] == "done"
    finally:
        await db.aclose()


async def test_interrupted_state_is_persisted(tmp_path: Path) -> None:
    db, store = await _open(tmp_path)
    try:
        await store.save(_task("t2", TaskState.TASK_STATE_SUBMITTED), CTX)
        await store.save(_task("t2", TaskState.TASK_STATE_WORKING), CTX)
        await store.save(_task("t2", TaskState.TASK_STATE_INPUT_REQUIRED), CTX)
        assert _disk(tmp_path / "node.db", "t2") == TaskState.TASK_STATE_INPUT_REQUIRED
    finally:
        await db.aclose()


async def test_list_shows_in_flight_states(tmp_path: Path) -> None:
    db, store = await _open(tmp_path)
    try:
        await store.save(_task("t3", TaskState.TASK_STATE_SUBMITTED), CTX)
        await store.save(_task("t3", TaskState.TASK_STATE_WORKING), CTX)
        page = await store.list(ListTasksRequest(status=TaskState.TASK_STATE_WORKING), CTX)
        assert [t.id for t in page.tasks] == ["t3"]
    finally:
        await db.aclose()


async def test_generated_ids_are_absent_without_a_read(tmp_path: Path) -> None:
    db, store = await _open(tmp_path)
    try:
        task_id = store.id_generator().generate(IDGeneratorContext())
        batches = db.batches
        assert await store.get(task_id, CTX) is None
        assert db.batches == batches
        await store.save(_task(task_id, TaskState.TASK_STATE_SUBMITTED), CTX)
        await store.save(_task(task_id, TaskState.TASK_STATE_COMPLETED), CTX)
        # Once saved, the id is an ordinary stored task.
        got = await store.get(task_id, CTX)
        assert got is not None
        assert got.status.state == TaskState.TASK_STATE_COMPLETED
    finally:
        await db.aclose()


async def test_idempotency_key_commits_with_the_first_save(tmp_path: Path) -> None:
    db, store = await _open(tmp_path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    key = ("", "caller-a", "msg-1")
    try:
        assert await keys.claim(key) is None
        await keys.record(key, "t4")
        duplicate = asyncio.ensure_future(keys.claim(key))
        await asyncio.sleep(0)
        assert not duplicate.done()  # nothing on disk yet: the duplicate waits
        commits = db.commits
        await store.save(_task("t4", TaskState.TASK_STATE_SUBMITTED), CTX)
        assert db.commits == commits + 1  # task and key: one transaction
        assert await asyncio.wait_for(duplicate, 5) == "t4"
        keys.end(key)
    finally:
        await db.aclose()
    db, _ = await _open(tmp_path)
    try:
        again = IdempotencyKeys(db)
        await again.initialize()
        assert await again.claim(key) == "t4"
    finally:
        await db.aclose()


async def test_blocking_send_does_not_wait_for_the_first_save(tmp_path: Path) -> None:
    db, store = await _open(tmp_path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    key = ("", "caller-b", "msg-2")
    path = tmp_path / "node.db"
    blocking = ServerCallContext()
    mark_blocking_send(blocking)
    try:
        task_id = store.id_generator().generate(IDGeneratorContext())
        assert await keys.claim(key) is None
        await keys.record(key, task_id)
        await store.save(_task(task_id, TaskState.TASK_STATE_SUBMITTED), blocking)
        assert _disk(path, task_id) is None  # queued, not awaited
        await store.save(_task(task_id, TaskState.TASK_STATE_WORKING), blocking)
        await store.save(_task(task_id, TaskState.TASK_STATE_COMPLETED), blocking)
        # The final save returned: it and everything queued before it (task, key) are on disk.
        assert _disk(path, task_id) == TaskState.TASK_STATE_COMPLETED
        keys.end(key)
    finally:
        await db.aclose()
    db, _ = await _open(tmp_path)
    try:
        again = IdempotencyKeys(db)
        await again.initialize()
        assert await again.claim(key) == task_id
    finally:
        await db.aclose()


def _count_row_writes(path: Path) -> None:
    """Count every insert and update of a2a_tasks rows (another connection, one file)."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(
            "create table row_writes (n integer not null); insert into row_writes values (0);"
            "create trigger count_insert after insert on a2a_tasks "
            "begin update row_writes set n = n + 1; end;"
            "create trigger count_update after update on a2a_tasks "
            "begin update row_writes set n = n + 1; end;"
        )
    finally:
        conn.close()


def _row_writes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("select n from row_writes").fetchone()[0])
    finally:
        conn.close()


def _single_write_send() -> ServerCallContext:
    context = ServerCallContext()
    mark_blocking_send(context)
    mark_single_write(context)
    return context


async def test_a_quick_single_write_run_writes_its_task_once_with_its_key(
    tmp_path: Path,
) -> None:
    """A function skill's blocking send (``mark_single_write``) that ends at once: its first
    state is never written, the final one takes its place with the idempotency key."""
    db, store = await _open(tmp_path)
    path = tmp_path / "node.db"
    _count_row_writes(path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    key = ("", "caller-c", "msg-3")
    context = _single_write_send()
    try:
        task_id = store.id_generator().generate(IDGeneratorContext())
        assert await keys.claim(key) is None
        await store.save(_task(task_id, TaskState.TASK_STATE_SUBMITTED), context)
        await keys.record(key, task_id)  # after the first save, as the executor does
        await store.save(_task(task_id, TaskState.TASK_STATE_WORKING), context)
        got = await store.get(task_id, context)
        assert got is not None
        assert got.status.state == TaskState.TASK_STATE_WORKING
        commits = db.commits
        await store.save(_task(task_id, TaskState.TASK_STATE_COMPLETED, "done"), context)
        assert db.commits == commits + 1
        assert _disk(path, task_id) == TaskState.TASK_STATE_COMPLETED
        assert _row_writes(path) == 1  # one insert: no first state written, then replaced
        keys.end(key)
    finally:
        await db.aclose()
    db, _ = await _open(tmp_path)
    try:
        again = IdempotencyKeys(db)
        await again.initialize()
        assert await again.claim(key) == task_id  # the key rode with the final state
    finally:
        await db.aclose()


async def test_a_fast_send_through_the_handler_writes_its_task_once(tmp_path: Path) -> None:
    """The fast path gets its task ids from the store's generator (so the store knows them
    absent, and the first save of a function skill's send waits for its final one): one row
    write and one commit per send, with its idempotency key."""
    db, store = await _open(tmp_path)
    path = tmp_path / "node.db"
    _count_row_writes(path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    handler = MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(worker_agent), keys=keys),
        task_store=store,
        agent_card=build_card(worker_agent, "http://127.0.0.1:1"),
        keys=keys,
    )
    message = Message(role=Role.ROLE_USER, message_id="m-fast")
    message.parts.add().data.struct_value.update({"key": "k"})
    message.metadata.update({"skill": "echo"})
    try:
        commits = db.commits
        task = await handler.on_message_send(SendMessageRequest(message=message), CTX)
        assert isinstance(task, Task)
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert db.commits == commits + 1
        assert _row_writes(path) == 1
        assert await keys.claim(("", "", "m-fast")) == task.id
    finally:
        await handler.aclose()
        await db.aclose()


async def test_a_long_single_write_run_has_its_first_state_on_disk(tmp_path: Path) -> None:
    """A run that lasts: its first state (and key) reach the disk on their own, before the
    final one, as any blocking send's; a listing sees an unwritten first state at once."""
    db, store = await _open(tmp_path)
    path = tmp_path / "node.db"
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    key = ("", "caller-d", "msg-4")
    context = _single_write_send()
    try:
        task_id = store.id_generator().generate(IDGeneratorContext())
        assert await keys.claim(key) is None
        await store.save(_task(task_id, TaskState.TASK_STATE_SUBMITTED), context)
        await keys.record(key, task_id)
        duplicate = asyncio.ensure_future(keys.claim(key))
        await eventually(lambda: _disk(path, task_id) == TaskState.TASK_STATE_SUBMITTED)
        assert await asyncio.wait_for(duplicate, 5) == task_id  # the key is on disk with it
        await store.save(_task(task_id, TaskState.TASK_STATE_COMPLETED), context)
        assert _disk(path, task_id) == TaskState.TASK_STATE_COMPLETED
        keys.end(key)

        listed = store.id_generator().generate(IDGeneratorContext())
        await store.save(_task(listed, TaskState.TASK_STATE_SUBMITTED), _single_write_send())
        page = await store.list(ListTasksRequest(status=TaskState.TASK_STATE_SUBMITTED), CTX)
        assert [t.id for t in page.tasks] == [listed]
    finally:
        await db.aclose()


def _applicant(i: int) -> str:
    """An applicant the bureau has on file (it rejects the others)."""
    return sorted(APPLICANTS)[i % len(APPLICANTS)]


@pytest.mark.integration
async def test_acknowledged_tasks_survive_kill_9(tmp_path: Path) -> None:
    """Concurrent requests (so their writes share commits), then SIGKILL: every task the
    client saw completed is completed after the restart, and every message id replays."""
    port = free_port()
    data = tmp_path / "data"
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)]
    argv += ["--data-dir", str(data)]
    health = f"{url}/health"
    with running(argv, name="first", tmp=tmp_path, env=clean_env(), health=health) as proc:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            peer = A2APeer(http, url)
            results = await asyncio.gather(
                *(
                    peer.send(
                        {"applicant_id": _applicant(i), "amount": 10 + i}, message_id=f"k-{i}"
                    )
                    for i in range(24)
                )
            )
            await peer.aclose()
        proc.kill()
    assert all(r.state == "completed" for r in results)
    with running(argv, name="second", tmp=tmp_path, env=clean_env(), health=health):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            peer = A2APeer(http, url)
            for i, before in enumerate(results):
                after = await peer.get_task(before.task_id)
                assert after.state == "completed"
                assert after.data == before.data
                replay = await peer.send(
                    {"applicant_id": _applicant(i), "amount": 10 + i}, message_id=f"k-{i}"
                )
                assert replay.task_id == before.task_id
            await peer.aclose()


def _asked(task_id: str, state: TaskState, message_id: str) -> Task:
    """A task whose history holds the user message that started it."""
    task = _task(task_id, state)
    task.history.append(
        Message(role=Role.ROLE_USER, message_id=message_id, parts=[new_text_part("go")])
    )
    task.history[0].metadata["caller"] = "caller-c"
    return task


async def test_start_up_ends_unfinished_tasks_interrupted_and_frees_their_message_ids(
    tmp_path: Path,
) -> None:
    db, store = await _open(tmp_path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    states = {
        "t-sub": TaskState.TASK_STATE_SUBMITTED,
        "t-work": TaskState.TASK_STATE_WORKING,
        "t-input": TaskState.TASK_STATE_INPUT_REQUIRED,
        "t-done": TaskState.TASK_STATE_COMPLETED,
    }
    try:
        for task_id, state in states.items():
            await keys.record(("", "caller-c", f"m-{task_id}"), task_id)
            task = _asked(task_id, state, f"m-{task_id}")
            task.status.message.CopyFrom(Message(role=Role.ROLE_AGENT, message_id=f"s-{task_id}"))
            # A first save straight in its state: what a crash leaves on disk.
            await store.save(task, CTX)
    finally:
        await db.aclose()
    db, store = await _open(tmp_path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    try:
        batches = db.batches
        ended = await store.end_unfinished(then=IdempotencyKeys.release_ended)
        assert db.batches == batches + 1  # one transaction, one statement over the table
        assert sorted(t.id for _, t in ended) == ["t-sub", "t-work"]
        for task_id in ("t-sub", "t-work"):
            got = await store.get(task_id, CTX)
            assert got is not None
            assert got.status.state == TaskState.TASK_STATE_FAILED
            assert got.metadata["error"]["reason"] == "interrupted"
            assert "send the message again" in got.status.message.parts[0].text
            assert got.history[-1].message_id == f"s-{task_id}"  # the old status message
            assert _disk(tmp_path / "node.db", task_id) == TaskState.TASK_STATE_FAILED
            assert await keys.claim(("", "caller-c", f"m-{task_id}")) is None  # runs again
        for task_id in ("t-input", "t-done"):
            assert _disk(tmp_path / "node.db", task_id) == states[task_id]
            assert await keys.claim(("", "caller-c", f"m-{task_id}")) == task_id
        assert await store.end_unfinished() == []  # nothing left to end
    finally:
        await db.aclose()


async def test_shutdown_writes_tasks_still_in_flight_failed(tmp_path: Path) -> None:
    db, store = await _open(tmp_path)
    keys = IdempotencyKeys(db, store=store)
    await keys.initialize()
    try:
        await keys.record(("", "caller-c", "m-live"), "t-live")
        await store.save(_asked("t-live", TaskState.TASK_STATE_SUBMITTED, "m-live"), CTX)
        await store.save(_asked("t-live", TaskState.TASK_STATE_WORKING, "m-live"), CTX)
        await store.save(_asked("t-over", TaskState.TASK_STATE_SUBMITTED, "m-over"), CTX)
        await store.save(_asked("t-over", TaskState.TASK_STATE_COMPLETED, "m-over"), CTX)
        ended = await store.end_in_flight(then=IdempotencyKeys.release_ended)
        assert [t.id for _, t in ended] == ["t-live"]
        assert _disk(tmp_path / "node.db", "t-live") == TaskState.TASK_STATE_FAILED
        got = await store.get("t-live", CTX)
        assert got is not None
        assert got.metadata["error"]["reason"] == "shutdown"
        assert await keys.claim(("", "caller-c", "m-live")) is None
        assert _disk(tmp_path / "node.db", "t-over") == TaskState.TASK_STATE_COMPLETED
    finally:
        await db.aclose()
