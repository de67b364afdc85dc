"""``SqliteTaskStore``: durable A2A tasks in the node's one SQLite file.

A task is stored as its protobuf bytes (``SerializeToString``: the cheapest faithful encoding)
plus the few columns ``ListTasks`` filters and sorts on (a held typed run's final task comes
with its bytes, ``Settled.row``: the task was parsed from them, ``mesh._a2a.one_shot``). Rows
are scoped by owner (the authenticated user, ``''`` when anonymous) exactly like the SDK's
``InMemoryTaskStore``, and the listing order and page tokens are the SDK's: ``(status
timestamp, id)`` descending.

A caller may change a task object after saving it (the SDK's ``TaskManager`` updates its
current task in place), so ``save`` takes the bytes at once, before the write is handed to the
database thread: what is stored is the task as it was saved.

Write-behind: the SDK saves a task on every event (SUBMITTED, WORKING, each artifact, the final
state) and reads it back several times per request. The store keeps the latest state of each
in-flight task in memory and persists only what a reader must find after a restart: the first
save of a task in this process, every terminal state and every interrupted state
(input-required, auth-required). Those saves return after their commit, and the SDK answers a
blocking request only after it saved the final state, so a task acknowledged as finished is on
disk. Intermediate states live in memory until then (a crash leaves the task in its first saved
state, never ahead of what a client saw as final). ``get`` answers in-flight tasks from memory,
and task ids this node just generated (``id_generator``) are known to be absent without a read.
``list`` writes the in-memory states first, so a listing is never behind ``get``.

For a new task of a blocking send the first save is queued but not awaited: the client hears
of the task only with its final state, whose commit comes after (same queue, in order), so
the promise holds with one wait less. When the run writes nothing else to the database before
its task settles (``mark_single_write``: a function skill on the fast path), the first save is
not even queued for ``DEFER_S`` (``mesh._sqlite``: as long as a queued write may wait): a final
state that comes sooner is written in its place, with what was staged for it (the idempotency
key), in one write instead of three; a run that lasts longer has its first save queued then,
as before. An LLM turn on the fast path (``mark_first_save_held``) is held the same way: what
it writes before its task settles is its session's rows, which need not follow the task's (a
crash before the final commit leaves no task and no key, so a retry runs the turn, as after a
crash before the first commit); the one row that must follow it, a resume point, is written
by the executor after ``queue_first_save``. Listings, ``trace`` and a shutdown write such a
first save before they read or end anything. Streaming sends await it (the client sees the
task at once, and its idempotency key rides in that transaction). The store learns which save
belongs to a blocking send from the call context every save gets (``mark_blocking_send``: a
key of ``ServerCallContext.state``, the SDK's place for a server's own per-request data).

Tasks cut by a stop: a crash leaves a task in its first saved state, so when the node starts,
``recover`` applies the one recovery rule (docs/node.md): every stored task that is neither
finished nor waiting for input, and has no resume point (``mesh._a2a.waits``), ends FAILED
(``metadata.error.reason = "interrupted"``), in one statement; a waiting task's deadline that
passed ends it FAILED ``deadline``; one that was resuming runs again. At a shutdown whose
grace ran out, the executor ends its running tasks itself (reason ``shutdown``) and
``end_in_flight`` writes whatever could still not settle. Either way the caller learns that
sending the message again runs the work (see ``mesh._a2a.idempotency``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Message, Role, Task, TaskState
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import ListTasksCursor, decode_list_tasks_cursor, encode_list_tasks_cursor
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from mesh import _sqlite
from mesh._a2a.fastpath_json import SETTLED, Settled
from mesh._a2a.ids import uuid4_text
from mesh._a2a.states import INTERRUPTED_STATES, SETTLED_STATES, TERMINAL_STATES
from mesh._a2a.task_feed import ACK_S, POLL_S, TaskFeed
from mesh._a2a.waits import TASKS_SCHEMA_V2, WAITING, delete_waits
from mesh._sqlite import Database
from mesh._tracing import trace_id_of

__all__ = [
    "BLOCKING_SEND",
    "DEADLINE",
    "HOLD_FIRST_SAVE",
    "INTERRUPTED",
    "SHUTDOWN",
    "SINGLE_WRITE",
    "STOPPED_REASONS",
    "Recovery",
    "SqliteTaskStore",
    "mark_blocking_send",
    "mark_first_save_held",
    "mark_single_write",
    "queue_first_save",
    "stopped_text",
]

log = logging.getLogger("mesh._a2a")

#: ``metadata.error.reason`` of a task its node stopped (crash, kill -9) while it ran, found
#: when the node starts again.
INTERRUPTED = "interrupted"
#: ``metadata.error.reason`` of a task still running when a shutdown's drain grace ran out.
SHUTDOWN = "shutdown"
#: Reasons of tasks that ended without finishing: their message id no longer holds the message.
STOPPED_REASONS = frozenset({INTERRUPTED, SHUTDOWN})
_STOPPED_TEXT = {
    INTERRUPTED: "the node stopped while this task ran (a crash or a kill), so its work may be "
    "incomplete: send the message again (same messageId) to run it",
    SHUTDOWN: "the node shut down before this task finished (its drain grace ran out): send the "
    "message again (same messageId), to another instance, to run it",
}

#: Key of ``ServerCallContext.state``: true in the call context of a blocking SendMessage (not
#: streaming, not return_immediately). The request handler sets it; every save of the task
#: gets that call context (the SDK's ``TaskStore`` contract: owner scoping reads it too).
BLOCKING_SEND = "mesh.blocking_send"
#: Key of ``ServerCallContext.state``: the run of this blocking send writes nothing else to the
#: database before its task settles (no resume point, no session), so nothing can be committed
#: ahead of its first save if that save waits for the final one (``mark_single_write``).
SINGLE_WRITE = "mesh.single_write"
#: Key of ``ServerCallContext.state``: the run of this blocking send (an LLM turn) writes only
#: rows that need not follow its task's first row before it settles (its session's), or calls
#: ``queue_first_save`` first: its first save may wait for the final one (``mark_first_save_held``).
HOLD_FIRST_SAVE = "mesh.hold_first_save"
# Where a held first save of ``HOLD_FIRST_SAVE`` is queued from (``queue_first_save``).
_QUEUE_FIRST_SAVE = "mesh.queue_first_save"
# Fresh ids not yet saved: normally one per request in flight. A bound against a leak from
# requests that end before their first save; clearing only costs a read per id.
_MAX_FRESH = 10_000
TaskKey = tuple[str, str]  # (owner, task id)
Statement = Callable[[sqlite3.Connection], object]

_SCHEMA = """
create table if not exists a2a_tasks (
    owner text not null,
    id text not null,
    context_id text not null,
    state integer not null,
    -- status timestamp in ns, -1 without one (sorts last, like the SDK's in-memory store)
    updated_at integer not null,
    data blob not null,
    primary key (owner, id)
) without rowid;
create index if not exists a2a_tasks_by_time on a2a_tasks (owner, updated_at desc, id desc);
create index if not exists a2a_tasks_by_context on a2a_tasks (owner, context_id, updated_at desc);
"""

# Version 3: the trace a task belongs to (the trace id of its ``traceparent`` metadata) and
# when it was first saved, so a node answers "the tasks of trace T" (``trace``) from an index.
TASKS_SCHEMA_V3 = """
alter table a2a_tasks add column trace_id text;
alter table a2a_tasks add column created_at integer;
create index if not exists a2a_tasks_by_trace on a2a_tasks (trace_id, created_at)
    where trace_id is not null;
"""

# Version 4: terminal tasks by status time, what retention (``mesh._retention``) deletes the
# oldest of. Partial, so a task enters it once, with its terminal save (~10 us of the database
# thread per task, docs/performance.md).
_TERMINAL_IN_SQL = f"state in ({', '.join(str(int(s)) for s in sorted(TERMINAL_STATES))})"
TASKS_SCHEMA_V4 = f"""
create index if not exists a2a_tasks_ended on a2a_tasks (updated_at) where {_TERMINAL_IN_SQL};
"""
# Version 5: a2a_tasks as a rowid table (SQLite only). A WITHOUT ROWID table keeps its rows in
# index b-tree cells, whose local payload stops near 1,000 bytes on 4 KiB pages: a larger row
# (an LLM turn's task is ~1 KiB) took an overflow page of its own, 4 KiB for a few hundred
# bytes. A rowid table's leaf cell holds ~4,000 bytes; its primary key becomes a unique index
# (one more b-tree per insert, docs/performance.md "On disk: retention"). One transaction
# (``Database.migrate``): the table is copied, the old one dropped with its indexes, the new
# one renamed and indexed again. PostgreSQL tables are heaps already: the step is a no-op there.
_TASKS_COLUMNS = "owner, id, context_id, state, updated_at, data, trace_id, created_at"
TASKS_SCHEMA_V5 = f"""
create table a2a_tasks_rowid (
    owner text not null,
    id text not null,
    context_id text not null,
    state integer not null,
    updated_at integer not null,
    data blob not null,
    trace_id text,
    created_at integer,
    primary key (owner, id)
);
insert into a2a_tasks_rowid ({_TASKS_COLUMNS}) select {_TASKS_COLUMNS} from a2a_tasks;
drop table a2a_tasks;
alter table a2a_tasks_rowid rename to a2a_tasks;
create index a2a_tasks_by_time on a2a_tasks (owner, updated_at desc, id desc);
create index a2a_tasks_by_context on a2a_tasks (owner, context_id, updated_at desc);
create index a2a_tasks_by_trace on a2a_tasks (trace_id, created_at) where trace_id is not null;
create index a2a_tasks_ended on a2a_tasks (updated_at) where {_TERMINAL_IN_SQL};
"""


def _terminal_sql(column: str) -> str:
    """Whether ``column`` holds a terminal state, as comparisons (version 6)."""
    return "(" + " or ".join(f"{column} = {int(s)}" for s in sorted(TERMINAL_STATES)) + ")"


# Version 6: ``a2a_tasks_ended``'s condition as comparisons. SQLite evaluates a partial index's
# condition at every insert and update of a row, and codes an ``in`` of more than two constants
# by building a temporary b-tree of them first: ~30,000 instructions a task's row, more than
# the index itself costs (docs/performance.md). Queries name the index's condition as written
# (``_TERMINAL_SQL``), which is how SQLite and PostgreSQL tell that it serves them.
_TERMINAL_SQL = _terminal_sql("state")
_OPEN_SQL = f"not {_TERMINAL_SQL}"
TASKS_SCHEMA_V6 = f"""
drop index if exists a2a_tasks_ended;
create index a2a_tasks_ended on a2a_tasks (updated_at) where {_TERMINAL_SQL};
"""
# Version 7 (SQLite only): ``a2a_tasks_by_time`` ascending. Declared ``desc`` it put each new
# task (the newest time) at the left end of the index, where SQLite splits a full page by its
# general rebalancing (the page, its siblings and their parent rewritten): ~7,000 instructions
# a task, and the index 1.8x the pages (537 against 305 for 20,000 tasks). At the right end a
# full page is split by starting a new one. Listings read it backwards: the same plans, no
# sort. PostgreSQL's b-trees take either end alike: a no-op there.
TASKS_SCHEMA_V7 = """
drop index if exists a2a_tasks_by_time;
create index a2a_tasks_by_time on a2a_tasks (owner, updated_at, id);
"""
_NO_OP = "select 1;"
#: Owners ``open_contexts`` looks up one by one (an index seek each); past that, one scan.
MAX_OWNERS = 100

# created_at is set by the first insert only; a save without a traceparent (the SDK's first
# save of a task, before the executor put its metadata) keeps the one already known.
_UPSERT = (
    "insert into a2a_tasks (owner, id, context_id, state, updated_at, data, trace_id, created_at) "
    "values (?, ?, ?, ?, ?, ?, ?, ?) on conflict (owner, id) do update set "
    "context_id = excluded.context_id, state = excluded.state, "
    "updated_at = excluded.updated_at, data = excluded.data, "
    "trace_id = coalesce(excluded.trace_id, a2a_tasks.trace_id) "
    # A terminal state is final: a replica still running a task another replica canceled
    # (shared PostgreSQL) does not overwrite the cancel with its own end. The same state may
    # be written again (a canceled waiting task gets its reason added).
    f"where not {_terminal_sql('a2a_tasks.state')} "
    "or a2a_tasks.state = excluded.state"
)
_RUNNER = (
    "insert into mesh_task_runners (owner, task_id, runner) values (?, ?, ?) "
    "on conflict (owner, task_id) do update set runner = excluded.runner"
)
#: How often ``follow`` reads a task another replica runs.
FOLLOW_EVERY_S = 0.25
#: What ``trace`` returns: (owner, task, first save in ns or None), oldest first.
TraceRows = list[tuple[str, Task, int | None]]
#: Most tasks one ``trace`` call returns.
MAX_TRACE_TASKS = 500


def mark_blocking_send(context: ServerCallContext) -> None:
    """Tell the store that ``context`` is the call of a blocking send: the first save of its
    new task need not be awaited (see the module docstring)."""
    context.state[BLOCKING_SEND] = True


def _task_write(
    row: tuple[Any, ...],
    owner: str,
    task_id: str,
    runner: str | None,
    staged: list[tuple[Statement, asyncio.Future[None]]],
) -> Statement:
    """The write of a task's row (``_row``), with this replica as its runner when given (its
    first save here) and what was staged to ride in the same transaction."""

    def write(conn: sqlite3.Connection) -> None:
        conn.execute(_UPSERT, row)
        if runner is not None:
            conn.execute(_RUNNER, (owner, task_id, runner))
        for fn, _ in staged:
            fn(conn)

    return write


def mark_single_write(context: ServerCallContext) -> None:
    """Tell the store that the run of ``context`` (a blocking send) writes nothing else to the
    database before its task settles: its first save may wait for its final one (see the
    module docstring)."""
    context.state[SINGLE_WRITE] = True


def mark_first_save_held(context: ServerCallContext) -> None:
    """Tell the store that the run of ``context`` (a blocking send) writes nothing before its
    task settles that must follow the task's first row, except after ``queue_first_save``:
    its first save may wait for its final one (see the module docstring)."""
    context.state[HOLD_FIRST_SAVE] = True


def queue_first_save(context: ServerCallContext) -> None:
    """Before a write that must not reach the disk ahead of the task's first row (a resume
    point, which recovery drops when its task is absent): queue that first save, with what was
    staged for it, if the store still holds it (``mark_first_save_held``)."""
    queue = context.state.pop(_QUEUE_FIRST_SAVE, None)
    if queue is not None:
        queue()


def _row(owner: str, task: Task, data: bytes, created_ns: int | None = None) -> tuple[Any, ...]:
    """The columns of ``_UPSERT`` for ``task`` stored as ``data`` (first saved at
    ``created_ns``, now when not given)."""
    return (
        owner,
        task.id,
        task.context_id,
        int(task.status.state),
        _timestamp_ns(task),
        data,
        _trace_id(task),
        time.time_ns() if created_ns is None else created_ns,
    )


def _made_row(owner: str, made: Settled, data: bytes, created_ns: int | None) -> tuple[Any, ...]:
    """``_row`` of ``made.task`` from the values it was built from: its ids, state, status
    time (``at_ns``, the timestamp's nanoseconds) and metadata's ``traceparent`` (a ``Settled``
    task's metadata is that of its one status update, and ``_trace_id`` reads it first)."""
    at_ns = made.at_ns
    if not 0 <= at_ns <= _MAX_TIMESTAMP_NS:
        return _row(owner, made.task, data, created_ns)  # ``_timestamp_ns``'s own answer
    traceparent = made.metadata.get("traceparent")
    trace_id = trace_id_of(traceparent) if type(traceparent) is str else None
    if trace_id is None:  # none there: ``_trace_id`` reads its next place, the request's
        trace_id = _trace_id(made.task)
    return (
        owner,
        made.task_id,
        made.context_id,
        int(made.state),
        at_ns,
        data,
        trace_id,
        time.time_ns() if created_ns is None else created_ns,
    )


def _trace_id(task: Task) -> str | None:
    """The trace id of the task's ``traceparent``: its metadata's (set with its final or
    waiting state), else the request message's (a running task, when its caller sent one)."""
    # Every save runs this: read the Struct's raw ``fields`` map. Its Python-level ``in`` and
    # ``[]`` cost a typed fast-path request ~17,000 instructions (docs/performance.md).
    found = _trace_id_in(task.metadata)
    if found is None and task.history:
        found = _trace_id_in(task.history[0].metadata)
    return found


def _trace_id_in(metadata: Struct) -> str | None:
    value = metadata.fields.get("traceparent")
    if value is None or not value.HasField("string_value"):
        return None
    return trace_id_of(value.string_value)


def _timestamp_ns(task: Task) -> int:
    if not task.HasField("status"):
        return -1
    status = task.status
    if not status.HasField("timestamp"):
        return -1
    stamp = status.timestamp
    seconds: int = stamp.seconds
    nanos: int = stamp.nanos
    # ``ToNanoseconds``'s sum, without its Python call and range check where the range holds
    # (epoch to year 9999); anything else gets its answer or its error.
    if 0 <= seconds <= _MAX_TIMESTAMP_S and 0 <= nanos < 1_000_000_000:
        return seconds * 1_000_000_000 + nanos
    return int(stamp.ToNanoseconds())


#: The last second a ``Timestamp`` may hold (9999-12-31T23:59:59Z).
_MAX_TIMESTAMP_S = 253402300799
#: The last nanosecond of that second.
_MAX_TIMESTAMP_NS = _MAX_TIMESTAMP_S * 1_000_000_000 + 999_999_999


class _FreshIds(IDGenerator):
    """Task ids for new tasks (uuid4, like the SDK's), remembered as not stored yet, with when
    each was made: the task's start (a run saved first when it settles, ``SINGLE_WRITE``, is
    first saved at its end; its row's ``created_at`` is still its start)."""

    def __init__(self, fresh: dict[str, int]) -> None:
        self._fresh = fresh

    def generate(self, context: IDGeneratorContext) -> str:
        task_id = uuid4_text()
        if len(self._fresh) >= _MAX_FRESH:
            self._fresh.clear()
        self._fresh[task_id] = time.time_ns()
        return task_id


def _fail_staged(staged: list[tuple[Statement, asyncio.Future[None]]], exc: BaseException) -> None:
    for _, future in staged:
        if future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)


def _settle_staged(
    staged: list[tuple[Statement, asyncio.Future[None]]], done: asyncio.Future[Any], task_id: str
) -> None:
    """Report an unawaited write to the statements that rode on it."""
    if done.cancelled():
        _fail_staged(staged, asyncio.CancelledError())
        return
    exc = done.exception()
    if exc is not None:
        # The final save of the task (queued after this one) reports the failure to the caller.
        log.warning("write for task %s failed: %s", task_id, exc)
        _fail_staged(staged, exc)
        return
    for _, future in staged:
        if not future.done():
            future.set_result(None)


def _parse(data: bytes) -> Task:
    task = Task()
    task.ParseFromString(data)
    return task


def _redact_history(task: Task, message_ids: set[str]) -> bool:
    """Replace the parts of the history messages in ``message_ids`` (in place). True when one
    was found."""
    found = False
    for message in task.history:
        if message.message_id in message_ids:
            found = True
            if len(message.parts) != 1 or message.parts[0].text != REDACTED:
                del message.parts[:]
                message.parts.append(new_text_part(REDACTED))
    return found


#: What an answer to an auth question is stored as.
REDACTED = "[redacted]"


def stopped_text(reason: str) -> str:
    """The status message of a task ended with ``reason`` (one of ``STOPPED_REASONS``)."""
    return _STOPPED_TEXT[reason]


def _end_stopped(task: Task, reason: str, at: Timestamp) -> None:
    """End ``task`` FAILED with ``reason``, as the SDK's ``TaskManager`` applies a status update
    (the previous status message moves to the history, the error merges into the metadata)."""
    _set_status(task, TaskState.TASK_STATE_FAILED, stopped_text(reason), at, reason)


def _set_status(
    task: Task, state: TaskState, text: str, at: Timestamp, reason: str | None = None
) -> None:
    """Give ``task`` a new status with a text message (and ``metadata.error`` when ``reason``),
    as ``TaskManager`` applies a status update."""
    if task.status.HasField("message"):
        task.history.append(task.status.message)
    task.status.Clear()
    task.status.state = state
    task.status.timestamp.CopyFrom(at)
    task.status.message.CopyFrom(
        Message(
            role=Role.ROLE_AGENT,
            message_id=str(uuid.uuid4()),
            task_id=task.id,
            context_id=task.context_id,
            parts=[new_text_part(text)],
        )
    )
    if reason is not None:
        task.metadata.update({"error": {"reason": reason, "message": text}})


# Neither finished nor waiting for input: the states a task of a stopped node may be left in.
_UNSETTLED_SQL = f"state not in ({', '.join(str(int(s)) for s in sorted(SETTLED_STATES))})"
#: Called with the tasks a stop ended, in the transaction that ends them (the node releases
#: their idempotency keys there).
Ended = list[tuple[str, Task]]  # (owner, task)
EndedHook = Callable[[sqlite3.Connection, Ended], object]


#: ``metadata.error.reason`` of a task whose deadline passed (here: while it waited).
DEADLINE = "deadline"
WAIT_DEADLINE_TEXT = "deadline exceeded while the task waited for input"
RESUMED_TEXT = "the node restarted while this task resumed: it runs again with its answers"


#: Replicas sharing one database (PostgreSQL): when each was last seen (the database's clock,
#: epoch seconds), and which replica runs each unsettled task (written with its first save
#: there). A task whose replica is not seen for a lease ends FAILED ``interrupted``
#: (``SqliteTaskStore.sweep``).
REPLICAS_SCHEMA = """
create table if not exists mesh_replicas (instance text primary key, seen_at real not null);
create table if not exists mesh_task_runners (
    owner text not null,
    task_id text not null,
    runner text not null,
    primary key (owner, task_id)
);
"""
_SETTLED_SQL = f"({', '.join(str(int(s)) for s in sorted(SETTLED_STATES))})"


@dataclass
class Recovery:
    """What ``SqliteTaskStore.recover`` decided at start-up."""

    #: Ended FAILED ``interrupted`` (rule 1).
    ended: Ended
    #: Ended FAILED ``deadline`` while they waited (rule 2).
    expired: Ended = field(default_factory=list)
    #: The stored turns (``PendingTurn`` JSON) of those that waited on child tasks: the node
    #: cancels the children.
    expired_turns: list[str] = field(default_factory=list)
    #: Still waiting: (owner, task id, context id, deadline) (rule 3).
    waiting: list[tuple[str, str, str, float | None]] = field(default_factory=list)
    #: To run again: (owner, task id, context id) (rule 4).
    resume: list[tuple[str, str, str]] = field(default_factory=list)


class SqliteTaskStore(TaskStore):
    """A2A ``TaskStore`` over ``mesh._sqlite.Database`` (table ``a2a_tasks``).

    Call ``await store.initialize()`` once before use (creates the table).
    """

    #: This replica's instance id when replicas share the database (``sweep``); None: alone.
    runner: str | None = None
    #: Live states to and from other replicas (shared PostgreSQL): ``mesh._a2a.task_feed``.
    feed: TaskFeed | None = None

    def __init__(self, db: Database, owner_resolver: OwnerResolver = resolve_user_scope) -> None:
        self._db = db
        self._owner = owner_resolver
        # In-flight tasks: the latest state (bytes), maybe newer than the row on disk.
        self._live: dict[TaskKey, bytes] = {}
        self._dirty: set[TaskKey] = set()
        # Ids generated here and never saved (get() knows they are absent), with when each was.
        self._fresh: dict[str, int] = {}
        # Statements to commit with the next persisted save of a task (idempotency keys).
        self._staged: dict[TaskKey, list[tuple[Statement, asyncio.Future[None]]]] = {}
        # Messages (by id, per task id) whose parts never reach the stored history.
        self._redact: dict[str, set[str]] = {}
        # First saves not queued yet (``SINGLE_WRITE``): the bytes and time of each.
        self._unwritten: dict[TaskKey, tuple[bytes, int]] = {}
        self._unwritten_timer: asyncio.TimerHandle | None = None

    def redact(self, task_id: str, message_id: str) -> None:
        """Store message ``message_id`` of the task's history with its parts replaced by
        ``[redacted]`` (the answer to an auth question: the skill gets it from the request,
        the replay log keeps it; the history, which every GetTask returns, does not)."""
        self._redact.setdefault(task_id, set()).add(message_id)

    async def initialize(self) -> None:
        # Version 1: the tasks; 2: the resume points of tasks that wait (mesh._a2a.waits);
        # 3: their trace id and first save, indexed (``trace``); 4: retention's indexes;
        # 5: a rowid table on SQLite; 6: retention's index without an ``in``; 7: the listing's
        # index ascending on SQLite.
        sqlite = self._db.dialect == "sqlite"
        v5 = TASKS_SCHEMA_V5 if sqlite else _NO_OP
        v7 = TASKS_SCHEMA_V7 if sqlite else _NO_OP
        await self._db.migrate(
            "tasks",
            [_SCHEMA, TASKS_SCHEMA_V2, TASKS_SCHEMA_V3, TASKS_SCHEMA_V4, v5, TASKS_SCHEMA_V6, v7],
        )

    def id_generator(self) -> IDGenerator:
        """The task id generator for the request handler (see ``get``)."""
        return _FreshIds(self._fresh)

    def write_with_task(self, owner: str, task_id: str, fn: Statement) -> asyncio.Future[None]:
        """Commit ``fn(conn)`` in the same transaction as the next persisted save of the task
        (its first save in this process), or on its own when that save already happened.
        The future resolves once it is committed."""
        key = (owner, task_id)
        if key in self._live and key not in self._unwritten:
            written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._db.write_soon(fn).add_done_callback(
                lambda done: _settle_staged([(fn, written)], done, task_id)
            )
            return written
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._staged.setdefault(key, []).append((fn, future))
        return future

    async def save(self, task: Task, context: ServerCallContext) -> None:
        owner = self._owner(context)
        # A held run's final task (``AppliedEvents.settle``): its row's columns are the values
        # it was built from, not read back from it (a wrapper object per field read).
        made: Settled | None = context.state.get(SETTLED)
        if made is not None and not made.is_of(task):
            made = None
        key = (owner, task.id if made is None else made.task_id)
        task_id = key[1]  # a stand-in's is the settled values' (``Settled.is_of``)
        state = task.status.state if made is None else made.state
        settled = state in SETTLED_STATES
        # A held run's final task parsed from its bytes (``Settled.row``) is stored as them.
        written = made.row if made is not None else None
        if self._redact and task_id in self._redact:
            if made is not None and task is made.stand_in:
                task = made.task  # its history is rewritten: the task itself
            hidden = self._redact[task_id]
            if _redact_history(task, hidden):
                written = None  # its history changed
                if settled:
                    del self._redact[task_id]
        data: bytes = task.SerializeToString() if written is None else written
        # Followed from another replica: each state is published (after its write, if any).
        feed = self.feed if self.feed is not None and self.feed.wanted(task_id) else None
        if key in self._live and not settled:
            self._live[key] = data  # write-behind: persisted with the next settled state
            self._dirty.add(key)
            if feed is not None:
                feed.publish(owner, task_id, data)
            return
        # A new task of a blocking send: nobody learns of it before its final state, which is
        # committed after this row (one queue, in order), so the first write is not awaited.
        born = self._fresh.pop(task_id, None)
        lazy = not settled and born is not None and context.state.get(BLOCKING_SEND) is True
        self._live[key] = data
        self._dirty.discard(key)
        if lazy and (
            context.state.get(SINGLE_WRITE) is True or context.state.get(HOLD_FIRST_SAVE) is True
        ):
            # Not even queued yet: its final state may come first and take its place. On disk
            # no later than a queued write would be (``DEFER_S``, read now: a setting).
            self._unwritten[key] = (data, born or time.time_ns())
            if self._unwritten_timer is None:
                self._unwritten_timer = asyncio.get_running_loop().call_later(
                    _sqlite.DEFER_S, self._unwritten_due
                )
            if context.state.get(SINGLE_WRITE) is not True:
                context.state[_QUEUE_FIRST_SAVE] = functools.partial(self._write_held, key)
            return
        first = self._unwritten.pop(key, None)
        created = born if first is None else first[1]
        row = (
            _row(owner, task, data, created)
            if made is None
            else _made_row(owner, made, data, created)
        )
        staged = self._staged.pop(key, [])
        runner = None if settled else self.runner

        write = _task_write(row, owner, task_id, runner, staged)
        if lazy:
            self._queue_lazily(task_id, write, staged)
            return
        try:
            # At once when the node's writes find no company lately (one request at a time):
            # no queued future and no turn of the loop, ~20,000 instructions a typed request.
            done = self._db.write_now(write)
            if done is None:
                await self._db.write(write)
            elif not done[0]:
                raise done[1]
        except BaseException as exc:
            _fail_staged(staged, exc)
            raise
        finally:
            # Settled tasks leave memory once their row is committed (or failed to be).
            if settled and self._live.get(key) is data:
                del self._live[key]
        for _, future in staged:
            if not future.done():
                future.set_result(None)
        if feed is not None:
            feed.publish(owner, task_id, data)

    def _queue_lazily(
        self,
        task_id: str,
        write: Statement,
        staged: list[tuple[Statement, asyncio.Future[None]]],
    ) -> None:
        """Queue ``write`` without waiting; ``staged`` learn its outcome."""
        try:
            queued = self._db.write_soon(write)
        except Exception as exc:  # the database is closed
            _fail_staged(staged, exc)
            return
        queued.add_done_callback(lambda done: _settle_staged(staged, done, task_id))

    def _write_unwritten(self) -> None:
        """Queue every first save still waiting for its final one (``SINGLE_WRITE``), each with
        what was staged for it, as a blocking send's first save is queued."""
        if self._unwritten_timer is not None:
            self._unwritten_timer.cancel()
            self._unwritten_timer = None
        unwritten, self._unwritten = self._unwritten, {}
        for key, first in unwritten.items():
            self._queue_first(key, first)

    def _unwritten_due(self) -> None:
        """``DEFER_S`` after a first save was held: queue what is held and commit it now. Queued
        at once, it would have been on disk by then; queued now it must not wait another
        ``DEFER_S`` for company (the batch its run's other writes were in may be gone)."""
        self._write_unwritten()
        self._db.flush()

    def _write_held(self, key: TaskKey) -> None:
        """Queue the first save of ``key`` if it is still held (``queue_first_save``)."""
        first = self._unwritten.pop(key, None)
        if first is not None:
            self._queue_first(key, first)

    def _queue_first(self, key: TaskKey, first: tuple[bytes, int]) -> None:
        """Queue a held first save (its bytes and first save time) with what was staged for it,
        as a blocking send's first save is queued."""
        (owner, task_id), (data, created_ns) = key, first
        row = _row(owner, _parse(data), data, created_ns)
        staged = self._staged.pop(key, [])
        write = _task_write(row, owner, task_id, self.runner, staged)
        self._queue_lazily(task_id, write, staged)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        owner = self._owner(context)
        live = self._live.get((owner, task_id))
        if live is not None:
            return _parse(live)
        if task_id in self._fresh:
            return None

        def read(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "select data from a2a_tasks where owner = ? and id = ?", (owner, task_id)
            ).fetchone()

        row = await self._db.read(read)
        return None if row is None else _parse(row[0])

    def live_state(self, owner: str, task_id: str) -> bytes | None:
        """The latest state of a task running here (None: it does not run here)."""
        return self._live.get((owner, task_id))

    @property
    def shared(self) -> bool:
        """Whether other replicas use this database too (PostgreSQL): a task may run on one
        of them."""
        return self._db.dialect != "sqlite"

    async def follow(
        self, task_id: str, context: ServerCallContext, *, every_s: float = FOLLOW_EVERY_S
    ) -> AsyncGenerator[Task, None]:
        """A task another replica runs: its current state, then each new one, until it settles
        (ends or waits), which is the last. The running replica publishes every state while
        followed (``mesh._a2a.task_feed``): the first is its live state (the stored one when
        it does not answer within ``ACK_S``), the rest as they are made. The stored task is
        read again every ``POLL_S`` (every ``every_s`` while the feed's LISTEN connection is
        down): a settled state found there ends the follow, whatever notification was lost.
        Without a feed, only the stored states (the first and the settled one) are seen."""
        task = await self.get(task_id, context)
        if task is None:
            return
        feed = self.feed
        if feed is None or task.status.state in SETTLED_STATES:
            async for stored in self._poll(task_id, context, task, every_s):
                yield stored
            return
        owner = self._owner(context)
        async with feed.watch(owner, task_id) as inbox:
            first = await feed.next_state(inbox, owner, ACK_S)
            heard = first is not None
            task = first or task
            seen = task.SerializeToString(deterministic=True)
            yield task
            while task.status.state not in SETTLED_STATES:
                wait = POLL_S if feed.listener.connected.is_set() else every_s
                state = await feed.next_state(inbox, owner, wait)
                if state is not None:
                    heard = True
                else:  # nothing heard for a while: the stored task
                    state = await self.get(task_id, context)
                    if state is None:
                        return
                    # Older than what was heard unless settled (the live states are not stored).
                    if heard and state.status.state not in SETTLED_STATES:
                        continue
                data = state.SerializeToString(deterministic=True)
                if data != seen:
                    seen, task = data, state
                    yield task

    async def _poll(
        self, task_id: str, context: ServerCallContext, task: Task, every_s: float
    ) -> AsyncGenerator[Task, None]:
        """``task``, then its stored state every ``every_s`` when it changed, until settled."""
        seen = task.SerializeToString(deterministic=True)
        yield task
        while task.status.state not in SETTLED_STATES:
            await asyncio.sleep(every_s)
            stored = await self.get(task_id, context)
            if stored is None:
                return
            data = stored.SerializeToString(deterministic=True)
            if data != seen:
                seen, task = data, stored
                yield task

    async def _write_dirty(self) -> None:
        """Persist the in-memory states of in-flight tasks (before a listing)."""
        self._write_unwritten()
        rows = []
        for key in list(self._dirty):
            rows.append(_row(key[0], _parse(self._live[key]), self._live[key]))
        self._dirty.clear()
        if rows:
            await self._db.write(lambda conn: conn.executemany(_UPSERT, rows))

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        await self._write_dirty()
        where = ["owner = ?"]
        args: list[Any] = [self._owner(context)]
        if params.context_id:
            where.append("context_id = ?")
            args.append(params.context_id)
        if params.status:
            where.append("state = ?")
            args.append(int(params.status))
        if params.HasField("status_timestamp_after"):
            where.append("updated_at >= ?")
            args.append(int(params.status_timestamp_after.ToNanoseconds()))
        count_sql = f"select count(*) from a2a_tasks where {' and '.join(where)}"
        count_args = list(args)
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise InvalidParamsError(f"Invalid page token: {params.page_token}")
            ts = -1 if cursor.timestamp_ns is None else cursor.timestamp_ns
            where.append("(updated_at, id) < (?, ?)")
            args.extend([ts, cursor.task_id])
        page_size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        # One row more than the page tells whether there is a next page.
        page_sql = (
            f"select data, updated_at, id from a2a_tasks where {' and '.join(where)} "
            "order by updated_at desc, id desc limit ?"
        )

        def read(conn: sqlite3.Connection) -> tuple[int, list[Any]]:
            total = conn.execute(count_sql, count_args).fetchone()[0]
            rows = conn.execute(page_sql, [*args, page_size + 1]).fetchall()
            return int(total), rows

        total, rows = await self._db.read(read)
        next_token = ""
        if len(rows) > page_size:
            rows = rows[:page_size]
            last_ts, last_id = rows[-1][1], rows[-1][2]
            next_token = encode_list_tasks_cursor(
                ListTasksCursor(timestamp_ns=None if last_ts < 0 else last_ts, task_id=last_id)
            )
        return ListTasksResponse(
            tasks=[_parse(r[0]) for r in rows],
            next_page_token=next_token,
            total_size=total,
            page_size=page_size,
        )

    async def trace(self, trace_id: str, *, limit: int = MAX_TRACE_TASKS) -> TraceRows:
        """The tasks of trace ``trace_id`` on this node, of every owner (the caller is the mesh
        itself, authenticated by its token: see ``mesh._a2a.traces``), with their owner and the
        time of their
        first save in ns (None for tasks stored before schema version 3), oldest first, at
        most ``limit``. A task running now shows its latest state."""
        await self._write_dirty()

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "select owner, data, created_at from a2a_tasks where trace_id = ? "
                "order by created_at, id limit ?",
                (trace_id, limit),
            ).fetchall()

        rows = await self._db.read(read)
        return [(r[0], _parse(r[1]), r[2]) for r in rows]

    async def end_unfinished(self, then: EndedHook | None = None) -> Ended:
        """``recover`` and the ``(owner, task)`` pairs it ended ``interrupted``."""
        return (await self.recover(then)).ended

    async def recover(self, then: EndedHook | None = None) -> Recovery:
        """At start-up, before any request: the one recovery rule (docs/node.md, "Crashes and
        shutdowns"). Every stored task that is not terminal is decided, in one transaction:

        1. no resume point (``mesh_waits``) and not waiting: FAILED ``interrupted``
           (``then(conn, ended)`` runs in the transaction: the node releases their keys);
        2. a resume point whose deadline passed: FAILED ``deadline``;
        3. waiting on an open question: stays waiting (``Recovery.waiting``: the node arms
           their deadlines);
        4. a resume point and nothing to wait for (the answer was recorded, or the waiting
           state was never saved): WORKING, and the node runs it again
           (``Recovery.resume``).

        The resume points of tasks that ended (or are gone) are deleted."""
        if self._db.dialect != "sqlite":
            # Replicas share the rows (PostgreSQL): a replica starting cannot tell a task
            # another replica runs now from one whose replica died, so it decides none here;
            # ``sweep`` ends the running tasks of a replica unseen for a lease (rule 1).
            return Recovery(ended=[])
        at = Timestamp()
        at.GetCurrentTime()
        now = time.time()
        ended: Ended = []
        recovery = Recovery(ended=ended)
        interrupted = {int(s) for s in INTERRUPTED_STATES}
        terminal = {int(s) for s in TERMINAL_STATES}

        def settle_waits(conn: sqlite3.Connection) -> None:
            rows = conn.execute(
                "select w.owner, w.task_id, w.context_id, w.state, w.deadline, t.state, t.data, "
                "w.kind, w.turn "
                "from mesh_waits w left join a2a_tasks t on t.owner = w.owner and t.id = w.task_id"
            ).fetchall()
            for owner, task_id, context_id, wait_state, deadline, state, data, kind, turn in rows:
                if state is None or state in terminal:
                    delete_waits(conn, owner, task_id)
                    continue
                task = _parse(data)
                if deadline is not None and deadline <= now:
                    _set_status(task, TaskState.TASK_STATE_FAILED, WAIT_DEADLINE_TEXT, at, DEADLINE)
                    recovery.expired.append((owner, task))
                    if kind == "turn":
                        recovery.expired_turns.append(turn)
                    delete_waits(conn, owner, task_id)
                elif wait_state == WAITING and state in interrupted:
                    recovery.waiting.append((owner, task_id, context_id, deadline))
                    continue
                else:
                    _set_status(task, TaskState.TASK_STATE_WORKING, RESUMED_TEXT, at)
                    recovery.resume.append((owner, task_id, context_id))
                conn.execute(_UPSERT, _row(owner, task, task.SerializeToString()))

        def end(owner: str, data: bytes) -> bytes:
            task = _parse(data)
            _end_stopped(task, INTERRUPTED, at)
            ended.append((owner, task))
            return bytes(task.SerializeToString())

        def write(conn: sqlite3.Connection) -> None:
            settle_waits(conn)
            conn.create_function("mesh_end_interrupted", 2, end)
            conn.execute(
                "update a2a_tasks set state = ?, updated_at = ?, "
                f"data = mesh_end_interrupted(owner, data) where {_UNSETTLED_SQL} and not exists "
                "(select 1 from mesh_waits w where w.owner = a2a_tasks.owner "
                "and w.task_id = a2a_tasks.id)",
                (int(TaskState.TASK_STATE_FAILED), int(at.ToNanoseconds())),
            )
            if ended and then is not None:
                then(conn, ended)

        await self._db.write(write)
        return recovery

    async def sweep(self, lease_s: float, then: EndedHook | None = None) -> Ended:
        """Replicas on one database, every few seconds on each: mark this replica (``runner``)
        seen, and end FAILED ``interrupted`` every unsettled task (not waiting on a resume
        point) whose replica was not seen for ``lease_s`` seconds: killed, or cut off. ``then``
        runs in the same transaction (the node releases their keys there). Times are the
        database's clock, so the replicas' clocks need not agree; a task two sweeps find at
        once is ended by one (``skip locked``)."""
        await self._db.migrate("replicas", [REPLICAS_SCHEMA])
        at = Timestamp()
        at.GetCurrentTime()
        ended: Ended = []
        now = "extract(epoch from clock_timestamp())"

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"insert into mesh_replicas (instance, seen_at) values (?, {now}) "
                "on conflict (instance) do update set seen_at = excluded.seen_at",
                (self.runner,),
            )
            rows = conn.execute(
                "select t.owner, t.data from a2a_tasks t join mesh_task_runners r "
                "on r.owner = t.owner and r.task_id = t.id "
                "left join mesh_replicas p on p.instance = r.runner "
                f"where t.{_UNSETTLED_SQL} and (p.seen_at is null or p.seen_at < {now} - ?) "
                "and not exists (select 1 from mesh_waits w where w.owner = t.owner "
                "and w.task_id = t.id) for update of t skip locked",
                (lease_s,),
            ).fetchall()
            for owner, data in rows:
                task = _parse(data)
                _end_stopped(task, INTERRUPTED, at)
                ended.append((owner, task))
                conn.execute(_UPSERT, _row(owner, task, task.SerializeToString()))
            conn.execute(
                "delete from mesh_task_runners where exists (select 1 from a2a_tasks t "
                "where t.owner = mesh_task_runners.owner and t.id = mesh_task_runners.task_id "
                f"and t.state in {_SETTLED_SQL})"
            )
            if ended and then is not None:
                then(conn, ended)

        await self._db.write(write)
        return ended

    async def take_over(self, lease_s: float) -> Recovery:
        """Replicas on one database, after each ``sweep``: the recovery rules a replica that
        died cannot apply to its own tasks any more (``recover`` decides none on a shared
        database). In one transaction, rows another sweep holds skipped:

        * rule 2 across replicas: a task waiting for input whose deadline passed a third of a
          lease ago (its own replica's timer, if alive, went first) is returned in
          ``waiting`` with the deadline now, for this replica's clock to end it; its stored
          deadline moves a lease on, so another replica retries if this one dies first;
        * rule 4 across replicas: an unsettled task with a resume point (its answer recorded,
          or a turn following its children) whose replica was not seen for ``lease_s`` is
          returned in ``resume`` and becomes this replica's (``mesh_task_runners``), so it
          runs again here with its recorded answers, once."""
        await self._db.migrate("replicas", [REPLICAS_SCHEMA])
        now = "extract(epoch from clock_timestamp())"
        waiting_states = ", ".join(str(int(s)) for s in sorted(INTERRUPTED_STATES))
        recovery = Recovery(ended=[])
        at = time.time()

        def write(conn: sqlite3.Connection) -> None:
            expired = conn.execute(
                "select w.owner, w.task_id, w.context_id from mesh_waits w join a2a_tasks t "
                "on t.owner = w.owner and t.id = w.task_id "
                f"where t.state in ({waiting_states}) and w.deadline is not null "
                f"and w.deadline <= {now} - ? for update of w skip locked",
                (lease_s / 3,),
            ).fetchall()
            for owner, task_id, context_id in expired:
                conn.execute(
                    f"update mesh_waits set deadline = {now} + ? where owner = ? and task_id = ?",
                    (lease_s, owner, task_id),
                )
                recovery.waiting.append((owner, task_id, context_id, at))
            orphans = conn.execute(
                "select t.owner, t.id, t.context_id from a2a_tasks t join mesh_waits w "
                "on w.owner = t.owner and w.task_id = t.id "
                "left join mesh_task_runners r on r.owner = t.owner and r.task_id = t.id "
                "left join mesh_replicas p on p.instance = r.runner "
                f"where t.{_UNSETTLED_SQL} and (p.seen_at is null or p.seen_at < {now} - ?) "
                "for update of t skip locked",
                (lease_s,),
            ).fetchall()
            for owner, task_id, context_id in orphans:
                conn.execute(_RUNNER, (owner, task_id, self.runner))
                recovery.resume.append((owner, task_id, context_id))

        await self._db.write(write)
        return recovery

    async def end_in_flight(self, then: EndedHook | None = None) -> Ended:
        """At shutdown, once nothing runs any more: write every task still in flight in this
        process FAILED with reason ``shutdown`` (the executor ends the tasks it runs itself;
        this catches any it could not). ``then(conn, ended)`` runs in the same transaction."""
        self._write_unwritten()
        at = Timestamp()
        at.GetCurrentTime()
        ended: Ended = []
        for (owner, _), data in self._live.items():
            task = _parse(data)
            if task.status.state in SETTLED_STATES:
                continue
            _end_stopped(task, SHUTDOWN, at)
            ended.append((owner, task))
        if not ended:
            return ended
        rows = [_row(owner, t, t.SerializeToString()) for owner, t in ended]

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(_UPSERT, rows)
            if then is not None:
                then(conn, ended)

        await self._db.write(write)
        for owner, task in ended:
            self._live.pop((owner, task.id), None)
            self._dirty.discard((owner, task.id))
        return ended

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        owner = self._owner(context)
        self._write_unwritten()  # queued before the delete, as they would have been
        self._live.pop((owner, task_id), None)
        self._dirty.discard((owner, task_id))
        await self._db.write(
            lambda conn: conn.execute(
                "delete from a2a_tasks where owner = ? and id = ?", (owner, task_id)
            )
        )

    # -- retention (``mesh._retention``) ---------------------------------------------------
    async def count_ended(self) -> int:
        """How many terminal tasks are stored (all owners; read from ``a2a_tasks_ended``)."""
        row = await self._db.read(
            lambda conn: conn.execute(
                f"select count(*) from a2a_tasks where {_TERMINAL_SQL}"
            ).fetchone()
        )
        return int(row[0])

    async def delete_ended(
        self, before_ns: int | None, limit: int, then: EndedHook | None = None
    ) -> Ended:
        """Delete the oldest terminal tasks (by status time), at most ``limit``, only those
        older than ``before_ns`` when given, in one short write; ``then(conn, deleted)`` runs
        in it (the rows that belong to them: keys, push configs, resume points). Running and
        waiting tasks are never touched: the statement names the terminal states; nor is one
        with a push notification still queued (``a2a_push_outbox``, which must exist)."""
        cutoff = before_ns if before_ns is not None else 2**62
        shared = self.shared
        if shared:
            await self._db.migrate("replicas", [REPLICAS_SCHEMA])

        def write(conn: sqlite3.Connection) -> Ended:
            # Replicas sweep the shared rows too: each takes rows no other sweep holds. A task
            # whose push notification is still queued stays until it is sent or given up (its
            # expiry; one past it is what a crash left): its receiver would not hear the end.
            rows = conn.execute(
                f"select owner, id, data from a2a_tasks where {_TERMINAL_SQL} "
                "and updated_at < ? and not exists (select 1 from a2a_push_outbox o "
                "where o.owner = a2a_tasks.owner and o.task_id = a2a_tasks.id "
                "and o.expires_at > ?) order by updated_at limit ?"
                + (" for update skip locked" if shared else ""),
                (cutoff, time.time(), limit),
            ).fetchall()
            keys = [(r[0], r[1]) for r in rows]
            conn.executemany(
                f"delete from a2a_tasks where owner = ? and id = ? and {_TERMINAL_SQL}", keys
            )
            # Resume points of ended tasks are deleted when they end; what a crash left too.
            for table in ("mesh_waits", "mesh_questions", "mesh_children"):
                conn.executemany(f"delete from {table} where owner = ? and task_id = ?", keys)
            if shared:  # its runner row, were it left (the lease sweep drops settled ones)
                conn.executemany(
                    "delete from mesh_task_runners where owner = ? and task_id = ?", keys
                )
            deleted = [(r[0], _parse(r[2])) for r in rows]
            if deleted and then is not None:
                then(conn, deleted)
            return deleted

        return await self._db.write(write)


