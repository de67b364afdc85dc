"""A turn's session writes share one commit (mesh._sessions.sqlite, mesh._runner).

The runner appends a turn's intermediate events with ``durable=False`` and waits once, on the
final answer's append: a turn of a new session (create, user event, two model events, a tool
event) is one commit on a real SQLite file, and on disk when the turn returns. A queued write
that fails is not lost: the next durable append of the session, or ``sync``, raises it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import mesh._sqlite
from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import Session
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._types import Content
from tests.test_runner import LOAN_RULE, lookup_applicant, make_agent, runner_for, score


async def _stored_after_reopen(path: Path, events: list[Event]) -> None:
    """The file at ``path``, opened again, holds session u1/s1: the user's event, then
    ``events`` (what the turn returned)."""
    db = await Database.open(path)
    try:
        stored = await SqliteSessionStore(db).get("u1", "s1")
        assert stored is not None
        assert [e.author for e in stored.events] == ["user", *[e.author for e in events]]
        assert stored.events[1:] == events
    finally:
        await db.aclose()


async def test_a_turn_commits_once_and_is_on_disk_when_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loaded machine may take longer than DEFER_S for the turn, and the queued writes would
    # go on their own before the turn's end (right, but not what this test counts).
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
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
    await _stored_after_reopen(tmp_path / "node.db", result.events)


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


async def test_a_new_sessions_turn_is_one_operation_and_reads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``new_session=True`` (a node's context made for the request): no read before the turn;
    its create, queued appends and final append run as one database operation, the session's
    row written once (an insert with the last event's time, no update of it); all of it is on
    disk when the turn returns."""
    # A loaded machine may take longer than DEFER_S for the turn: the queued writes would go
    # on their own then (correct, but not the one operation counted here).
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
    db = await Database.open(tmp_path / "node.db")
    operations: list[int] = []
    run_batch = db._run_batch

    def counted(batch: list[Any]) -> list[Any]:
        operations.append(len(batch))
        return run_batch(batch)

    try:
        store = SqliteSessionStore(db)
        runner = runner_for(make_agent([lookup_applicant, score], LOAN_RULE), sessions=store)
        await runner.run(user_id="u1", session_id="s0", message="approve APP-1 for 10")
        db._run_batch = counted  # type: ignore[method-assign]
        commits, batches = db.commits, db.batches
        statements: list[str] = []
        db._conn.set_trace_callback(statements.append)
        result = await runner.run(
            user_id="u1", session_id="s1", message="approve APP-2 for 20", new_session=True
        )
        db._conn.set_trace_callback(None)
        assert result.text == "Ann Lee: score 712 (B)"
        assert (db.commits - commits, db.batches - batches) == (1, 1)  # no read batch
        assert operations == [1]  # the queued six and the final append in one group
        rows = [s for s in statements if "mesh_sessions " in s]
        assert len(rows) == 1, rows
        assert rows[0].startswith("insert into mesh_sessions")
    finally:
        await db.aclose()
    await _stored_after_reopen(tmp_path / "node.db", result.events)


async def test_a_group_of_queued_writes_fails_together_and_is_reported(tmp_path: Path) -> None:
    """A session's writes queued together run as one operation: one that fails rolls the
    others of its group back, and the next ``sync`` raises it; writes queued after that
    ``sync`` are a new group, reported by the next one."""
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        session = await store.create("u1", "s1")
        event = Event(author="user", content=Content.user("hi"))
        batches = db.batches
        await store.append_event(session, event, durable=False)
        store._queue(("u1", "s1"), lambda conn: conn.execute("select * from no_such_table"))
        with pytest.raises(StoreError, match="no such table"):
            await store.sync(session)
        assert db.batches - batches == 1
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert stored.events == []  # the good append went with the failed write
        ghost = Session.new("u1", "gone")  # never stored
        await store.append_event(ghost, event, durable=False)
        await store.sync(session)  # another session's: not this one's error
        with pytest.raises(StoreError, match="no session 'gone'"):
            await store.sync(ghost)
        await store.append_event(ghost, event, durable=False)  # after the sync: a new group
        with pytest.raises(StoreError, match="no session 'gone'"):
            await store.sync(ghost)
    finally:
        await db.aclose()


