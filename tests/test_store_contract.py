"""The store contract, one suite over both backends: the node's SQL stores (tasks, idempotency
keys, sessions, migrations) behave the same on SQLite (the default) and on PostgreSQL
(``--store postgresql://...``, mesh._pg). Every test opens two handles on one database, as two
processes (replicas) would: what one writes, the other reads."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import ListTasksRequest, Task, TaskState, TaskStatus

from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.store import SqliteTaskStore
from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import Session
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._types import Content

CTX = ServerCallContext()
Opener = Callable[[], Awaitable[Database]]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens handles on one fresh database of the backend (closed after the test)."""
    opened: list[Database] = []
    if request.param == "sqlite":
        path = str(tmp_path / "node.db")

        async def open_sqlite() -> Database:
            opened.append(await Database.open(path))
            return opened[-1]

        yield open_sqlite
    else:
        from mesh._pg import PgDatabase

        url = request.getfixturevalue("pg_database")

        async def open_pg() -> Database:
            opened.append(await PgDatabase.open(url))
            return opened[-1]

        yield open_pg
    for db in opened:
        await db.aclose()


async def _tasks(opener: Opener) -> SqliteTaskStore:
    store = SqliteTaskStore(await opener())
    await store.initialize()
    return store


def _task(task_id: str, state: TaskState, context_id: str = "ctx-1", at: int = 0) -> Task:
    task = Task(id=task_id, context_id=context_id, status=TaskStatus(state=state))
    if at:
        task.status.timestamp.FromNanoseconds(at)
    # Characters a dialect translation must leave alone in data.
    task.metadata["note"] = "100% sure? '%s' ; --"
    return task


async def test_a_task_saved_on_one_handle_is_read_on_the_other(opener: Opener) -> None:
    a, b = await _tasks(opener), await _tasks(opener)
    await a.save(_task("t1", TaskState.TASK_STATE_SUBMITTED), CTX)
    found = await b.get("t1", CTX)
    assert found is not None
    assert found.status.state == TaskState.TASK_STATE_SUBMITTED
    assert found.metadata["note"] == "100% sure? '%s' ; --"
    await a.save(_task("t1", TaskState.TASK_STATE_COMPLETED), CTX)
    found = await b.get("t1", CTX)
    assert found is not None
    assert found.status.state == TaskState.TASK_STATE_COMPLETED
    assert await b.get("nope", CTX) is None
    await b.delete("t1", CTX)
    assert await a.get("t1", CTX) is None


async def test_listing_filters_orders_and_pages_the_same(opener: Opener) -> None:
    a, b = await _tasks(opener), await _tasks(opener)
    base = 1_700_000_000_000_000_000  # ns: past 32 bits, as status timestamps are
    for i in range(5):
        ctx = "ctx-?" if i % 2 else "ctx-%"
        await a.save(_task(f"t{i}", TaskState.TASK_STATE_COMPLETED, ctx, base + i), CTX)
    await a.save(_task("t9", TaskState.TASK_STATE_FAILED, "ctx-?", base + 9), CTX)
    page = await b.list(ListTasksRequest(page_size=2), CTX)
    assert [t.id for t in page.tasks] == ["t9", "t4"]
    assert page.total_size == 6
    rest = await b.list(ListTasksRequest(page_size=10, page_token=page.next_page_token), CTX)
    assert [t.id for t in rest.tasks] == ["t3", "t2", "t1", "t0"]
    assert rest.next_page_token == ""
    odd = await b.list(ListTasksRequest(context_id="ctx-?"), CTX)
    assert [t.id for t in odd.tasks] == ["t9", "t3", "t1"]
    failed = await b.list(ListTasksRequest(status=TaskState.TASK_STATE_FAILED), CTX)
    assert [t.id for t in failed.tasks] == ["t9"]


async def test_a_terminal_state_is_final(opener: Opener) -> None:
    # Replica B cancels a task replica A still runs: A's own end later does not undo it.
    a, b = await _tasks(opener), await _tasks(opener)
    await a.save(_task("t1", TaskState.TASK_STATE_WORKING), CTX)
    await b.save(_task("t1", TaskState.TASK_STATE_CANCELED), CTX)
    await a.save(_task("t1", TaskState.TASK_STATE_COMPLETED), CTX)
    found = await b.get("t1", CTX)
    assert found is not None
    assert found.status.state == TaskState.TASK_STATE_CANCELED
    # The same state may be written again (a reason added to a cancel).
    again = _task("t1", TaskState.TASK_STATE_CANCELED)
    again.metadata["error"] = {"reason": "canceled"}
    await b.save(again, CTX)
    found = await a.get("t1", CTX)
    assert found is not None
    assert found.metadata["error"]["reason"] == "canceled"


