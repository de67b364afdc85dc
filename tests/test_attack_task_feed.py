"""``mesh._a2a.task_feed`` against a process that can connect to the agent's database but is not
one of its replicas: PostgreSQL grants CONNECT on a database to every role by default, and any
connected role may NOTIFY and LISTEN on any channel, table privileges or not. Such an outsider
(a real role with no privilege on the agent's tables, on the real test server) must not be able
to feed a follower states of its own making, nor make a runner publish a task, and a flood of
notifications must not grow a replica's memory without bound."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from a2a.types import Artifact, Part, Task, TaskState, TaskStatus

from mesh._a2a import task_feed
from mesh._a2a.task_feed import FOLLOW, STATES, TaskFeed
from tests.support import eventually

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


@pytest.fixture
async def feed(pg_database: str) -> AsyncIterator[TaskFeed]:
    from mesh._pg import PgDatabase

    db = await PgDatabase.open(pg_database)
    opened = await TaskFeed.open(db, pg_database)
    try:
        yield opened
    finally:
        await opened.aclose()
        await db.aclose()


@pytest.fixture
async def outsider(pg_database: str) -> AsyncIterator[object]:
    """A connection to the agent's database as a role with no privilege on its tables."""
    import psycopg

    role = f"outsider_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as admin:
        await admin.execute(f"create role {role} login")
    url = pg_database.replace("postgres@", f"{role}@", 1)
    assert role in url
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


def _forged(task_id: str) -> bytes:
    task = Task(
        id=task_id,
        context_id="c",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
        artifacts=[Artifact(artifact_id="a", parts=[Part(text="forged by an outsider")])],
    )
    return bytes(task.SerializeToString())


async def test_an_outsider_cannot_feed_a_follower_a_state(feed: TaskFeed, outsider: object) -> None:
    import psycopg

    assert isinstance(outsider, psycopg.AsyncConnection)
    # It can read the feed's tables? No: no privilege on them.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await outsider.execute("select * from mesh_task_feed")
    task_id = str(uuid.uuid4())
    payload = json.dumps(
        {"t": task_id, "r": "outsider", "s": 1, "d": base64.b64encode(_forged(task_id)).decode()}
    )
    async with feed.watch("", task_id) as inbox:
        await outsider.execute("select pg_notify(%s, %s)", (STATES, payload))
        # Before: the forged COMPLETED state (its artifact) was the follower's next event.
        assert await feed.next_state(inbox, "", 1.0) is None


async def test_an_outsider_cannot_make_a_runner_publish_a_task(
    feed: TaskFeed, outsider: object
) -> None:
    import psycopg

    assert isinstance(outsider, psycopg.AsyncConnection)
    task_id = str(uuid.uuid4())
    asked: list[tuple[str, str]] = []

    def live_state(owner: str, tid: str) -> bytes | None:
        asked.append((owner, tid))
        return _forged(tid)

    feed.live_state = live_state
    heard_before = feed.listener.heard
    request = json.dumps({"t": task_id, "o": "", "r": "outsider"})
    await outsider.execute("select pg_notify(%s, %s)", (FOLLOW, request))
    await eventually(lambda: feed.listener.heard > heard_before)
    # Before: the task counted as followed and its live state went out on the states channel.
    assert not feed.wanted(task_id)
    assert asked == []


async def test_a_flood_of_follow_requests_keeps_the_leases_bounded(
    feed: TaskFeed, outsider: object
) -> None:
    # Every replica hears every follow request; each names a task for LEASE_S seconds.
    for n in range(3 * task_feed.MAX_LEASES):
        feed._heard_follow(
            feed._signer.sign(FOLLOW, json.dumps({"t": f"t-{n}", "o": "", "r": "x"}))
        )
    assert len(feed._leases) == task_feed.MAX_LEASES
    assert feed.wanted(f"t-{3 * task_feed.MAX_LEASES - 1}")  # the newest kept


async def test_a_follower_that_reads_slowly_holds_a_bounded_inbox(feed: TaskFeed) -> None:
    task_id = str(uuid.uuid4())
    state = base64.b64encode(_forged(task_id)).decode()
    async with feed.watch("", task_id) as inbox:
        for n in range(3 * task_feed.MAX_INBOX):
            feed._heard_state(
                feed._signer.sign(STATES, json.dumps({"t": task_id, "r": "x", "s": n, "d": state}))
            )
        assert inbox.qsize() <= task_feed.MAX_INBOX
        # The newest state is kept (the oldest were dropped): the follower ends on it.
        last = None
        while not inbox.empty():
            last = inbox.get_nowait()
        assert last is not None
