"""Retention (``mesh._retention``): old terminal tasks leave ``node.db`` with what belongs only to
them (idempotency keys, push configs and queued deliveries, resume points), running and waiting
tasks stay, the count cap keeps the newest, idle sessions go unless in use, the sweep runs in
small writes that requests' writes pass between, and bad settings name their variable.

The store tests run on both backends like tests/test_store_contract.py; the node tests start a
real ``mesh serve`` on SQLite and drive it over HTTP."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.types import Message, Role, Task, TaskPushNotificationConfig, TaskState, TaskStatus

from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.push_configs import PushConfigStore
from mesh._a2a.store import SqliteTaskStore
from mesh._errors import ConfigError
from mesh._events import Event
from mesh._retention import RetentionPolicy, Sweeper
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._settings import MeshSettings, NodeSettings
from mesh._sqlite import Database
from mesh._types import Content
from tests.support import Proc, clean_env, free_port, running, wait_for

CTX = ServerCallContext()
Opener = Callable[[], Awaitable[Database]]
DONE = TaskState.TASK_STATE_COMPLETED
HOUR_NS = 3600 * 10**9


@pytest.fixture
def db(either_database: Database) -> Database:
    """A fresh database of each backend (``tests.postgres_support.either_database``)."""
    return either_database


async def _stores(db: Database) -> tuple[SqliteTaskStore, IdempotencyKeys, PushConfigStore]:
    tasks = SqliteTaskStore(db)
    await tasks.initialize()
    keys = IdempotencyKeys(db, store=tasks)
    await keys.initialize()
    push = PushConfigStore(db)
    await push.initialize()
    return tasks, keys, push


async def _put(
    tasks: SqliteTaskStore,
    keys: IdempotencyKeys,
    task_id: str,
    state: TaskState,
    at_ns: int,
    *,
    context_id: str | None = None,
) -> None:
    """A task as the executor leaves it: its first message in the history, that message's key
    recorded with its first save, then its state at ``at_ns``."""
    message = Message(role=Role.ROLE_USER, message_id=f"m-{task_id}", parts=[new_text_part("x")])
    message.metadata.update({"caller": "tester"})
    task = Task(
        id=task_id,
        context_id=context_id or f"c-{task_id}",
        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
        history=[message],
    )
    await keys.record(("", "tester", message.message_id), task_id)
    await tasks.save(task, CTX)
    task.status.state = state
    task.status.timestamp.FromNanoseconds(at_ns)
    await tasks.save(task, CTX)


async def _rows(db: Database, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await db.read(lambda conn: conn.execute(sql).fetchall())]


async def _orphans(db: Database) -> list[tuple[Any, ...]]:
    """Rows of the task tables whose task is gone."""
    found = []
    for table in ("a2a_message_keys", "a2a_push_configs", "a2a_push_outbox", "mesh_waits"):
        found += await _rows(
            db,
            f"select '{table}', task_id from {table} x where not exists (select 1 from "
            "a2a_tasks t where t.owner = x.owner and t.id = x.task_id)",
        )
    return found


async def test_old_terminal_tasks_go_with_what_is_theirs_running_and_waiting_ones_stay(
    db: Database,
) -> None:
    tasks, keys, push = await _stores(db)
    now = time.time_ns()
    old = now - 2 * HOUR_NS
    ended = {
        "done": TaskState.TASK_STATE_COMPLETED,
        "failed": TaskState.TASK_STATE_FAILED,
        "canceled": TaskState.TASK_STATE_CANCELED,
        "rejected": TaskState.TASK_STATE_REJECTED,
    }
    for task_id, state in ended.items():
        await _put(tasks, keys, task_id, state, old)
    live = {
        "working": TaskState.TASK_STATE_WORKING,
        "asking": TaskState.TASK_STATE_INPUT_REQUIRED,
        "auth": TaskState.TASK_STATE_AUTH_REQUIRED,
        "submitted": TaskState.TASK_STATE_SUBMITTED,
    }
    for task_id, state in live.items():
        await _put(tasks, keys, task_id, state, old)
    await _put(tasks, keys, "recent", DONE, now)
    for task_id in ("done", "asking", "recent"):
        config = TaskPushNotificationConfig(url="https://example.com/hook", id="hook")
        await push.set_info(task_id, config, CTX)

    def leftovers(conn: sqlite3.Connection) -> None:
        # What a crash may leave: a resume point of a task that ended, a queued delivery.
        for task_id in ("done", "asking"):
            conn.execute(
                "insert into mesh_waits (owner, task_id, context_id, skill, kind, state, "
                "request, updated_at) values ('', ?, ?, 's', 'function', 'waiting', ?, 0)",
                (task_id, f"c-{task_id}", b""),
            )
            conn.execute(
                "insert into a2a_push_outbox (owner, task_id, config_id, version, state, body, "
                "next_at, expires_at) values ('', ?, 'hook', 1, 3, ?, 0, 0)",
                (task_id, b"{}"),
            )

    await db.write(leftovers)

    sweeper = Sweeper(RetentionPolicy(tasks_for_s=3600, tasks_max=None), db, tasks=tasks)
    report = await sweeper.sweep()

    left = {r[0] for r in await _rows(db, "select id from a2a_tasks")}
    assert left == {*live, "recent"}
    assert report.deleted["tasks"] == 4
    assert report.deleted["message_keys"] == 4
    assert report.deleted["push_configs"] == 1
    for task_id in ended:
        assert await tasks.get(task_id, CTX) is None  # GetTask: TaskNotFound
    assert await _orphans(db) == []
    assert {r[0] for r in await _rows(db, "select task_id from a2a_message_keys")} == left
    assert {r[0] for r in await _rows(db, "select task_id from a2a_push_configs")} == {
        "asking",
        "recent",
    }
    assert await _rows(db, "select task_id from mesh_waits") == [("asking",)]
    # A second sweep finds nothing more.
    assert sum((await sweeper.sweep()).deleted.values()) == 0


async def test_the_count_cap_keeps_the_newest_terminal_tasks_in_batches(db: Database) -> None:
    tasks, keys, _ = await _stores(db)
    now = time.time_ns()
    for i in range(23):
        await _put(tasks, keys, f"t{i:02d}", DONE, now - (23 - i) * 10**9)
    await _put(tasks, keys, "waiting", TaskState.TASK_STATE_INPUT_REQUIRED, now - HOUR_NS)
    policy = RetentionPolicy(tasks_for_s=None, tasks_max=10, sessions_for_s=None, batch=4)
    report = await Sweeper(policy, db, tasks=tasks).sweep()
    left = sorted(r[0] for r in await _rows(db, "select id from a2a_tasks"))
    assert left == [f"t{i:02d}" for i in range(13, 23)] + ["waiting"]
    assert report.deleted["tasks"] == 13
    assert report.batches == 4  # 4 + 4 + 4 + 1
    assert await tasks.count_ended() == 10
    assert await _orphans(db) == []


async def _session(store: SqliteSessionStore, user: str, sid: str, idle_s: float) -> None:
    session = await store.create(user, sid)
    event = Event(author="user", content=Content.user("hi"))
    await store.append_event(session, event)
    await store.db.write(
        lambda conn: conn.execute(
            "update mesh_sessions set updated_at = ? where user_id = ? and id = ?",
            (time.time() - idle_s, user, sid),
        )
    )


@pytest.mark.parametrize("max_owners", [100, 0])
async def test_idle_sessions_go_with_their_events_unless_in_use(
    db: Database, max_owners: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0: past the owners looked up one by one, one scan decides which contexts are open.
    monkeypatch.setattr("mesh._a2a.store.MAX_OWNERS", max_owners)
    tasks, keys, _ = await _stores(db)
    sessions = SqliteSessionStore(db)
    day = 86400.0
    # Three users, walked one after the other in batches of 2.
    idle = [(user, f"{user}-s{i}") for user in ("a2a", "bob", "carol") for i in range(3)]
    for user, sid in idle:
        await _session(sessions, user, sid, 2 * day)
    await _session(sessions, "bob", "fresh", 60)
    await _session(sessions, "bob", "turning", 2 * day)  # a turn of it runs here now
    await _session(sessions, "carol", "working", 2 * day)  # its context has a running task
    await _put(tasks, keys, "w", TaskState.TASK_STATE_WORKING, 0, context_id="working")
    await _session(sessions, "carol", "asking", 2 * day)  # its turn waits (resume point)
    await db.write(
        lambda conn: conn.execute(
            "insert into mesh_waits (owner, task_id, context_id, skill, kind, user_id, "
            "session_id, state, request, updated_at) values "
            "('', 'q', 'asking', 's', 'turn', 'carol', 'asking', 'waiting', ?, 0)",
            (b"",),
        )
    )

    def in_use(user: str, sid: str) -> bool:
        return (user, sid) == ("bob", "turning")

    policy = RetentionPolicy(tasks_for_s=None, tasks_max=None, sessions_for_s=day, batch=2)
    sweeper = Sweeper(policy, db, tasks=tasks, sessions=sessions, in_use=in_use)
    report = await sweeper.sweep()

    assert report.deleted["sessions"] == len(idle)
    left = set(await _rows(db, "select user_id, id from mesh_sessions"))
    assert left == {("bob", "fresh"), ("bob", "turning"), ("carol", "working"), ("carol", "asking")}
    events = set(await _rows(db, "select distinct user_id, session_id from mesh_session_events"))
    assert events == left
    assert await sessions.get("a2a", "a2a-s0") is None


async def test_a_long_sweep_runs_in_batches_that_requests_pass_between(tmp_path: Path) -> None:
    """2,000 old tasks in batches of 50 while a client keeps saving and reading tasks: some of
    its writes commit, and reads answer, while the sweep is part way (by condition: old tasks
    both deleted and left at that moment)."""
    db = await Database.open(tmp_path / "node.db")
    try:
        tasks, keys, _ = await _stores(db)
        old = time.time_ns() - 2 * HOUR_NS
        rows = []
        for i in range(2000):
            task = Task(id=f"old{i}", context_id="c", status=TaskStatus(state=DONE))
            task.status.timestamp.FromNanoseconds(old + i)
            rows.append(("", task.id, "c", int(DONE), old + i, task.SerializeToString()))
        await db.write(
            lambda conn: conn.executemany(
                "insert into a2a_tasks (owner, id, context_id, state, updated_at, data) "
                "values (?, ?, ?, ?, ?, ?)",
                rows,
            )
        )
        policy = RetentionPolicy(tasks_for_s=3600, tasks_max=None, batch=50)
        sweep = asyncio.create_task(Sweeper(policy, db, tasks=tasks).sweep())
        mid_sweep = 0
        for n in range(10_000):  # bounded; ends when the sweep does
            if sweep.done():
                break
            await _put(tasks, keys, f"new{n}", DONE, time.time_ns())
            assert await tasks.get(f"new{n}", CTX) is not None
            (left,) = await db.read(
                lambda conn: conn.execute(
                    "select count(*) from a2a_tasks where id like 'old%'"
                ).fetchone()
            )
            if 0 < left < 2000:
                mid_sweep += 1
        report = await sweep
        assert report.deleted["tasks"] == 2000
        assert report.batches >= 2000 // 50
        assert mid_sweep >= 2, "no request got through while the sweep was part way"
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MESH_RETAIN_TASKS_FOR", "soon"),
        ("MESH_RETAIN_TASKS_FOR", "-1d"),
        ("MESH_RETAIN_TASKS_MAX", "0"),
        ("MESH_RETAIN_TASKS_MAX", "lots"),
        ("MESH_RETAIN_SESSIONS_FOR", "0"),
        ("MESH_RETENTION_INTERVAL", "off"),
    ],
)
def test_bad_retention_settings_name_their_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        NodeSettings.from_env({variable: value}, agent_name="a")


def test_retention_settings_read_durations_and_off() -> None:
    env = {
        "MESH_RETAIN_TASKS_FOR": "12h",
        "MESH_RETAIN_TASKS_MAX": "off",
        "MESH_RETAIN_SESSIONS_FOR": "90",
        "MESH_RETENTION_INTERVAL": "2m",
    }
    settings = NodeSettings.from_env(env, agent_name="a")
    policy = RetentionPolicy.from_settings(settings)
    assert policy.describe() == {
        "tasks_for_s": 43200.0,
        "tasks_max": None,
        "sessions_for_s": 90.0,
        "interval_s": 120.0,
    }
    # On by default, with generous limits (docs/node.md says why).
    default = RetentionPolicy.from_settings(NodeSettings.build(MeshSettings(), agent_name="a"))
    assert default.enabled
    assert default.tasks_for_s == 7 * 86400
    assert default.tasks_max == 100_000


# -- a node -------------------------------------------------------------------------------------


def _rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    r = httpx.post(url + "/", json=body, headers={"A2A-Version": "1.0"}, timeout=30)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def _send(url: str, message_id: str, skill: str, data: dict[str, Any]) -> dict[str, Any]:
    message = {
        "role": "ROLE_USER",
        "messageId": message_id,
        "parts": [{"data": data}],
        "metadata": {"skill": skill, "caller": "tester"},
    }
    answer = _rpc(url, "SendMessage", {"message": message})
    assert "result" in answer, answer
    task: dict[str, Any] = answer["result"]["task"]
    return task


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, Path, Proc]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    argv = ["mesh", "serve", "tests.ask_agents:agent", "--port", str(port),
            "--data-dir", str(data), "--no-register"]  # fmt: skip
    env = clean_env(
        MESH_RETAIN_TASKS_FOR="2s", MESH_RETAIN_TASKS_MAX="off", MESH_RETENTION_INTERVAL="0.2"
    )
    with running(argv, name="kept", tmp=tmp_path, env=env, health=f"{url}/health") as proc:
        yield url, data / "node.db", proc


@pytest.mark.integration
def test_a_node_forgets_old_tasks_keeps_waiting_ones_and_shows_its_policy(
    node: tuple[str, Path, Proc],
) -> None:
    url, path, _ = node
    done = _send(url, "msg-echo", "echo", {"key": "k"})
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    waiting = _send(url, "msg-review", "review", {"applicant_id": "APP-1", "amount": 600000})
    assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    asked_at = time.time()

    def gone() -> bool:
        return _rpc(url, "GetTask", {"id": done["id"]}).get("error", {}).get("code") == -32001

    wait_for(gone, timeout=15, interval=0.1, what="the old task swept")

    def swept_since_it_was_old() -> bool:
        last = httpx.get(url + "/introspect").json()["runtime"]["retention"]["last_sweep"]
        return bool(last) and last["ended_at"] > asked_at + 2.5

    wait_for(swept_since_it_was_old, timeout=15, interval=0.1, what="a later sweep")
    still = _rpc(url, "GetTask", {"id": waiting["id"]})["result"]
    assert still["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"

    policy = httpx.get(url + "/introspect").json()["runtime"]["retention"]
    assert policy["tasks_for_s"] == 2.0
    assert policy["tasks_max"] is None
    assert policy["enabled"]
    metrics = httpx.get(url + "/metrics").text
    assert 'mesh_retention_deleted_total{agent="asker",kind="tasks"} 1.0' in metrics
    assert "mesh_retention_last_sweep_seconds" in metrics

    conn = sqlite3.connect(path, timeout=5)
    try:
        keys = conn.execute("select message_id, task_id from a2a_message_keys").fetchall()
    finally:
        conn.close()
    assert keys == [("msg-review", waiting["id"])]

    # The same message again after its task is gone is a new message: it runs again.
    again = _send(url, "msg-echo", "echo", {"key": "k"})
    assert again["status"]["state"] == "TASK_STATE_COMPLETED"
    assert again["id"] != done["id"]


@pytest.mark.integration
def test_a_node_forgets_idle_sessions(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    argv = ["mesh", "serve", "tests.llm_ask_agents:agent", "--port", str(port),
            "--data-dir", str(data), "--no-register"]  # fmt: skip
    env = clean_env(MESH_RETAIN_SESSIONS_FOR="1s", MESH_RETENTION_INTERVAL="0.2")
    with running(argv, name="chat", tmp=tmp_path, env=env, health=f"{url}/health"):
        message = {
            "role": "ROLE_USER",
            "messageId": uuid.uuid4().hex,
            "parts": [{"text": "hello"}],
        }
        answer = _rpc(url, "SendMessage", {"message": message})
        context = answer["result"]["task"]["contextId"]

        def sessions() -> list[Any]:
            conn = sqlite3.connect(data / "node.db", timeout=5)
            try:
                return conn.execute("select id from mesh_sessions").fetchall()
            finally:
                conn.close()

        wait_for(lambda: sessions() == [(context,)], what="the session written")
        wait_for(lambda: sessions() == [], timeout=15, what="the idle session swept")
        last = httpx.get(url + "/introspect").json()["runtime"]["retention"]["last_sweep"]
        assert json.dumps(last)  # shown
        total = httpx.get(url + "/metrics").text
        assert 'mesh_retention_deleted_total{agent="payout-desk",kind="sessions"} 1.0' in total


@pytest.mark.integration
def test_a_node_refuses_to_start_on_a_bad_retention_setting(tmp_path: Path) -> None:
    argv = ["mesh", "serve", "tests.ask_agents:agent", "--port", str(free_port()),
            "--data-dir", str(tmp_path / "d"), "--no-register"]  # fmt: skip
    proc = Proc.start(argv, name="bad", tmp=tmp_path, env=clean_env(MESH_RETAIN_TASKS_MAX="-5"))
    assert proc.popen.wait(30) != 0
    assert "MESH_RETAIN_TASKS_MAX='-5'" in proc.output()
    assert "Traceback" not in proc.output()


@pytest.mark.parametrize("incremental", [False, True])
async def test_freed_pages_are_reused_and_given_back_only_with_incremental_auto_vacuum(
    tmp_path: Path, incremental: bool
) -> None:
    path = tmp_path / "node.db"
    if incremental:
        conn = sqlite3.connect(path)
        conn.execute("pragma auto_vacuum = incremental")
        conn.execute("vacuum")
        conn.close()
    db = await Database.open(path)
    try:
        tasks, keys, _ = await _stores(db)
        old = time.time_ns() - 2 * HOUR_NS
        for i in range(300):
            await _put(tasks, keys, f"t{i}", DONE, old)

        def pages(conn: sqlite3.Connection) -> tuple[int, int]:
            count = conn.execute("pragma page_count").fetchone()[0]
            return int(count), int(conn.execute("pragma freelist_count").fetchone()[0])

        before, _ = await db.read(pages)
        report = await Sweeper(RetentionPolicy(tasks_for_s=60), db, tasks=tasks).sweep()
        after, free = await db.read(pages)
        if incremental:
            assert report.vacuumed_pages > 0
            assert (after, free) == (before - report.vacuumed_pages, 0)
        else:
            assert report.vacuumed_pages == 0
            assert after == before
            assert free > 0  # on the freelist: the next rows reuse them
            for i in range(100):
                await _put(tasks, keys, f"n{i}", DONE, time.time_ns())
            grown, fewer = await db.read(pages)
            assert grown == before
            assert fewer < free
    finally:
        await db.aclose()


@pytest.mark.postgres
async def test_replicas_sweeping_one_database_delete_each_task_once(
    request: pytest.FixtureRequest,
) -> None:
    from mesh._pg import PgDatabase

    url = request.getfixturevalue("pg_database")
    a, b = await PgDatabase.open(url), await PgDatabase.open(url)
    try:
        tasks, keys, _ = await _stores(a)
        old = time.time_ns() - 2 * HOUR_NS
        for i in range(120):
            await _put(tasks, keys, f"t{i:03d}", DONE, old + i)
        other = SqliteTaskStore(b)
        await other.initialize()
        policy = RetentionPolicy(tasks_for_s=3600, tasks_max=None, sessions_for_s=None, batch=10)
        one, two = await asyncio.gather(
            Sweeper(policy, a, tasks=tasks).sweep(), Sweeper(policy, b, tasks=other).sweep()
        )
        assert one.deleted["tasks"] + two.deleted["tasks"] == 120
        assert one.deleted["message_keys"] + two.deleted["message_keys"] == 120
        assert await _rows(a, "select id from a2a_tasks") == []
    finally:
        await a.aclose()
        await b.aclose()