async def test_a_message_key_recorded_on_one_handle_is_a_duplicate_on_the_other(
    opener: Opener,
) -> None:
    store_a = await _tasks(opener)
    keys_a = IdempotencyKeys(store_a._db, store=store_a)
    db_b = await opener()
    keys_b = IdempotencyKeys(db_b)
    for k in (keys_a, keys_b):
        # Two handles on one database are replicas (on SQLite too: the SQL is the same); a
        # node's own SQLite handle is not shared and skips the read of a key it never saw.
        k.shared = True
        await k.initialize()
    key = ("", "caller", "msg-1")
    assert await keys_a.claim(key) is None
    await keys_a.record(key, "t1")
    await store_a.save(_task("t1", TaskState.TASK_STATE_SUBMITTED), CTX)  # the key rides here
    assert await keys_b.claim(key) == "t1"
    keys_b.end(key)
    # First writer wins: the same key recorded for another task keeps the first.
    other = ("", "caller", "msg-2")
    await keys_b.record(other, "t2")
    await keys_b.record(other, "t3")
    assert await keys_a.claim(other) == "t2"


async def test_a_message_key_is_claimed_before_the_run_across_handles(opener: Opener) -> None:
    # Replicas: the first claim inserts the key row (a mark); a claim on the other handle
    # meanwhile waits for the task id, and a claim that ended without a task frees the key.
    import asyncio

    stores = [await _tasks(opener), await _tasks(opener)]
    keys = [IdempotencyKeys(s._db, store=s) for s in stores]
    for k in keys:
        k.shared = True  # on SQLite too: the SQL is the same on both backends
        await k.initialize()
    key = ("", "caller", "msg-c")
    assert await keys[0].claim(key) is None
    waiting = asyncio.ensure_future(keys[1].claim(key))
    await asyncio.sleep(0.1)  # several polls of the other handle: it must still wait
    assert not waiting.done()
    await keys[0].record(key, "t1")
    await stores[0].save(_task("t1", TaskState.TASK_STATE_SUBMITTED), CTX)  # the key rides here
    assert await asyncio.wait_for(waiting, 10) == "t1"
    keys[0].end(key)
    keys[1].end(key)
    assert await keys[1].claim(key) == "t1"  # the recorded key outlives its send
    keys[1].end(key)
    # A send that ends without a task: its claim is deleted, the other handle takes the key.
    other = ("", "caller", "msg-d")
    assert await keys[0].claim(other) is None
    keys[0].end(other)
    assert await asyncio.wait_for(keys[1].claim(other), 10) is None


async def test_push_configs_and_the_outbox_are_shared_across_handles(opener: Opener) -> None:
    # A config set on one replica, the task's states queued and claimed on either: each state
    # queued once per config (a newer one replaces it, its version bumped), each row sent once.
    from a2a.types import TaskPushNotificationConfig

    from mesh._a2a.push_configs import PushConfigStore
    from mesh._a2a.push_queue import claim, delete_sent, queue_settled

    stores = [await _tasks(opener), await _tasks(opener)]
    dbs = [s._db for s in stores]
    configs = [PushConfigStore(db) for db in dbs]
    for c in configs:
        await c.initialize()
    hook = TaskPushNotificationConfig(id="c1", url="http://127.0.0.1:9/hook", token="tok")
    await configs[0].set_info("t1", hook, CTX)
    assert [c.url for c in await configs[1].get_info("t1", CTX)] == [hook.url]
    await stores[0].save(_task("t1", TaskState.TASK_STATE_INPUT_REQUIRED, at=1), CTX)

    def queue(db: Database) -> Awaitable[tuple[set[str], set[str]]]:
        return db.write(lambda conn: queue_settled(conn, None, 100.0, 1000.0))

    assert await queue(dbs[0]) == (set(), {"t1"})
    assert await queue(dbs[1]) == (set(), {"t1"})  # already queued: not again
    rows = await dbs[1].read(
        lambda conn: conn.execute("select version, state from a2a_push_outbox").fetchall()
    )
    assert [tuple(r) for r in rows] == [(1, int(TaskState.TASK_STATE_INPUT_REQUIRED))]
    await stores[1].save(_task("t1", TaskState.TASK_STATE_COMPLETED, at=2), CTX)
    assert (await queue(dbs[1]))[0] == {"t1"}
    rows = await dbs[0].read(
        lambda conn: conn.execute("select version, state from a2a_push_outbox").fetchall()
    )
    assert [tuple(r) for r in rows] == [(2, int(TaskState.TASK_STATE_COMPLETED))]
    taken = await dbs[0].write(lambda conn: claim(conn, 100.0, 10, 200.0))
    again = await dbs[1].write(lambda conn: claim(conn, 100.0, 10, 200.0))
    assert [d.version for d in taken.deliveries] == [2]
    assert taken.deliveries[0].config.token == "tok"
    assert again.deliveries == []  # claimed by the other replica until 200
    await dbs[1].write(lambda conn: delete_sent(conn, taken.deliveries[0]))
    assert (await dbs[0].write(lambda conn: claim(conn, 300.0, 10, 400.0))).pending == 0
    await configs[1].delete_info("t1", CTX, "c1")
    assert await configs[0].get_info("t1", CTX) == []


