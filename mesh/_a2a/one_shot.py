"""A new task's run in one shot: no events while nobody can see them, its final task built once.

A function skill's run on the fast path (a blocking send, ``SINGLE_WRITE``) publishes four
events (the task SUBMITTED, WORKING, the answer artifact, COMPLETED), each made, applied to
the task and handed to the store, for a handler that usually returns without ever letting the
loop run. While the loop has not run, nobody can have read, followed, canceled or sent a
duplicate of the task: no event of it is observable until it settles. So ``OneShotUpdater``
holds them (the arguments of each update, no event made) and, at the terminal update, builds
the task in its final form from them, exactly as the events would have left it (history,
status with its message and timestamp, artifacts, metadata), for one save
(``OneShotQueue.settle``).

A run that is about to let the loop run (its handler awaits something real: ``stepped``), or
that publishes anything else first (an interrupted state, an append to an artifact), is
released: its held events go out as they would have (the task SUBMITTED, then the executor's
``on_start``, its idempotency key, then each held update in order) and from then on every
update is an event, as any run's. So a handler that awaits shows its WORKING state to
GetTask, SubscribeToTask, CancelTask and duplicate sends as before.
"""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from a2a.helpers import new_text_part
from a2a.server.events import EventQueue
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidAgentResponseError
from google.protobuf.message import DecodeError
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from mesh._a2a.artifacts import AnswerParts
from mesh._a2a.fastpath_json import AgentText, Settled
from mesh._a2a.ids import uuid4_text
from mesh._a2a.states import TERMINAL_STATES, WORKING
from mesh._a2a.updater import MeshTaskUpdater

__all__ = ["OneShotQueue", "OneShotUpdater", "append_artifact", "merge_metadata", "stepped"]

T = TypeVar("T")
# Read once: an enum value by attribute goes through protobuf's wrapper (``mesh._a2a.states``).
_AGENT = Role.ROLE_AGENT


class OneShotQueue(EventQueue):
    """An ``EventQueue`` that also takes a new task in its final form at once (``settle``):
    what it would hold after the events that made it, saved once."""

    #: Whether the run writing to it may be held (``OneShotUpdater``): nothing else writes to
    #: the database for the task before it settles.
    one_shot: bool = False
    #: Whether ``settle`` takes a settled task's stand-in (``Settled.stand_in``) for the task.
    takes_stand_in: bool = False

    async def settle(self, task: Task, settled: Settled | None = None) -> None:
        """The task of a run whose events were all held, in its final (terminal) form;
        ``settled``: the values it was built from, when it has the shape that writes them
        (``task`` its ``stand_in`` when it has one: see ``takes_stand_in``)."""
        raise NotImplementedError


@dataclass(frozen=True)
class _AgentText(AgentText):
    """A held agent message of one text part (``OneShotUpdater.work``): what
    ``new_agent_message([new_text_part(text)])`` makes, kept as its fields, so it is built
    where it is kept (the final task's history, or its event's status) instead of built apart
    and copied there (a copy is a serialize and a parse: ~10,000 instructions), and the
    answer writes it from them (``fastpath_json.AgentText``). It holds no ``Struct``, whose
    map order would depend on how many times it was copied."""

    def fields(self) -> dict[str, Any]:
        """The message's keywords, its part's too."""
        return {
            "role": _AGENT,
            "task_id": self.task_id,
            "context_id": self.context_id,
            "message_id": self.message_id,
            "parts": [{"text": self.text}],
        }

    def wire(self) -> bytes:
        """``Message(**self.fields()).SerializeToString()``; ``UnicodeEncodeError`` for text
        that is not UTF-8."""
        message_id = self.message_id.encode()
        context_id = self.context_id.encode()
        task_id = self.task_id.encode()
        # A text part is its oneof member: written even when empty.
        part = _field(b"\x0a", self.text.encode())
        if len(message_id) < 0x80 and len(context_id) < 0x80 and len(task_id) < 0x80:
            # The usual ids (uuids): each length one byte, the message in one %.
            n = len(part)
            return b"%b%b%b%b%b" % (
                b"\x0a" + _BYTE[len(message_id)] + message_id if message_id else b"",
                b"\x12" + _BYTE[len(context_id)] + context_id if context_id else b"",
                b"\x1a" + _BYTE[len(task_id)] + task_id if task_id else b"",
                _ROLE_AGENT + b"\x2a" + (_BYTE[n] if n < 0x80 else _varint(n)),
                part,
            )
        return (
            (_field(b"\x0a", message_id) if message_id else b"")
            + (_field(b"\x12", context_id) if context_id else b"")
            + (_field(b"\x1a", task_id) if task_id else b"")
            + _ROLE_AGENT
            + _field(b"\x2a", part)
        )


