"""A turn's session writes share one commit (mesh._sessions.sqlite, mesh._runner).

The runner appends a turn's intermediate events with ``durable=False`` and waits once, on the
final answer's append: a turn of a new session (create, user event, two model events, a tool
event) is one commit on a real SQLite file, and on disk when the turn returns. A queued write
that fails is not lost: the next durable append of the session, or ``sync``, raises it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import Session
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._types import Content
from tests.test_runner import LOAN_RULE, lookup_applicant, make_agent, runner_for, score


async def test_a_turn_commits_once_and_is_on_disk_when_it_returns(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        runner = runner_for(make_agent([lookup_applicant, score], LOAN_RULE), sessions=store)
        # Warm: the schema, and one turn of another session.
        await runner.run(user_id="u1", session_id="s0", message="approve APP-1 for 10")
        commits, batches = db.commits, db.batches
        result = await runner.run(user_id="u1", session_id="s1", message="approve APP-2 for 20")
        assert result.text == "Ann Lee: score 712 (B)"
        # Seven writes (the session, the user's event, three model events, two tool events)
        # in one commit; one more batch for the session's read.
        assert db.commits - commits == 1
        assert db.batches - batches == 2
    finally:
        await db.aclose()
    # Reopened: everything the turn returned is stored.
    db = await Database.open(tmp_path / "node.db")
    try:
        stored = await SqliteSessionStore(db).get("u1", "s1")
        assert stored is not None
        assert [e.author for e in stored.events] == ["user", *[e.author for e in result.events]]
        assert stored.events[1:] == result.events
    finally:
        await db.aclose()


async def test_a_queued_write_that_fails_is_raised_at_the_turns_end(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        await store.create("u1", "s1")
        ghost = Session.new("u1", "gone")  # never stored
        event = Event(author="user", content=Content.user("hi"))
        await store.append_event(ghost, event, durable=False)
        with pytest.raises(StoreError, match="no session 'gone'"):
            await store.sync(ghost)
        await store.sync(ghost)  # reported once
        # A durable append reports the failure of one queued before it.
        await store.append_event(ghost, event, durable=False)
        await store.create("u1", "gone")  # committed after the queued append failed
        with pytest.raises(StoreError, match="no session 'gone'"):
            await store.append_event(ghost, event)
        stored = await store.get("u1", "gone")
        assert stored is not None
        assert len(stored.events) == 1  # the durable one
        untouched = await store.get("u1", "s1")
        assert untouched is not None
        assert untouched.events == []
    finally:
        await db.aclose()