async def test_a_session_continues_on_the_other_handle(opener: Opener) -> None:
    a, b = SqliteSessionStore(await opener()), SqliteSessionStore(await opener())
    session = await a.create("u1", "s1", state={"lang": "en", "n": 1})
    with pytest.raises(StoreError, match="already exists"):
        await b.create("u1", "s1")
    await a.append_event(session, _event("one", n=2, city="Lyon"))
    on_b = await b.get("u1", "s1")
    assert on_b is not None
    assert on_b.state == {"lang": "en", "n": 2, "city": "Lyon"}
    on_b = await b.append_event(on_b, _event("two", lang=None))
    again = await a.get("u1", "s1")
    assert again is not None
    assert [e.text for e in again.events] == ["one", "two"]
    assert again.state == {"lang": None, "n": 2, "city": "Lyon"}
    assert isinstance(again.created_at, float)
    listed = await b.list_sessions("u1")
    assert [(s.id, s.event_count) for s in listed] == [("s1", 2)]
    assert await b.count() == 1
    assert await b.delete("u1", "s1") is True
    assert await a.get("u1", "s1") is None
    assert await a.delete("u1", "s1") is False


async def test_a_turns_queued_session_writes_land_together(opener: Opener) -> None:
    """A turn's queued writes (a create and events that change no state, one group) and its
    final append are on the other handle once that append returns; an event queued for a
    session that does not exist is an error at the session's sync, on both backends."""
    a, b = SqliteSessionStore(await opener()), SqliteSessionStore(await opener())
    session = await a.create("u1", "s2", durable=False)
    await a.append_event(session, _event("ask"), durable=False)
    await a.append_event(session, _event("tool"), durable=False)
    await a.append_event(session, _event("answer", done=True))
    on_b = await b.get("u1", "s2")
    assert on_b is not None
    assert [e.text for e in on_b.events] == ["ask", "tool", "answer"]
    assert on_b.state == {"done": True}
    ghost = Session.new("u1", "gone")
    await a.append_event(ghost, _event("lost?"), durable=False)
    with pytest.raises(StoreError, match="no session 'gone'"):
        await a.sync(ghost)


def _event(text: str, **delta: object) -> Event:
    return Event(author="user", content=Content.user(text), state_delta=dict(delta))


async def test_migrations_are_versioned_and_a_newer_database_is_refused(opener: Opener) -> None:
    a, b = await opener(), await opener()
    steps = ["create table contract_t (id text primary key, n integer not null) without rowid"]
    assert await a.migrate("contract", steps) == 1
    await a.write(lambda conn: conn.execute("insert into contract_t values (?, ?)", ("x", 2**40)))
    two = [*steps, "alter table contract_t add column note text"]
    assert await b.migrate("contract", two) == 2
    await b.write(
        lambda conn: conn.execute("update contract_t set note = ? where id = ?", ("hi", "x"))
    )
    row = await b.read(lambda conn: conn.execute("select n, note from contract_t").fetchone())
    assert (row[0], row["note"]) == (2**40, "hi")
    c = await opener()
    with pytest.raises(StoreError, match="newer than this mesh knows"):
        await c.migrate("contract", steps)