@dataclass(frozen=True)
class _Status:
    state: TaskState
    message: Message | _AgentText | None
    #: Epoch ns, microsecond precision (``MeshTaskUpdater``'s), or the caller's timestamp.
    at: int | Timestamp
    metadata: dict[str, Any] | None

    def fields(self) -> dict[str, Any]:
        """``TaskStatus``'s keywords, its timestamp's too: the status is built where it is kept
        (the final task, or the event), not built apart and copied there."""
        at = self.at
        stamp: Any = at
        if not isinstance(at, Timestamp):
            seconds, nanos = divmod(at, 1_000_000_000)
            stamp = {"seconds": seconds, "nanos": nanos}
        return {"state": self.state, "message": self.history_entry(), "timestamp": stamp}

    def history_entry(self) -> Message | dict[str, Any] | None:
        """The status's message (as the next status moves it to the history): the message,
        or a held one's keywords, built where it goes."""
        message = self.message
        return message.fields() if isinstance(message, _AgentText) else message

    def event(self, task_id: str, context_id: str) -> TaskStatusUpdateEvent:
        return TaskStatusUpdateEvent(
            task_id=task_id, context_id=context_id, metadata=self.metadata, status=self.fields()
        )


@dataclass(frozen=True)
class _Artifact:
    #: The artifact as added; None for a typed answer held as its bytes (``wire``).
    made: Artifact | None
    artifact_id: str
    last_chunk: bool | None
    #: The typed answer it was made of (``AnswerParts`` of a flat dict, nothing else given).
    answer: AnswerParts | None = None
    #: A typed answer's artifact in protobuf's wire format, written when it was added (a
    #: snapshot, as the constructor's copy is): the final task's row is written around it.
    wire: bytes | None = None
    #: Its name ("" for none), for ``Settled``.
    name: str = ""

    @property
    def artifact(self) -> Artifact:
        """The artifact as ``Artifact(...)`` built it when added: a parse of its bytes is what
        the constructor's copy of its parts is (upb copies by a serialize and a parse)."""
        if self.made is not None:
            return self.made
        assert self.wire is not None
        built: Artifact = Artifact.FromString(self.wire)
        return built

    def event(self, task_id: str, context_id: str) -> TaskArtifactUpdateEvent:
        return TaskArtifactUpdateEvent(
            task_id=task_id,
            context_id=context_id,
            artifact=self.artifact,
            append=False,
            last_chunk=self.last_chunk,
        )


def _now_ns() -> int:
    """Now in epoch ns, to the microsecond (``MeshTaskUpdater``'s status timestamps)."""
    return time.time_ns() // 1000 * 1000


