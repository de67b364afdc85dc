"""``TaskFeed``: the progress of a task another replica runs, live (replicas on one PostgreSQL).

A task's states between its first save and its settled one live in the memory of the replica
that runs it (``SqliteTaskStore`` writes them behind), and its progress reports are made only
while someone follows it (``mesh._a2a.relay``). A follower on another replica
(``SubscribeToTask``, a resubscribe, a repeated blocking send) asks for them:

1. Replica B (the follower) sends ``NOTIFY mesh_task_follow`` ``{t, o, r}`` (task, owner, its
   feed id) when the follow starts and every ``RENEW_S`` while it lasts.
2. Replica A (the runner) hears it: the task counts as followed for ``LEASE_S`` (``wanted``,
   which ``Followers`` asks, so ``ctx.progress`` and streamed answers are made), and A answers
   at once with the task's live state.
3. Each save of a followed task on A publishes the new state, in order, on
   ``mesh_task_states``: ``{t, r, s, d}`` with the task (protobuf, base64) when that is under
   ``mesh._pg_notify.MAX_PAYLOAD``; otherwise the state goes into table ``mesh_task_feed``
   and the notification, sent in that row's transaction, is the pointer ``{t, r, s, p}``.
4. B turns consecutive states into the events its subscriber gets (``mesh._a2a.handler``).

Every notification is signed (HMAC-SHA256, 128 bits, over its channel and payload) with a key
the first replica stores in table ``mesh_task_feed_key``; one whose signature does not check is
dropped. PostgreSQL grants CONNECT on a database to every role by default, and any connected
role may NOTIFY on any channel without a privilege on a table: unsigned, such a role fed a
follower states of its own making (a forged COMPLETED with its artifacts) and made a runner
publish any task it named. A role that may read the agent's tables can read the key (and the
tasks themselves). Notifications are not encrypted: a connected role that LISTENs still hears
the states whole (docs/production.md: revoke CONNECT from PUBLIC).

NOTIFY is not durable. B keeps polling the stored task every ``POLL_S`` (a settled state
ends the follow whatever was missed) and every ``FOLLOW_EVERY_S`` while its LISTEN connection
is down; B's follow requests are sent again when that connection comes back.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from a2a.types import Task
from google.protobuf.message import DecodeError

from mesh._notify_signing import NotifySigner, key_schema, shared_key
from mesh._sqlite import Database

if TYPE_CHECKING:
    from mesh._pg_notify import PgListener

__all__ = ["ACK_S", "LEASE_S", "POLL_S", "RENEW_S", "TaskFeed"]

log = logging.getLogger("mesh._a2a")

STATES = "mesh_task_states"
FOLLOW = "mesh_task_follow"
#: Seconds a follow request makes a task followed on the replica that runs it.
LEASE_S = 30.0
#: Seconds between two follow requests of one follower (well inside the lease).
RENEW_S = 10.0
#: Seconds a follower waits for the running replica's first answer before it goes on with the
#: stored state (the runner died, or the task is between replicas). Generous: a runner that
#: answers late has not leased the task yet, and the progress it makes meanwhile is lost.
ACK_S = 3.0
#: Seconds between two reads of the stored task while notifications flow (the safety net).
POLL_S = 2.0
#: States not published yet, at most (past this they are dropped: a follower's poll ends it).
MAX_QUEUED = 10_000
#: Tasks followed from elsewhere a replica remembers at most (the oldest lease goes first).
MAX_LEASES = 1024
#: States heard and not yet read, per follower, at most (past this the oldest is dropped: the
#: follower goes on from a later state, and its poll ends it whatever it missed).
MAX_INBOX = 1000
# Rows of mesh_task_feed outlive their notification by this long (a follower reads them at once).
_KEEP_S = 60.0

_SCHEMA = """
create table if not exists mesh_task_feed (
    runner text not null,
    seq integer not null,
    owner text not null,
    task_id text not null,
    at real not null,
    data blob not null,
    primary key (runner, seq)
);
create index if not exists mesh_task_feed_at on mesh_task_feed (at);
"""
# Version 2: the replicas' signing key (one row; readable by the agent's role only).
_KEY_TABLE = "mesh_task_feed_key"

# A queued state of a task followed elsewhere: (owner, task id, seq, data).
_Queued = tuple[str, str, int, bytes]
# What a follower's inbox gets: a state, or a pointer (runner, seq) to read.
_Heard = bytes | tuple[str, int]


class TaskFeed:
    """Both sides of following tasks across replicas (module docstring). Opened and closed
    with the node's A2A service (its lifespan): ``await TaskFeed.open(db, url)``."""

    def __init__(self, db: Database, listener: PgListener, key: bytes) -> None:
        self._db = db
        self.listener = listener
        self._signer = NotifySigner(key)
        #: This process among the replicas (ties a pointer to its row).
        self.id = uuid.uuid4().hex[:12]
        # Runner side: task id -> end of its lease (monotonic); the queue the sender drains.
        self._leases: dict[str, float] = {}
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue(MAX_QUEUED)
        self._seq = 0
        self._dropped = 0
        #: The live state of a task running here, by (owner, task id) (the store sets it).
        self.live_state: Callable[[str, str], bytes | None] = lambda owner, task_id: None
        # Follower side: task id -> the inboxes of its followers here, with their owners.
        self._inboxes: dict[str, dict[asyncio.Queue[_Heard], str]] = {}
        self._sender: asyncio.Task[None] | None = None
        self._asking: set[asyncio.Task[bool]] = set()
        #: States published whole / by pointer (tests, docs/performance.md).
        self.sent = self.pointers = 0

    @classmethod
    async def open(cls, db: Database, url: str) -> TaskFeed:
        from mesh._pg_notify import PgListener

        await db.migrate("task_feed", [_SCHEMA, key_schema(_KEY_TABLE)])
        # Rows are deleted by the next pointer written after their minute; a quiet replica's
        # last ones go here.
        old = time.time() - _KEEP_S
        await db.write(lambda conn: conn.execute("delete from mesh_task_feed where at < ?", (old,)))
        feed = cls(db, PgListener(url, name="mesh-task-feed"), await shared_key(db, _KEY_TABLE))
        feed.listener.on(STATES, feed._heard_state)
        feed.listener.on(FOLLOW, feed._heard_follow)
        feed.listener.on_reconnect(feed._ask_again)
        await feed.listener.start()
        feed._sender = asyncio.create_task(feed._send(), name="mesh-task-feed-sender")
        return feed

    async def aclose(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
        await self.listener.aclose()

    # -- the replica that runs the task ------------------------------------------------------
    def wanted(self, task_id: str) -> bool:
        """Whether a follower on another replica asked for ``task_id`` within its lease."""
        until = self._leases.get(task_id)
        if until is None:
            return False
        if until < time.monotonic():
            del self._leases[task_id]
            return False
        return True

    def publish(self, owner: str, task_id: str, data: bytes) -> None:
        """Send state ``data`` of the task to its followers elsewhere (in order, soon)."""
        self._seq += 1
        try:
            self._queue.put_nowait((owner, task_id, self._seq, data))
        except asyncio.QueueFull:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.warning(
                    "%d task states not sent to followers on other replicas (the database "
                    "is slow): they see the settled state by polling",
                    self._dropped,
                )

    def _heard_follow(self, message: str) -> None:
        payload = self._signer.verify(FOLLOW, message)
        if payload is None:
            return
        try:
            said = json.loads(payload)
            task_id, owner = str(said["t"]), str(said["o"])
        except (ValueError, KeyError, TypeError):
            return
        now = time.monotonic()
        leases = self._leases
        if len(leases) >= MAX_LEASES:  # every replica hears every request: forget the old
            self._leases = leases = {t: until for t, until in leases.items() if until >= now}
        leases.pop(task_id, None)  # renewed: the newest again
        while len(leases) >= MAX_LEASES:
            del leases[next(iter(leases))]
        leases[task_id] = now + LEASE_S
        data = self.live_state(owner, task_id)
        if data is not None:  # runs here: its follower starts from the live state
            self.publish(owner, task_id, data)

    async def _send(self) -> None:
        while True:
            owner, task_id, seq, data = await self._queue.get()
            whole = self._signer.sign(
                STATES,
                json.dumps(
                    {"t": task_id, "r": self.id, "s": seq, "d": base64.b64encode(data).decode()}
                ),
            )
            if len(whole) <= _max_payload():
                if await self.listener.notify(STATES, whole):
                    self.sent += 1
                continue
            try:
                await self._db.write(self._pointer(owner, task_id, seq, data))
                self.pointers += 1
            except Exception as exc:  # the follower's poll will see the settled state
                log.warning("could not publish a state of task %s: %s", task_id, exc)

    def _pointer(self, owner: str, task_id: str, seq: int, data: bytes) -> Callable[[Any], None]:
        """The write that stores a state too big for a notification, and notifies its
        pointer (delivered when the write commits: the row is there to be read)."""
        pointer = self._signer.sign(
            STATES, json.dumps({"t": task_id, "r": self.id, "s": seq, "p": 1})
        )
        now = time.time()
        row = (self.id, seq, owner, task_id, now, data)

        def write(conn: Any) -> None:
            conn.execute("delete from mesh_task_feed where at < ?", (now - _KEEP_S,))
            conn.execute(
                "insert into mesh_task_feed (runner, seq, owner, task_id, at, data) "
                "values (?, ?, ?, ?, ?, ?)",
                row,
            )
            conn.execute("select pg_notify(?, ?)", (STATES, pointer))

        return write

    # -- the follower's replica --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def watch(self, owner: str, task_id: str) -> AsyncIterator[asyncio.Queue[_Heard]]:
        """An inbox of the states of ``task_id`` published from now on, while the block runs;
        the follow request is sent now and renewed every ``RENEW_S``."""
        inbox: asyncio.Queue[_Heard] = asyncio.Queue(MAX_INBOX)
        self._inboxes.setdefault(task_id, {})[inbox] = owner
        renew = asyncio.create_task(self._renew(owner, task_id))
        try:
            yield inbox
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
            mine = self._inboxes.get(task_id, {})
            mine.pop(inbox, None)
            if not mine:
                self._inboxes.pop(task_id, None)

    async def next_state(
        self, inbox: asyncio.Queue[_Heard], owner: str, within_s: float
    ) -> Task | None:
        """The next state heard in ``inbox`` within ``within_s`` seconds (None: none came)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    heard = await inbox.get()
            except TimeoutError:
                return None
            data = heard if isinstance(heard, bytes) else await self._read(owner, *heard)
            if data is None:
                continue
            task = Task()
            try:
                task.ParseFromString(data)
            except DecodeError:
                continue
            return task

    async def _read(self, owner: str, runner: str, seq: int) -> bytes | None:
        row = await self._db.read(
            lambda conn: conn.execute(
                "select data from mesh_task_feed where runner = ? and seq = ? and owner = ?",
                (runner, seq, owner),
            ).fetchone()
        )
        return None if row is None else bytes(row[0])

    async def _renew(self, owner: str, task_id: str) -> None:
        request = self._signer.sign(FOLLOW, json.dumps({"t": task_id, "o": owner, "r": self.id}))
        while True:
            await self.listener.notify(FOLLOW, request)
            await asyncio.sleep(RENEW_S)

    def _ask_again(self) -> None:
        """After a reconnect: the runner may have missed a request, send them all now."""
        for task_id, inboxes in self._inboxes.items():
            for owner in set(inboxes.values()):
                request = self._signer.sign(
                    FOLLOW, json.dumps({"t": task_id, "o": owner, "r": self.id})
                )
                asking = asyncio.get_running_loop().create_task(
                    self.listener.notify(FOLLOW, request)
                )
                self._asking.add(asking)
                asking.add_done_callback(self._asking.discard)

    def _heard_state(self, message: str) -> None:
        payload = self._signer.verify(STATES, message)
        if payload is None:
            return
        try:
            said = json.loads(payload)
            inboxes = self._inboxes.get(str(said["t"]))
            if not inboxes:
                return
            heard: _Heard = (
                (str(said["r"]), int(said["s"]))
                if said.get("p")
                else base64.b64decode(said["d"], validate=True)
            )
        except (ValueError, KeyError, TypeError, binascii.Error):
            log.warning("a task state notification that is not ours: %.100r", payload)
            return
        for inbox in inboxes:
            if inbox.full():  # a follower that reads slowly: it goes on from a later state
                inbox.get_nowait()
            inbox.put_nowait(heard)


def _max_payload() -> int:
    from mesh._pg_notify import MAX_PAYLOAD

    return MAX_PAYLOAD