async def test_queued_events_without_state_are_one_update_and_their_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events that change no state, queued one after the other, are stored by one update of
    the session row (to the last one's time) and their inserts, in order; an event with a
    delta between them keeps its place and its state, and those queued after it ride in its
    update (a remote call's turn: the tool event with its peer's context, then the answer)."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)  # the queued ones in one group
    db = await Database.open(tmp_path / "node.db")
    statements: list[str] = []
    try:
        store = SqliteSessionStore(db)
        session = await store.create("u1", "s1")
        db._conn.set_trace_callback(statements.append)
        for text, delta in [("a", {}), ("b", {}), ("c", {"k": 1}), ("d", {})]:
            event = Event(author="user", content=Content.user(text), state_delta=delta)
            await store.append_event(session, event, durable=False)
        await store.append_event(session, Event(author="user", content=Content.user("e")))
        db._conn.set_trace_callback(None)
        touched = [s for s in statements if s.startswith("update mesh_sessions")]
        # a and b together; c (its state too) with d and the durable e (it joins the group)
        assert len(touched) == 2, touched
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert [e.text for e in stored.events] == ["a", "b", "c", "d", "e"]
        assert stored.state == {"k": 1}
        assert stored.updated_at == session.updated_at  # the last event's time
        # A session that is not there: the event with a delta and those after it fail alike.
        ghost = Session.new("u1", "gone")
        for delta in ({"k": 2}, {}):
            event = Event(author="user", content=Content.user("x"), state_delta=delta)
            await store.append_event(ghost, event, durable=False)
        with pytest.raises(StoreError, match="no session 'gone' of user 'u1' to append to"):
            await store.sync(ghost)
        assert await store.get("u1", "gone") is None
    finally:
        await db.aclose()


async def test_a_sync_cancelled_while_it_waits_leaves_its_writes_to_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn cancelled while ``sync`` waits for its one group: the group still commits, in
    order, and the store and database go on (the wait is on the group's own future)."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)  # the group waits until flushed
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        session = await store.create("u1", "s1")
        await store.append_event(session, Event(author="user", content=Content.user("a")))
        await store.append_event(
            session, Event(author="user", content=Content.user("b")), durable=False
        )
        waiter = asyncio.ensure_future(store.sync(session))
        await asyncio.sleep(0)  # one loop turn: it waits for the group now
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await store.append_event(session, Event(author="user", content=Content.user("c")))
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert [e.text for e in stored.events] == ["a", "b", "c"]
    finally:
        await db.aclose()


async def _remote_turn(store: SqliteSessionStore, session_id: str) -> Session:
    """A remote call's turn of a new session, queued as the runner queues it: the create, the
    user's event, the tool event with the peer's context id (a delta), the durable answer."""
    session = await store.create("u1", session_id, durable=False)
    await store.append_event(
        session, Event(author="user", content=Content.user("a")), durable=False
    )
    tool = Event(author="tool", content=Content.user("b"), state_delta={"ctx:peer": "c-1"})
    await store.append_event(session, tool, durable=False)
    await store.append_event(session, Event(author="model", content=Content.user("c")))
    return session


async def test_a_delta_right_after_the_turns_own_insert_reads_no_state_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn inserted the session's row in the same transaction: the state it inserted is
    the row's, so the event with a delta merges into it without a select of the row."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)  # the turn's writes in one group
    db = await Database.open(tmp_path / "node.db")
    statements: list[str] = []
    try:
        store = SqliteSessionStore(db)
        await store.create("u1", "warm")
        db._conn.set_trace_callback(statements.append)
        session = await _remote_turn(store, "s1")
        db._conn.set_trace_callback(None)
        assert not [s for s in statements if s.startswith("select")], statements
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert stored.state == session.state == {"ctx:peer": "c-1"}
        assert [e.text for e in stored.events] == ["a", "b", "c"]
        assert stored.updated_at == session.updated_at
    finally:
        await db.aclose()


async def test_a_row_another_writer_inserted_first_keeps_its_state_under_the_delta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row was there before the turn's queued create ran (another process made it): the
    create leaves it, and the delta merges into the state that row holds, read from it."""
    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        await store.create("u1", "warm")
        session = await store.create("u1", "s1", durable=False)
        await store.append_event(
            session, Event(author="user", content=Content.user("a")), durable=False
        )
        # Another connection to the file inserts the row while the group waits for its batch.
        other = sqlite3.connect(tmp_path / "node.db")
        with other:
            other.execute(
                "insert into mesh_sessions (user_id, id, state, created_at, updated_at) "
                "values ('u1', 's1', '{\"theirs\": 1}', 1.0, 1.0)"
            )
        other.close()
        tool = Event(author="tool", content=Content.user("b"), state_delta={"ctx:peer": "c-1"})
        await store.append_event(session, tool, durable=False)
        await store.append_event(session, Event(author="model", content=Content.user("c")))
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert stored.state == {"theirs": 1, "ctx:peer": "c-1"}
        assert stored.created_at == 1.0  # their row, kept
        assert stored.updated_at == session.updated_at  # touched by the turn's events
        assert [e.text for e in stored.events] == ["a", "b", "c"]
    finally:
        await db.aclose()


_DELTAS: list[dict[str, Any]] = [
    {"ctx:peer": "c-1"},
    {"a": 1, "b": 2.5, "c": True, "d": None, "e": "", "f": -0.0, "g": float("inf"), "h": 2**70},
    {"é": "ü\u2028", "x": "\n\"'"},
    {},
    # Not flat: read back from their text, as before.
    {"nested": {"k": [1, 2]}, "t": ("a", 1)},
    {"n": float("nan"), "l": [], "o": {}},
]


def _row_state(path: Path, session_id: str) -> str:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(
            "select state from mesh_sessions where user_id='u1' and id=?", (session_id,)
        ).fetchone()
        return str(row[0])
    finally:
        conn.close()


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("before", [None, {}, {"theirs": 1, "ctx:peer": "old"}])
@pytest.mark.parametrize("delta", _DELTAS)
async def test_a_deltas_stored_state_is_the_merge_of_its_text(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    delta: dict[Any, Any],
    before: dict[str, Any] | None,
    durable: bool,
) -> None:
    """Whatever the delta and the state before it (a new session's, an empty one, one with
    keys the delta replaces), the row's state text is json.dumps of the stored state merged
    with the delta's text read back, and the session's state that merge: a flat delta merged
    without reading its text back writes the same text."""
    import json

    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)  # the turn's writes in one group
    path = tmp_path / "node.db"
    db = await Database.open(path)
    try:
        store = SqliteSessionStore(db)
        await store.create("u1", "warm")
        if before is None:
            session = await store.create("u1", "s1", durable=False)
            start: dict[str, Any] = {}
        else:
            session = await store.create("u1", "s1", state=before)
            start = dict(before)
        await store.append_event(
            session, Event(author="user", content=Content.user("a")), durable=False
        )
        event = Event(author="tool", content=Content.user("b"), state_delta=delta)
        await store.append_event(session, event, durable=durable)
        await store.append_event(session, Event(author="model", content=Content.user("c")))
        want = {**start, **json.loads(json.dumps(delta))}
        assert _row_state(path, "s1") == json.dumps(want)
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert json.dumps(stored.state) == json.dumps(session.state) == json.dumps(want)
        assert [e.text for e in stored.events] == ["a", "b", "c"]
    finally:
        await db.aclose()


async def test_a_flat_delta_is_not_read_back_from_its_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote turn's delta (the peer's context id, a str) is merged as it is: its copy is
    what its text reads back to, so the turn parses no JSON and writes the delta's own text
    as the new session's state; the session holds a copy, not the caller's dict."""
    import mesh._sessions.sqlite as sessions_sqlite

    monkeypatch.setattr(mesh._sqlite, "DEFER_S", 60.0)
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        await store.create("u1", "warm")
        parsed: list[str] = []
        real = sessions_sqlite.json.loads
        monkeypatch.setattr(
            sessions_sqlite.json, "loads", lambda text, **kw: parsed.append(text) or real(text)
        )
        session = await _remote_turn(store, "s1")
        assert parsed == []
        monkeypatch.setattr(sessions_sqlite.json, "loads", real)
        assert _row_state(tmp_path / "node.db", "s1") == '{"ctx:peer": "c-1"}'
        delta = {"ctx:peer": "c-2"}
        event = Event(author="tool", content=Content.user("d"), state_delta=delta)
        await store.append_event(session, event)
        delta["ctx:peer"] = "changed"  # the caller's dict, changed afterwards
        assert session.state == {"ctx:peer": "c-2"}
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert stored.state == {"ctx:peer": "c-2"}
    finally:
        await db.aclose()