class OneShotUpdater(MeshTaskUpdater):
    """The updater of a new task whose events are held until it settles or lets the loop run
    (see the module docstring). ``first`` is the message that started the task; ``on_start``
    runs once its first state is published, or before its final one is saved."""

    def __init__(
        self,
        events: OneShotQueue,
        task_id: str,
        context_id: str,
        first: Message | None,
        on_start: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(events, task_id, context_id)
        self.events = events
        self._first = first
        self._on_start = on_start
        # The updates held, in order; None once released (or settled).
        self._held: list[_Status | _Artifact] | None = []

    @property
    def held(self) -> bool:
        """Whether nothing of the task was published yet."""
        return self._held is not None

    async def release(self) -> None:
        """Publish what was held, as the run would have published it: the task SUBMITTED,
        ``on_start``, then each update. Nothing when released already."""
        held, self._held = self._held, None
        if held is None:
            return
        first = self._first
        await self.events.enqueue_event(
            Task(
                id=self.task_id,
                context_id=self.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[first] if first is not None else [],
            )
        )
        if self._on_start is not None:
            await self._on_start()
        for update in held:
            await self.events.enqueue_event(update.event(self.task_id, self.context_id))

    async def update_status(
        self,
        state: TaskState,
        message: Message | None = None,
        timestamp: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        held = self._held
        if held is None or (state != WORKING and state not in TERMINAL_STATES):
            await self.release()
            await super().update_status(state, message, timestamp, metadata)
            return
        if self._ended:
            raise RuntimeError(f"Task {self.task_id} is already in a terminal state.")
        at: int | Timestamp
        if timestamp:
            at = Timestamp()
            at.FromDatetime(datetime.fromisoformat(timestamp.replace("Z", "+00:00")))
        else:
            at = _now_ns()
        held.append(_Status(state, message, at, metadata))
        if state in TERMINAL_STATES:
            self._ended = True
            task, settled = self._final(held)
            self._held = None  # anything after this is an event of the settled task
            if self._on_start is not None:
                await self._on_start()
            await self.events.settle(task, settled)

    async def add_artifact(
        self,
        parts: list[Part],
        artifact_id: str | None = None,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
        append: bool | None = None,
        last_chunk: bool | None = None,
        extensions: list[str] | None = None,
    ) -> None:
        held = self._held
        if held is None or append:
            await self.release()
            await super().add_artifact(
                parts, artifact_id, name, metadata, append, last_chunk, extensions
            )
            return
        made_id = artifact_id or uuid4_text()
        if (
            isinstance(parts, AnswerParts)
            and parts.data is not None
            and metadata is None
            and extensions is None
        ):
            wire = _artifact_wire(made_id, name, parts)
            if wire is not None:
                held.append(_Artifact(None, made_id, last_chunk, parts, wire, name or ""))
                return
        # Built now, as the SDK's updater builds it: what was added (a copy), and a bad field
        # refused here, while the run can still end FAILED.
        artifact = Artifact(
            artifact_id=made_id,
            name=name,
            parts=parts,
            metadata=metadata,
            extensions=extensions,
        )
        held.append(_Artifact(artifact, made_id, last_chunk))

    async def work(self, text: str) -> None:
        """``update_status(WORKING, message=self.new_agent_message([new_text_part(text)]))``,
        the message held as its fields while the run is (``_AgentText``)."""
        held = self._held
        if held is None or self._ended:
            await self.update_status(WORKING, message=self.new_agent_message([new_text_part(text)]))
            return
        message = _AgentText(uuid4_text(), self.task_id, self.context_id, text)
        held.append(_Status(WORKING, message, _now_ns(), None))

    def _final(self, held: list[_Status | _Artifact]) -> tuple[Task, Settled | None]:
        """The task as its events would leave it (``TaskManager``'s rules, as
        ``mesh._a2a.fastpath.AppliedEvents`` applies them: a new status moves the one before's
        message to the history and merges its metadata; an artifact is added, or replaces one
        of its id), made at once from the lists the updates leave; and what it was made of,
        when it has the shape ``Settled`` describes. A task of that shape is written in
        protobuf's wire format (``_task_wire``): its row as the store writes it, and the task
        it reads back, without the constructors' copies of its parts (each a serialize and a
        parse). The task is parsed from it now only when its bytes may nest past upb's depth
        (that parse decides) or the queue cannot take a stand-in (``takes_stand_in``); else
        the task handed on is its stand-in, and the task is parsed when read
        (``Settled.task``)."""
        first = self._first
        history: list[Message | _AgentText] = [first] if first is not None else []
        artifacts: list[_Artifact] = []
        metadata: list[dict[str, Any]] = []
        added = 0
        last: _Status | None = None
        for update in held:
            if isinstance(update, _Artifact):
                added += 1
                for i, existing in enumerate(artifacts):
                    if existing.artifact_id == update.artifact_id:
                        artifacts[i] = update
                        break
                else:
                    artifacts.append(update)
                continue
            if last is not None and last.message is not None:
                history.append(last.message)
            if update.metadata:
                metadata.append(update.metadata)
            last = update
        assert last is not None  # a held run ends with its terminal status
        shape = _shape(metadata[0]) if len(metadata) == 1 else None
        answer = artifacts[0].answer if added == 1 else None
        at = last.at
        if (
            answer is None
            or answer.data is None
            or shape is None
            or not metadata[0]
            or last.message is not None
            or not isinstance(at, int)
        ):
            return self._built(history, artifacts, metadata, last, shape), None
        made = artifacts[0]
        wired = None
        if made.wire is not None and 0 <= at < _MAX_AT_NS:
            wired = _task_wire(
                self.task_id,
                self.context_id,
                last.state,
                at,
                made.wire,
                history,
                _metadata_wire(metadata[0], shape),
            )
        task = stand_in = row = None
        if wired is not None:
            row, shallow = wired
            if shallow and self.events.takes_stand_in:
                # Its bytes parse (no chain of messages in them nears upb's depth): the task
                # is parsed only if read (``Settled.task``). A new empty task names it where
                # it is handed on: whoever takes it reads its id and state from ``Settled``
                # (``is_of``), not from it (a parse of its first fields, ~3,000 instructions).
                stand_in = Task()
            else:
                try:
                    task = Task.FromString(row)
                except DecodeError:
                    # Nested past upb's depth from the task down (a request's data): built by
                    # the constructors, whose copies answer for it (their error, or the task).
                    row = None
        if task is None and stand_in is None:
            task = self._built(history, artifacts, metadata, last, shape)
        settled = Settled(
            parsed=task,
            task_id=self.task_id,
            context_id=self.context_id,
            state=last.state,
            at_ns=at,
            artifact_id=made.artifact_id,
            name=made.name,
            data=answer.data,
            text=answer.text,
            metadata=metadata[0],
            shape=shape,
            row=row,
            # The answer writes a held agent message from its values, not from the task.
            history=history,
            stand_in=stand_in,
        )
        return settled.task if stand_in is None else stand_in, settled

    def _built(
        self,
        history: list[Message | _AgentText],
        artifacts: list[_Artifact],
        metadata: list[dict[str, Any]],
        last: _Status,
        shape: tuple[Any, ...] | None,
    ) -> Task:
        """The final task (``_final``) made by the constructors: a held message built where
        it is kept, the rest copied in."""
        # One status's metadata (the usual case) copied in as the task is built: what merging
        # it into the task's empty Struct gives (a copy is a clear, then a merge).
        task = Task(
            id=self.task_id,
            context_id=self.context_id,
            status=last.fields(),
            history=[m.fields() if isinstance(m, _AgentText) else m for m in history],
            artifacts=[update.artifact for update in artifacts],
            metadata=_made(metadata[0], shape) if len(metadata) == 1 else None,
        )
        if len(metadata) > 1:
            for values in metadata:
                merge_metadata(task.metadata, values)
        return task


# --- the wire format of a settled typed task ---------------------------------------------------
#
# What ``Task(...).SerializeToString()`` writes, field by field (protobuf's encoding: a key byte
# of field number and wire type, a varint length, the bytes), for the parts a settled typed
# task is made of; each part that is a message already (the request, the answer's parts, the
# metadata ``Struct``) is its own ``SerializeToString``. The bytes parse to the task the
# constructors build (tests/test_one_shot.py compares them over generated values). Written
# with few Python calls: each costs more than the C serialize of a small message.

_BYTE = [bytes((n,)) for n in range(128)]
#: A 7-bit group with the varint's continuation bit.
_MORE = [bytes((n | 0x80,)) for n in range(128)]
_ROLE_AGENT = b"\x20" + _BYTE[int(_AGENT)]
#: Past it a status time's seconds would not fit the ``Timestamp``'s int64: built instead.
_MAX_AT_NS = 1 << 63
#: The bytes a length-delimited field's key can begin with (wire type 2: a message, a string,
#: bytes): each message nested in another begins with one (and takes two bytes at least), so
#: a message holding fewer of them (or of bytes) nests fewer messages in it. The task's other
#: parts nest a few levels, fixed (an agent text message, a flat answer's artifact, a
#: metadata shape, the status).
_NESTING = bytes(b for b in range(256) if b & 7 == 2)
#: Most such bytes in a history message whose task's bytes surely parse: with the task and
#: the message themselves, 92 levels, under upb's limit of 100 (a request's nesting past it
#: is that parse's to refuse: tests/test_s38s_lazy_task.py).
_SHALLOW = 90


def _varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf varint: up to five bytes (a length, a ``Timestamp``'s
    nanoseconds: five past 2**28, most of them) from two tables of its 7-bit groups, no
    loop."""
    if n < 0x80:
        return _BYTE[n]
    if n < 0x4000:
        return _MORE[n & 0x7F] + _BYTE[n >> 7]
    if n < 0x10000000:
        if n < 0x200000:
            return _MORE[n & 0x7F] + _MORE[n >> 7 & 0x7F] + _BYTE[n >> 14]
        return _MORE[n & 0x7F] + _MORE[n >> 7 & 0x7F] + _MORE[n >> 14 & 0x7F] + _BYTE[n >> 21]
    if n < 0x800000000:
        return b"%b%b%b%b%b" % (
            _MORE[n & 0x7F],
            _MORE[n >> 7 & 0x7F],
            _MORE[n >> 14 & 0x7F],
            _MORE[n >> 21 & 0x7F],
            _BYTE[n >> 28],
        )
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(key: bytes, data: bytes) -> bytes:
    """A length-delimited field (``key``: its key byte): a message's or a string's bytes."""
    n = len(data)
    if n < 0x80:
        return key + _BYTE[n] + data
    return key + _varint(n) + data


def _text(key: bytes, text: str) -> bytes:
    """A string field, or nothing for an empty string (proto3); ``UnicodeEncodeError`` for
    text that is not UTF-8."""
    return _field(key, text.encode()) if text else b""


def _artifact_wire(artifact_id: Any, name: Any, parts: list[Part]) -> bytes | None:
    """``Artifact(artifact_id=artifact_id, name=name, parts=parts).SerializeToString()``, or
    None for a value the constructor may refuse or convert (not a str, not a ``Part``, text
    that is not UTF-8): that one is built by the constructor, which answers for it."""
    if type(artifact_id) is not str or (name is not None and type(name) is not str):
        return None
    try:
        out = [_text(b"\x0a", artifact_id), _text(b"\x12", name) if name else b""]
    except UnicodeEncodeError:
        return None
    for part in parts:
        if type(part) is not Part:
            return None
        out.append(_field(b"\x22", part.SerializeToString()))
    return b"".join(out)


#: The wire plan of each metadata shape (``_metadata_wire``): its members in the order of the
#: ``Struct`` kept for the shape (``_made``), each a string's key written ahead of its value,
#: or the whole member (a shape's token counts are its own); None: the shape is serialized.
_METADATA_WIRES: dict[tuple[Any, ...], list[tuple[str, bytes, bool]] | None] = {}
#: ``_METADATA_WIRES.get``'s answer for a shape not planned yet.
_UNPLANNED: list[tuple[str, bytes, bool]] = []


def _metadata_wire(values: dict[str, Any], shape: tuple[Any, ...]) -> bytes:
    """``_made(values, shape).SerializeToString()``: a metadata ``Struct``'s bytes written from
    ``values`` by the plan of its ``shape`` (the kept ``Struct``'s member order, read once),
    without setting its strings into the ``Struct`` (a wrapper object each) and serializing
    it. A plan is checked against the serialize it stands for when made."""
    plan = _METADATA_WIRES.get(shape, _UNPLANNED)
    if plan is _UNPLANNED:
        plan = _metadata_plan(values, shape)
    if plan is None:
        return _serialized(values, shape)
    out = []
    try:
        for key, head, text in plan:
            if not text:
                out.append(head)
                continue
            data = values[key].encode()
            n = len(data)
            value = b"\x1a" + (_BYTE[n] if n < 0x80 else _varint(n)) + data
            n = len(value)
            entry = head + (_BYTE[n] if n < 0x80 else _varint(n)) + value
            n = len(entry)
            out.append(b"\x0a" + (_BYTE[n] if n < 0x80 else _varint(n)) + entry)
    except UnicodeEncodeError:
        return _serialized(values, shape)  # its refusal
    return b"".join(out)


def _serialized(values: dict[str, Any], shape: tuple[Any, ...]) -> bytes:
    data: bytes = _made(values, shape).SerializeToString()
    return data


def _metadata_plan(
    values: dict[str, Any], shape: tuple[Any, ...]
) -> list[tuple[str, bytes, bool]] | None:
    """The plan of ``shape`` for ``_metadata_wire`` (kept while shapes are kept), or None. Its
    members' order is read from the kept ``Struct``'s bytes: a map serializes in an order of
    its own, not the order it iterates in."""
    made = _made(values, shape)
    if len(_METADATA_WIRES) >= _MAX_SHAPES or shape not in _MADE:
        return None
    data = made.SerializeToString()
    plan: list[tuple[str, bytes, bool]] = []
    at = 0
    try:
        while at < len(data):
            # a member: key 1, length-delimited (0x0a), its entry: its key (field 1), its value
            if data[at] != 0x0A:
                raise ValueError("not a Struct member")
            size, at = _read_varint(data, at + 1)
            entry, at = data[at : at + size], at + size
            if entry[:1] != b"\x0a":
                raise ValueError("not a member's key")
            size, start = _read_varint(entry, 1)
            key = entry[start : start + size].decode()
            if type(values[key]) is str:
                plan.append((key, entry[: start + size] + b"\x12", True))
            else:
                plan.append((key, _field(b"\x0a", entry), False))
    except (ValueError, KeyError, IndexError):
        _METADATA_WIRES[shape] = None
        return None
    _METADATA_WIRES[shape] = plan
    if _metadata_wire(values, shape) != data:
        _METADATA_WIRES[shape] = None  # never expected: the serialize stands
        return None
    return plan


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` in ``data``, and where it ends."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


#: The last second a status was written in, and its ``Timestamp.seconds`` field's bytes.
_second: tuple[int, bytes] = (0, b"")


def _task_wire(
    task_id: str,
    context_id: str,
    state: int,
    at_ns: int,
    artifact: bytes,
    history: list[Message | _AgentText],
    metadata: bytes,
) -> tuple[bytes, bool] | None:
    """The bytes of the task ``OneShotUpdater._built`` makes of a settled typed run: its ids, a
    status of ``state`` (> 0) at ``at_ns`` without a message, one artifact (its bytes), its
    history and its metadata (the ``Struct``'s bytes), with whether a parse of them cannot go
    past upb's depth (``_SHALLOW``); None for text that is not UTF-8 or a history entry that is
    no ``Message``. The pieces go to one list joined once (each ``+`` of bytes copies both),
    each varint of a length under 128 read from a table (no call)."""
    global _second
    seconds, nanos = divmod(at_ns, 1_000_000_000)
    if seconds != _second[0]:
        _second = (seconds, b"\x08" + _varint(seconds) if seconds else b"")
    stamp = _second[1] + b"\x10" + _varint(nanos) if nanos else _second[1]
    # status: its state (never 0 here: a settled state), its timestamp (present when zero)
    status = b"\x08" + (_BYTE[state] if state < 0x80 else _varint(state)) + b"\x1a"
    status += _BYTE[len(stamp)] + stamp
    out: list[bytes] = []
    add = out.append
    try:
        data = task_id.encode()
        if data:
            n = len(data)
            add(b"\x0a" + (_BYTE[n] if n < 0x80 else _varint(n)))
            add(data)
        data = context_id.encode()
        if data:
            n = len(data)
            add(b"\x12" + (_BYTE[n] if n < 0x80 else _varint(n)))
            add(data)
        n = len(artifact)
        add(
            b"\x1a" + _BYTE[len(status)] + status + b"\x22" + (_BYTE[n] if n < 0x80 else _varint(n))
        )
        add(artifact)
        shallow = True
        for message in history:
            if isinstance(message, _AgentText):
                data = message.wire()
            elif type(message) is Message:
                data = message.SerializeToString()
                # Each message nested in it takes two bytes at least (a key, a length), and
                # begins with a key's byte: fewer of either than _SHALLOW, it is shallow.
                if (
                    shallow
                    and len(data) > 2 * _SHALLOW
                    and len(data) - len(data.translate(None, _NESTING)) > _SHALLOW
                ):
                    shallow = False
            else:
                return None  # the constructors' to take or refuse
            n = len(data)
            add(b"\x2a" + (_BYTE[n] if n < 0x80 else _varint(n)))
            add(data)
    except UnicodeEncodeError:
        return None
    n = len(metadata)
    add(b"\x32" + (_BYTE[n] if n < 0x80 else _varint(n)))
    add(metadata)
    return b"".join(out), shallow


def merge_metadata(struct: Struct, values: dict[str, Any]) -> None:
    """``struct.MergeFrom`` the ``Struct`` made of ``values``: what applying a status update
    does to its task's metadata (the update's ``Struct`` built from the dict, then merged), to
    the byte (a ``Struct``'s map order follows how it was built). The ``Struct`` made of a
    shape of values seen before (the same keys in the same order, strings anywhere, the same
    zero token counts) is kept and its strings set anew: the same map, without building it (a
    Python call per key and per count, ~10 us for a task's usual metadata)."""
    struct.MergeFrom(_made(values, _shape(values)))


def _made(values: dict[str, Any], shape: tuple[Any, ...] | None) -> Struct:
    """The ``Struct`` of ``values`` for ``merge_metadata``: one kept for their ``shape``
    (``_shape(values)``), its strings set anew, or a new one."""
    made = _MADE.get(shape) if shape is not None else None
    if made is None:
        made = Struct()
        made.update(values)
        if shape is not None and len(_MADE) < _MAX_SHAPES:
            _MADE[shape] = made
    else:
        fields = made.fields
        for key, value in values.items():
            if type(value) is str:
                fields[key].string_value = value
    return made


def _shape(values: dict[str, Any]) -> tuple[Any, ...] | None:
    """What a ``Struct``'s map layout depends on: its keys in order and each value but a
    string's. Only strings and token counts of zero (a function skill's usage) are kept, so
    the shapes are few; None for anything else."""
    shape: list[Any] = []
    add = shape.append
    for key, value in values.items():
        kind = type(value)
        if kind is str:
            add(key)
        elif kind is dict:
            # a plain loop: ``all()`` over a generator costs a frame and a resume per count
            for count in value.values():
                if type(count) is not int or count:
                    return None
            add((key, tuple(value)))
        else:
            return None
    return tuple(shape)


#: Metadata ``Struct``s by shape (``merge_metadata``): a node's skills make a few.
_MADE: dict[tuple[Any, ...], Struct] = {}
_MAX_SHAPES = 256


def append_artifact(task: Task, new: Artifact, *, append: bool) -> None:
    """The SDK's ``append_artifact_to_task`` without its tracing wrapper (a span per call):
    a new artifact is added, one of the same id replaced, or (``append``) extended; appending
    to an artifact that does not exist is the agent's error."""
    for existing in task.artifacts:
        if existing.artifact_id == new.artifact_id:
            if append:
                existing.parts.extend(new.parts)
                existing.metadata.update(dict(new.metadata.items()))
            else:
                existing.CopyFrom(new)
            return
    if append:
        raise InvalidAgentResponseError(
            f"append=True for nonexistent artifact_id={new.artifact_id!r} in task {task.id!r}. "
            "The artifact must be created (append=False) before appending parts to it."
        )
    task.artifacts.append(new)


async def stepped(
    run: Coroutine[Any, Any, T],
    release: Callable[[], Awaitable[None]],
    then: Callable[[Awaitable[T]], Awaitable[T]] | None = None,
) -> T:
    """``await run``, where ``release`` is awaited first if ``run`` does not end in its first
    step (it waits on something: the loop runs before it ends) or ends by a ``BaseException``
    that is no ``Exception`` (a suspension, a cancellation: endings the run publishes as
    events). An ``Exception`` it raises at once is the caller's to end the run with, held.
    ``then``: what the rest of ``run``, once released, is awaited through (its deadline)."""
    try:
        waiting_on = run.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    except Exception:
        raise
    except BaseException:
        await release()
        raise
    try:
        await release()
    except BaseException:
        run.close()
        raise
    rest = _rest(run, waiting_on)
    return await (rest if then is None else then(rest))


@types.coroutine
def _rest(run: Coroutine[Any, Any, T], waiting_on: Any) -> Generator[Any, Any, T]:
    """The rest of ``run`` after its first step yielded ``waiting_on``: what ``await run``
    would have done from there (``yield from``'s rules: values sent and exceptions thrown in
    go to ``run``; closing closes it)."""
    while True:
        try:
            sent = yield waiting_on
        except GeneratorExit:
            run.close()
            raise
        except BaseException as exc:
            try:
                waiting_on = run.throw(exc)
            except StopIteration as done:
                result: T = done.value
                return result
        else:
            try:
                waiting_on = run.send(sent)
            except StopIteration as done:
                result = done.value
                return result
