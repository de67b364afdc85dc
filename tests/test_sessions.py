"""Session stores: the same contract in memory and in SQLite, plus SQLite durability."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import SessionStore
from mesh._sessions.memory import InMemorySessionStore
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._types import Content


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore()
        return
    db = await Database.open(tmp_path / "node.db")
    try:
        yield SqliteSessionStore(db)
    finally:
        await db.aclose()


def user_event(text: str, **delta: object) -> Event:
    return Event(author="user", content=Content.user(text), state_delta=dict(delta))


async def test_create_get_and_duplicate(store: SessionStore) -> None:
    created = await store.create("u1", "s1", state={"lang": "en"})
    assert (created.id, created.user_id, created.state, created.events) == (
        "s1",
        "u1",
        {"lang": "en"},
        [],
    )
    fetched = await store.get("u1", "s1")
    assert fetched is not None
    assert fetched.state == {"lang": "en"}
    with pytest.raises(StoreError, match="already exists"):
        await store.create("u1", "s1")
    fresh = await store.create("u1")
    assert fresh.id
    assert fresh.id != "s1"
    assert await store.count() == 2


async def test_sessions_are_per_user(store: SessionStore) -> None:
    await store.create("alice", "shared-id", state={"owner": "alice"})
    assert await store.get("bob", "shared-id") is None
    bob = await store.get_or_create("bob", "shared-id", state={"owner": "bob"})
    assert bob.state == {"owner": "bob"}
    alice = await store.get("alice", "shared-id")
    assert alice is not None
    assert alice.state == {"owner": "alice"}
    # get_or_create never overwrites the state of an existing session.
    again = await store.get_or_create("bob", "shared-id", state={"owner": "mallory"})
    assert again.state == {"owner": "bob"}


async def test_state_merge_is_dict_update_and_none_wins(store: SessionStore) -> None:
    session = await store.create("u1", "s1", state={"a": 1, "b": 2, "nested": {"x": 1}})
    session = await store.append_event(session, user_event("one", b=None, c=3))
    session = await store.append_event(session, user_event("two", nested={"y": 2}))
    expected = {"a": 1, "b": None, "c": 3, "nested": {"y": 2}}
    assert session.state == expected
    stored = await store.get("u1", "s1")
    assert stored is not None
    assert stored.state == expected
    assert "b" in stored.state  # None is a value, not a delete
    assert [e.text for e in stored.events] == ["one", "two"]


async def test_partial_events_are_not_stored(store: SessionStore) -> None:
    session = await store.create("u1", "s1")
    partial = Event(author="bot", content=Content.model("Hel"), partial=True, state_delta={"k": 1})
    await store.append_event(session, partial)
    stored = await store.get("u1", "s1")
    assert stored is not None
    assert stored.events == []
    assert stored.state == {}


async def test_append_to_a_missing_session_fails(store: SessionStore) -> None:
    session = await store.create("u1", "s1")
    session.id = "nope"
    with pytest.raises(StoreError, match="nope"):
        await store.append_event(session, user_event("x"))


async def test_listing_counting_deleting(store: SessionStore) -> None:
    s1 = await store.create("u1", "s1")
    await store.create("u1", "s2")
    await store.create("u2", "s3")
    await store.append_event(s1, user_event("latest"))
    listed = await store.list_sessions("u1")
    assert [i.id for i in listed] == ["s1", "s2"]  # most recently updated first
    assert [i.event_count for i in listed] == [1, 0]
    assert await store.count() == 3
    assert await store.delete("u1", "s1") is True
    assert await store.delete("u1", "s1") is False
    assert await store.get("u1", "s1") is None
    assert await store.count() == 2


async def test_returned_sessions_are_copies(store: SessionStore) -> None:
    session = await store.create("u1", "s1", state={"a": [1]})
    session.state["a"].append(2)
    session.events.append(user_event("not stored"))
    stored = await store.get("u1", "s1")
    assert stored is not None
    assert stored.state == {"a": [1]}
    assert stored.events == []


async def test_concurrent_turns_of_different_sessions(store: SessionStore) -> None:
    async def turn(n: int) -> None:
        session = await store.get_or_create("u", f"s{n}")
        for i in range(5):
            session = await store.append_event(session, user_event(f"{n}-{i}", last=i, n=n))

    await asyncio.gather(*(turn(n) for n in range(8)))
    assert await store.count() == 8
    for n in range(8):
        s = await store.get("u", f"s{n}")
        assert s is not None
        assert [e.text for e in s.events] == [f"{n}-{i}" for i in range(5)]
        assert s.state == {"last": 4, "n": n}


async def test_sqlite_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "data" / "node.db"
    db = await Database.open(path)
    store = SqliteSessionStore(db)
    session = await store.create("u1", "s1", state={"seed": True})
    event = Event(
        author="loan-officer",
        content=Content.model("approved"),
        state_delta={"decision": "approve", "gone": None},
        final=True,
    )
    await store.append_event(session, user_event("approve APP-1?"))
    await store.append_event(session, event)
    await db.aclose()

    db2 = await Database.open(path)
    try:
        reopened = SqliteSessionStore(db2)
        again = await reopened.get("u1", "s1")
        assert again is not None
        assert again.state == {"seed": True, "decision": "approve", "gone": None}
        assert [e.text for e in again.events] == ["approve APP-1?", "approved"]
        assert again.events[1] == event  # the whole event round-trips
        assert again.created_at == session.created_at
        assert await reopened.count() == 1
        assert [i.id for i in await reopened.list_sessions("u1")] == ["s1"]
    finally:
        await db2.aclose()


async def test_sqlite_rejects_unserialisable_state(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        session = await store.create("u1", "s1")
        bad = Event(author="tool", state_delta={"when": {1, 2}})  # a set is not JSON
        with pytest.raises(StoreError, match="not JSON"):
            await store.append_event(session, bad)
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert stored.events == []
        assert stored.state == {}
    finally:
        await db.aclose()


async def test_sqlite_event_and_state_change_commit_together(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        session = await store.create("u1", "s1", state={"k": "old"})
        # Make the state update (which runs after the event insert) fail inside the transaction.
        await db.write(
            lambda conn: conn.execute(
                "create trigger no_state before update on mesh_sessions "
                "begin select raise(abort, 'state update refused'); end"
            )
        )
        with pytest.raises(StoreError, match="state update refused"):
            await store.append_event(session, user_event("lost", k="new"))
        stored = await store.get("u1", "s1")
        assert stored is not None
        assert stored.events == []  # the event insert was rolled back with the update
        assert stored.state == {"k": "old"}
    finally:
        await db.aclose()
