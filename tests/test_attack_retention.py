"""``mesh._retention`` against what it must keep: sessions in use must not stall the sweep for
everything behind them, and a task whose push notification is still queued stays until it is
sent or given up (real SQLite files in tmp dirs)."""

from __future__ import annotations

import time
from pathlib import Path

from a2a.types import TaskState

from mesh._events import Event
from mesh._retention import RetentionPolicy, Sweeper
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._types import Content
from tests.test_retention import _put, _stores

DAY = 86400.0
DONE = TaskState.TASK_STATE_COMPLETED


async def _session(store: SqliteSessionStore, user: str, sid: str, idle_s: float) -> None:
    session = await store.create(user, sid)
    await store.append_event(session, Event(author="user", content=Content.user("hi")))
    await store.db.write(
        lambda conn: conn.execute(
            "update mesh_sessions set updated_at = ? where user_id = ? and id = ?",
            (time.time() - idle_s, user, sid),
        )
    )


async def test_a_full_batch_of_sessions_in_use_does_not_stop_the_sweep(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        sessions = SqliteSessionStore(db)
        # User a's two oldest idle sessions are in use (their turns wait for days, say): a
        # whole batch of 2. Behind them an idle one of a's, and user b's.
        await _session(sessions, "a", "a-busy-1", 5 * DAY)
        await _session(sessions, "a", "a-busy-2", 4 * DAY)
        await _session(sessions, "a", "a-idle", 3 * DAY)
        await _session(sessions, "b", "b-idle", 3 * DAY)

        def in_use(user: str, sid: str) -> bool:
            return sid.startswith("a-busy")

        policy = RetentionPolicy(tasks_for_s=None, tasks_max=None, sessions_for_s=DAY, batch=2)
        sweeper = Sweeper(policy, db, sessions=sessions, in_use=in_use)
        for _ in range(3):  # not a matter of one sweep: it never got past them
            await sweeper.sweep()
        left = {sid for (sid,) in await db.read(
            lambda conn: conn.execute("select id from mesh_sessions").fetchall()
        )}  # fmt: skip
        assert left == {"a-busy-1", "a-busy-2"}
    finally:
        await db.aclose()


async def test_a_task_whose_push_notification_is_still_queued_is_kept(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        tasks, keys, _ = await _stores(db)
        hour_ns = 3600 * 10**9
        now_ns = time.time_ns()
        await _put(tasks, keys, "delivered", DONE, now_ns - 2 * hour_ns)
        await _put(tasks, keys, "queued", DONE, now_ns - 2 * hour_ns)
        # Its final state's POST failed and waits for its next attempt (the receiver is down).
        await db.write(
            lambda conn: conn.execute(
                "insert into a2a_push_outbox (owner, task_id, config_id, version, state, body, "
                "attempts, next_at, expires_at) values ('', 'queued', 'c', 1, ?, ?, 3, ?, ?)",
                (int(DONE), b"{}", time.time() + 60, time.time() + 3600),
            )
        )
        # The count cap takes the oldest terminal tasks first, however recent they are.
        policy = RetentionPolicy(tasks_for_s=None, tasks_max=0, sessions_for_s=None)
        await Sweeper(policy, db, tasks=tasks).sweep()
        left = await db.read(lambda conn: conn.execute("select id from a2a_tasks").fetchall())
        assert [r[0] for r in left] == ["queued"]  # before: gone, with its notification
        outbox = await db.read(
            lambda conn: conn.execute("select task_id from a2a_push_outbox").fetchall()
        )
        assert [r[0] for r in outbox] == ["queued"]
        # Once the notification is sent (or given up), the next sweep takes it.
        await db.write(lambda conn: conn.execute("delete from a2a_push_outbox"))
        await Sweeper(policy, db, tasks=tasks).sweep()
        assert await tasks.count_ended() == 0
    finally:
        await db.aclose()
