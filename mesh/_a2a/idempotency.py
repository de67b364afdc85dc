"""Idempotent ``SendMessage``: the same message sent twice runs the work once.

A message is identified by ``(owner, caller, messageId)``: the authenticated user ('' when
anonymous), the ``caller`` of the message metadata (the calling agent), and the message id the
caller chose. When the executor starts a task it records that key against the task id
(``IdempotencyKeys.record``), in the node's database so it survives a restart: with a
``SqliteTaskStore`` the key row is committed in the same transaction as the task's first save
(no write of its own), so a task and the key that created it reach the disk together. A second
message with the same key gets the existing task back instead of a new run; if the original is
still running here, a blocking send waits for it to finish first.

A repeated ``messageId`` that names another task or context than the task it started (its
``taskId`` or ``contextId`` set and different) is not that message again but a client reusing
an id: ``replay`` refuses it with -32602 naming the task the id belongs to, rather than answer
with another conversation's task.

Replicas sharing one database (PostgreSQL) claim the key row before the run: ``claim`` inserts
it (insert-or-ignore) holding a claim mark (``?`` and a random id) in place of the task id, and
only the send whose insert took runs; ``record`` swaps the mark for the task id in the task's
first save. A copy of the message on another replica, milliseconds apart, finds the row: it
waits until the mark becomes a task id (a group commit or two) and answers with that task,
following it through the database to its end when the send is blocking. A mark that stays
``CLAIM_STALE_S`` (its send's replica died before it made the task) is taken over. A send that
ends without a task deletes its mark. On SQLite one process owns the file and the keys of the
sends in flight are in its memory: the claim stays a read, no write of its own.

Except when the task ended because its node stopped (reason ``interrupted`` or ``shutdown``,
see ``mesh._a2a.store``): its key is released in the transaction that ends it, so the same
message sent again runs the work as a new task. Work cut by a crash or a shutdown is thus done
at least once, through the caller's retry; everything else exactly once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import uuid
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.tasks import TaskStore
from a2a.types import (
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    Task,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a.utils.task import apply_history_length

from mesh._a2a.fastpath_json import SETTLED, Settled
from mesh._a2a.known_keys import KnownKeys
from mesh._a2a.states import SETTLED_STATES
from mesh._a2a.store import SqliteTaskStore
from mesh._sqlite import Database

__all__ = [
    "IdempotencyKeys",
    "MessageKey",
    "WatchedTaskStore",
    "message_key",
    "replay",
    "send_answer",
    "send_answer_cut",
]

MessageKey = tuple[str, str, str]  # (owner, caller, message_id)

_SCHEMA = """
create table if not exists a2a_message_keys (
    owner text not null,
    caller text not null,
    message_id text not null,
    task_id text not null,
    primary key (owner, caller, message_id)
) without rowid;
"""
_INSERT = (
    "insert or ignore into a2a_message_keys (owner, caller, message_id, task_id) "
    "values (?, ?, ?, ?)"
)
# Only the task's own key: an id another task holds (first writer wins) stays.
_DELETE = (
    "delete from a2a_message_keys where owner = ? and caller = ? and message_id = ? and task_id = ?"
)
_SELECT = "select task_id from a2a_message_keys where owner = ? and caller = ? and message_id = ?"
# A claimed key whose task is not made yet holds a mark, not a task id (task ids never start so).
_MARK = "?"
# Set the key's task id where it still holds this send's mark (then insert it, were it gone).
_SWAP = (
    "update a2a_message_keys set task_id = ? where owner = ? and caller = ? and message_id = ? "
    "and task_id = ?"
)
_TAKE_OVER = _SWAP
#: A claim mark older than this is taken over: a claimer makes its task within milliseconds.
CLAIM_STALE_S = 10.0
#: How often a copy of a message waits for the replica that claimed it to make its task.
CLAIM_POLL_S = 0.02
log = logging.getLogger("mesh._a2a")


def send_answer(task: Task, params: SendMessageRequest) -> Task:
    """``task`` as the answer to the blocking ``SendMessage`` ``params``: with the history
    length the caller asked for; when it asked for none, the history after the caller's own
    message. The caller has the message it just sent, and echoing it made every answer to a
    large input twice its size; A2A 1.0 lets a server return fewer messages than the (here
    unlimited) length asked for ("MAY apply a lower limit")."""
    config = params.configuration
    if config.HasField("history_length"):
        return apply_history_length(task, config)
    start = _after_sent(task, params.message.message_id)
    if start == 0:
        return task
    # A new Task, not a copy trimmed afterwards: the message is never copied.
    return Task(
        id=task.id,
        context_id=task.context_id,
        status=task.status,
        artifacts=task.artifacts,
        history=task.history[start:],
        metadata=task.metadata if task.HasField("metadata") else None,
    )


def send_answer_cut(task: Task, params: SendMessageRequest) -> tuple[Task, int]:
    """``send_answer(task, params)`` as a task and the index of the first history message it
    keeps: a writer leaving the messages before it out writes that answer without a copy
    (``fastpath_json.rpc_result``)."""
    config = params.configuration
    if config.HasField("history_length"):
        # apply_history_length's rule: the last history_length messages, none for 0
        length, kept = config.history_length, len(task.history)
        if length == 0 or 0 < length < kept:
            return task, kept - length
        return task, 0
    if not task.HasField("status"):
        # (send_answer's copy of a task without a status has an empty one)
        return send_answer(task, params), 0
    return task, _after_sent(task, params.message.message_id)


def _after_sent(task: Task, sent: str) -> int:
    """The index after the last history message with id ``sent``; 0 when none has it."""
    history = task.history
    for i in range(len(history) - 1, -1, -1):
        if history[i].message_id == sent:
            return i + 1
    return 0


def message_key(message: Message, context: ServerCallContext | None) -> MessageKey | None:
    """The idempotency key of ``message``, None when it has no id."""
    if not message.message_id:
        return None
    owner = resolve_user_scope(context) if context is not None else ""
    return (owner, _caller(message), message.message_id)


def _caller(message: Message) -> str:
    # A protobuf Struct: membership works, .get() does not.
    return str(message.metadata["caller"]) if "caller" in message.metadata else ""


def _key_of(owner: str, message: Message) -> MessageKey | None:
    if not message.message_id or message.role == Role.ROLE_AGENT:
        return None
    return (owner, _caller(message), message.message_id)


def _log_failure(done: asyncio.Future[None], task_id: str) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("idempotency key of task %s not released: %s", task_id, done.exception())


class IdempotencyKeys:
    """``(owner, caller, message_id) -> task_id``, in ``db`` or (``db=None``) in memory.
    With ``store`` (the node's task store on the same ``db``) a key is written with its task."""

    def __init__(self, db: Database | None, store: SqliteTaskStore | None = None) -> None:
        self._db = db
        self._store = store
        self._memory: dict[MessageKey, str] = {}
        # Keys whose first message is being handled right now in this process.
        self._pending: dict[MessageKey, asyncio.Future[str | None]] = {}
        #: Replicas share the database: a key row is claimed before the run (``_take``).
        self.shared = db is not None and store is not None and store.shared
        # This process's claim marks of keys whose task is not recorded yet.
        self._marks: dict[MessageKey, str] = {}
        # SQLite, one process: the keys the file may hold, so a new message skips the read.
        self._known: KnownKeys | None = None

    async def initialize(self) -> None:
        if self._db is not None:
            await self._db.ensure_schema("a2a_message_keys", _SCHEMA)
        # SQLite written by this handle alone (a node's own file); handles marked ``shared``
        # are replicas of one database, where another may record a key this one never saw.
        if self._db is not None and self._db.dialect == "sqlite" and not self.shared:

            def scan(conn: sqlite3.Connection) -> KnownKeys:
                (count,) = conn.execute("select count(*) from a2a_message_keys").fetchone()
                rows = conn.execute("select owner, caller, message_id from a2a_message_keys")
                return KnownKeys(map(tuple, rows), expected=int(count))

            self._known = await self._db.read(scan)

    async def claim(self, key: MessageKey) -> str | None:
        """The task id of an already accepted message, or None: the caller now owns ``key``
        and must call ``end(key)`` when its send is over. Concurrent duplicates wait here."""
        for _ in range(3):  # a first send that ended without a task lets the next one in
            pending = self._pending.get(key)
            if pending is None:
                break
            task_id = await asyncio.shield(pending)
            if task_id is not None:
                return task_id
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            found = await (self._take(key) if self.shared else self._read(key))
        except BaseException:
            self.end(key)
            raise
        if found is not None:
            # The key's write may have settled this claim already (``_settle``: it commits
            # with its task's final state, after the first send's ``end`` let this one in).
            if not fut.done():
                fut.set_result(found)
            if self._pending.get(key) is fut:
                del self._pending[key]
        return found

    async def _read(self, key: MessageKey) -> str | None:
        if self._db is None:
            return self._memory.get(key)
        if self._known is not None and key not in self._known:
            return None  # never recorded in this file: no trip to the database thread

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(_SELECT, key).fetchone()

        row = await self._db.read(read)
        return None if row is None else str(row[0])

    async def _take(self, key: MessageKey) -> str | None:
        """Shared database: insert ``key``'s row with a claim mark of ours (None: this send
        runs it), or the task id another send recorded, waiting while it holds a mark."""
        assert self._db is not None
        db = self._db
        mark = _MARK + uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        seen, since = "", loop.time()

        def take(conn: sqlite3.Connection, stale: str) -> str | None:
            if conn.execute(_INSERT, (*key, mark)).rowcount == 1:
                return None
            # Its claimer is gone without a task (killed): the message is ours to run.
            if stale and conn.execute(_TAKE_OVER, (mark, *key, stale)).rowcount == 1:
                return None
            row = conn.execute(_SELECT, key).fetchone()
            return "" if row is None else str(row[0])

        while True:  # bounded: a mark is taken over once CLAIM_STALE_S old
            stale = seen if seen and loop.time() - since >= CLAIM_STALE_S else ""
            found = await db.write(functools.partial(take, stale=stale))
            if found is None:
                self._marks[key] = mark
                return None
            if found and not found.startswith(_MARK):
                return found
            if found != seen:
                seen, since = found, loop.time()
            await asyncio.sleep(CLAIM_POLL_S)

    def end(self, key: MessageKey) -> None:
        fut = self._pending.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
        mark = self._marks.pop(key, None)
        if mark is not None and self._db is not None:
            # The send ended without a task: its claim no longer holds the message.
            row = (*key, mark)

            def delete(conn: sqlite3.Connection) -> None:
                conn.execute(_DELETE, row)

            self._db.write_soon(delete).add_done_callback(lambda done: _log_failure(done, mark))

    async def record(self, key: MessageKey, task_id: str) -> None:
        """The executor accepted ``key`` as task ``task_id`` (first writer wins)."""
        if self._db is None:
            self._memory.setdefault(key, task_id)
            self._settle(key, task_id)
            return
        row = (*key, task_id)
        mark = self._marks.pop(key, None)
        if self._known is not None:
            self._known.add(key)  # before the write is queued: a duplicate now reads it

        def insert(conn: sqlite3.Connection) -> None:
            if mark is not None:
                conn.execute(_SWAP, (task_id, *key, mark))
            conn.execute(_INSERT, row)

        if self._store is not None:
            # Committed with the task's first save; duplicates waiting in claim() are let in
            # once both are on disk (they then find the task).
            written = self._store.write_with_task(key[0], task_id, insert)
            written.add_done_callback(lambda done: self._written(key, task_id, done))
            return
        self._settle(key, task_id)
        await self._db.write(insert)

    def release(self, key: MessageKey, task_id: str) -> None:
        """Task ``task_id`` is ending without having run to the end (the node stops): ``key``
        no longer holds the message. The delete is queued before the task's final save."""
        if self._db is None:
            if self._memory.get(key) == task_id:
                del self._memory[key]
            return
        row = (*key, task_id)
        written: asyncio.Future[Any]
        if self._store is not None:
            written = self._store.write_with_task(
                key[0], task_id, lambda conn: conn.execute(_DELETE, row)
            )
        else:
            written = self._db.write_soon(lambda conn: conn.execute(_DELETE, row))
        written.add_done_callback(lambda done: _log_failure(done, task_id))

    @staticmethod
    def release_ended(conn: sqlite3.Connection, ended: list[tuple[str, Task]]) -> int:
        """Release the keys of tasks a stop ended (an ``EndedHook`` of ``SqliteTaskStore``), or
        that retention deletes: the keys of the messages in each task's history, by primary
        key. Returns how many went."""
        rows = [
            (*key, task.id)
            for owner, task in ended
            for message in task.history
            if (key := _key_of(owner, message)) is not None
        ]
        if not rows:
            return 0
        return max(conn.executemany(_DELETE, rows).rowcount, 0)

    def _written(self, key: MessageKey, task_id: str, done: asyncio.Future[None]) -> None:
        if done.cancelled() or done.exception() is not None:
            if not done.cancelled():
                log.warning("idempotency key of task %s not stored: %s", task_id, done.exception())
            self.end(key)
            return
        self._settle(key, task_id)

    def _settle(self, key: MessageKey, task_id: str) -> None:
        fut = self._pending.get(key)
        if fut is not None and not fut.done():
            fut.set_result(task_id)


class WatchedTaskStore(TaskStore):
    """Delegates to ``inner``; knows which tasks run in this process and wakes whoever waits
    for one of them to settle (end or pause).

    A task runs here from a save of it in an unsettled state until a save of it settled: the
    same for a task the SDK runs and one the fast path runs, with no look into either."""

    def __init__(self, inner: TaskStore) -> None:
        self.inner = inner
        self._waiters: dict[str, list[asyncio.Event]] = {}
        self._running: set[str] = set()

    def running(self, task_id: str) -> bool:
        """Whether task ``task_id`` runs in this process now (it will settle here)."""
        return task_id in self._running

    def waiter(self, task_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.setdefault(task_id, []).append(event)
        return event

    def forget(self, task_id: str, event: asyncio.Event) -> None:
        events = self._waiters.get(task_id, [])
        if event in events:
            events.remove(event)
        if not events:
            self._waiters.pop(task_id, None)

    async def save(self, task: Task, context: ServerCallContext) -> None:
        # A held run's final task may be its stand-in (``Settled.is_of``): its id and state
        # are the settled values'.
        made: Settled | None = context.state.get(SETTLED)
        if made is not None and made.is_of(task):
            task_id, state = made.task_id, made.state
        else:
            task_id, state = task.id, task.status.state
        if state not in SETTLED_STATES:
            # Before the write: whoever learns of the task once it is stored finds it running.
            self._running.add(task_id)
            await self.inner.save(task, context)
            return
        try:
            await self.inner.save(task, context)
        finally:
            # Even when the write failed: a waiter re-reads the task rather than hang.
            self._running.discard(task_id)
            for event in self._waiters.pop(task_id, []):
                event.set()

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self.inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self.inner.delete(task_id, context)


def _check_same_task(task: Task, message: Message) -> None:
    """``InvalidParamsError`` when ``message`` (a repeat of one ``task`` took) names another
    task or context, or names no task where the original went to an existing one (it is in
    the task's history after its first message): the id is being reused, not the message
    retried."""
    other_task = bool(message.task_id) and message.task_id != task.id
    other_context = bool(message.context_id) and message.context_id != task.context_id
    if not (other_task or other_context or message.task_id):
        other_task = _joined(task, message.message_id)
    if not (other_task or other_context):
        return
    if other_context:
        why = f"not to this message's contextId {message.context_id!r}"
    elif message.task_id:
        why = f"not to this message's taskId {message.task_id!r}"
    else:
        why = "which it was sent to by taskId, and this message names no task"
    raise InvalidParamsError(
        message=f"messageId {message.message_id!r} already belongs to task {task.id} "
        f"(context {task.context_id}), {why}: a new message needs a new messageId"
    )


def _joined(task: Task, message_id: str) -> bool:
    """Whether message ``message_id`` went to ``task`` once it existed (a follow-up naming it),
    rather than starting it."""
    history = task.history
    if not history or history[0].message_id == message_id:
        return False
    return any(m.message_id == message_id for m in history)


async def replay(
    store: WatchedTaskStore, task_id: str, params: SendMessageRequest, context: ServerCallContext
) -> Task:
    """The task a repeated message started, as the answer to ``params``. A blocking send of a
    task still running here (or, replicas sharing the database, on another replica) waits for
    it to settle first, as the first send does.
    ``InvalidParamsError`` when ``params`` names another task or context (the id reused)."""
    waiter = store.waiter(task_id)
    try:
        task = await store.get(task_id, context)
        if task is None:
            raise TaskNotFoundError(f"Task {task_id} not found")
        _check_same_task(task, params.message)
        if task.status.state not in SETTLED_STATES and not params.configuration.return_immediately:
            inner = store.inner
            if store.running(task_id):
                await waiter.wait()
                task = await store.get(task_id, context) or task
            elif isinstance(inner, SqliteTaskStore) and inner.shared:
                # Another replica runs it: followed through the database until it settles.
                async for state in inner.follow(task_id, context):
                    task = state
    finally:
        store.forget(task_id, waiter)
    return apply_history_length(task, params.configuration)