def open_contexts(conn: sqlite3.Connection, context_ids: list[str]) -> set[str]:
    """Which of ``context_ids`` (session ids) have a task that is not terminal (running, or
    waiting for input) or a resume point (``mesh_waits``): their sessions are in use, whatever
    their age. Looked up per owner through ``a2a_tasks_by_context`` (owners are few: '' and the
    authenticated users); past ``MAX_OWNERS`` of them, one scan of ``a2a_tasks``."""
    if not context_ids:
        return set()
    marks = ", ".join("?" * len(context_ids))
    owners: list[str] = []
    for _ in range(MAX_OWNERS + 1):
        row = conn.execute(
            "select min(owner) from a2a_tasks" + (" where owner > ?" if owners else ""),
            (owners[-1],) if owners else (),
        ).fetchone()
        if row is None or row[0] is None:
            break
        owners.append(str(row[0]))
    found = {
        str(r[0])
        for r in conn.execute(
            f"select session_id from mesh_waits where session_id in ({marks})", context_ids
        ).fetchall()
    }
    if len(owners) > MAX_OWNERS:
        rows = conn.execute(
            f"select context_id from a2a_tasks where context_id in ({marks}) and {_OPEN_SQL}",
            context_ids,
        ).fetchall()
        return found | {str(r[0]) for r in rows}
    for owner in owners:
        # Two steps: asked at once, SQLite's planner (no statistics) scans the owner's rows.
        ids = [
            r[0]
            for r in conn.execute(
                f"select id from a2a_tasks where owner = ? and context_id in ({marks})",
                (owner, *context_ids),
            ).fetchall()
        ]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = conn.execute(
                f"select context_id from a2a_tasks where owner = ? and id in "
                f"({', '.join('?' * len(chunk))}) and {_OPEN_SQL}",
                (owner, *chunk),
            ).fetchall()
            found.update(str(r[0]) for r in rows)
    return found
