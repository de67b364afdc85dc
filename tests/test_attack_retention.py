"""``mesh._retention`` against the sessions it must keep: sessions in use must not stall the
sweep for everything behind them (a real SQLite file in a tmp dir)."""

from __future__ import annotations

import time
from pathlib import Path

from mesh._events import Event
from mesh._retention import RetentionPolicy, Sweeper
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._types import Content

DAY = 86400.0


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