async def test_a_failing_write_is_rolled_back_alone(opener: Opener) -> None:
    db = await opener()
    await db.migrate("contract", ["create table contract_u (id text primary key)"])

    def bad(conn: object) -> None:
        conn.execute("insert into contract_u values (?)", ("b",))  # type: ignore[attr-defined]
        conn.execute("insert into contract_u values (?)", ("a",))  # type: ignore[attr-defined]

    await db.write(lambda conn: conn.execute("insert into contract_u values (?)", ("a",)))
    good = db.write_soon(lambda conn: conn.execute("insert into contract_u values (?)", ("c",)))
    with pytest.raises(StoreError):
        await db.write(bad)
    await good
    rows = await db.read(
        lambda conn: conn.execute("select id from contract_u order by id").fetchall()
    )
    assert [r[0] for r in rows] == ["a", "c"]


@pytest.mark.postgres
def test_the_suite_runs_its_own_postgres(pg_database: str) -> None:
    import psycopg

    with psycopg.connect(pg_database) as conn:
        row = conn.execute("select current_setting('listen_addresses'), version()").fetchone()
    assert row is not None
    assert row[0] == "127.0.0.1"
    assert row[1].startswith("PostgreSQL")


def test_a_password_never_shows() -> None:
    pytest.importorskip("psycopg")
    from mesh._pg import redacted

    url = "postgresql://mesh:s3cr%40t@db.example:5432/mesh?sslmode=require"
    assert redacted(url) == "postgresql://mesh:***@db.example:5432/mesh?sslmode=require"
    assert redacted("postgresql://db/mesh") == "postgresql://db/mesh"


def test_the_store_setting_takes_a_postgresql_url_and_hides_it() -> None:
    from mesh._errors import ConfigError
    from mesh._settings import MeshSettings, NodeSettings

    url = "postgresql://mesh:hunter2@db:5432/bureau"
    env = MeshSettings.from_env({"MESH_STORE": url})
    assert "hunter2" not in repr(env)
    for settings in (
        NodeSettings.build(env, agent_name="a", no_register=True),
        NodeSettings.build(MeshSettings.from_env({}), agent_name="a", store=url, no_register=True),
    ):
        assert (settings.store, settings.store_url) == ("postgresql", url)
        assert "hunter2" not in repr(settings)
    plain = NodeSettings.build(MeshSettings.from_env({}), agent_name="a", no_register=True)
    assert (plain.store, plain.store_url) == ("sqlite", None)
    with pytest.raises(ConfigError, match="use 'sqlite' or a postgresql://") as bad:
        NodeSettings.build(env, agent_name="a", store="mysql://u:hunter2@db/x")
    assert "hunter2" not in str(bad.value)


@pytest.mark.postgres
async def test_a_connection_the_server_dropped_is_opened_again(pg_database: str) -> None:
    # A restart, a failover or an idle timeout: the next request works, on a new connection.
    import psycopg

    from mesh._pg import PgDatabase

    db = await PgDatabase.open(pg_database)
    try:
        store = SqliteTaskStore(db)
        await store.initialize()
        await store.save(_task("t1", TaskState.TASK_STATE_SUBMITTED), CTX)
        for step in ("read", "write"):
            # A reader's connection (the pool's), then the writer's.
            on = db.read if step == "read" else db.write
            pid = await on(lambda conn: conn.execute("select pg_backend_pid()").fetchone()[0])
            with psycopg.connect(pg_database, autocommit=True) as admin:
                admin.execute("select pg_terminate_backend(%s)", (pid,))
            if step == "read":  # a store of its own: this one serves its live task from memory
                found = await SqliteTaskStore(db).get("t1", CTX)
                assert found is not None
                assert found.status.state == TaskState.TASK_STATE_SUBMITTED
            else:
                await store.save(_task("t1", TaskState.TASK_STATE_COMPLETED), CTX)
        assert db._conn.reconnects == 1  # type: ignore[attr-defined]
        assert db.read_retries == 1
        found = await SqliteTaskStore(db).get("t1", CTX)
        assert found is not None
        assert found.status.state == TaskState.TASK_STATE_COMPLETED
    finally:
        await db.aclose()
