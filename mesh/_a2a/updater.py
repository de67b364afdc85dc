"""``MeshTaskUpdater``: the SDK's ``TaskUpdater``, the same events made with less work.

The executor publishes every task's events through a ``TaskUpdater`` (a typed request makes
one and sends three or four events through it). The SDK's spends a fair part of a fast
request on bookkeeping around each event: its constructor builds two id generators and a set
of four enum members (each looked up through protobuf's Python enum wrapper), each status
update converts the time through a ``datetime``, each message id goes through an
``IDGeneratorContext``. This one keeps the interface and the events (same fields, the same
uuid4 ids, microsecond timestamps, the same refusal after a terminal state) and overrides
every method that made them, so none of the SDK's own state is read or needed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from mesh._a2a.ids import uuid4_text
from mesh._a2a.states import TERMINAL_STATES

__all__ = ["MeshTaskUpdater"]

# Read once: an enum value by attribute goes through the wrapper's ``__getattr__`` after a
# failed lookup (see ``mesh._a2a.states``).
_AGENT = Role.ROLE_AGENT


def _now() -> Timestamp:
    """Now, to the microsecond (what ``Timestamp.FromDatetime(datetime.now(UTC))`` gives)."""
    ns = time.time_ns()
    return Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000 // 1000 * 1000)


def _filled(struct: Struct, values: dict[str, Any]) -> bool:
    """Set ``values`` into the empty ``struct`` as ``Struct.update`` (protobuf's
    ``_SetStructValue`` for each value) sets them, the same fields in the same order, for
    values of exactly str, int, float, bool, None or dict (of the same): without a Python call
    and a chain of ``isinstance`` per value (a task's usage counts: five numbers, twice in a
    remote turn's final status). False at the first other value or key: the caller builds it
    as before, so what happens to that (converted, refused) is protobuf's own."""
    fields = struct.fields
    for key, value in values.items():
        if type(key) is not str:
            return False
        kind = type(value)
        if kind is str:
            fields[key].string_value = value
        elif kind is int or kind is float:
            fields[key].number_value = value
        elif kind is dict:
            inner = fields[key].struct_value
            inner.Clear()  # as _SetStructValue does: an empty dict is an empty Struct, set
            if not _filled(inner, value):
                return False
        elif kind is bool:
            fields[key].bool_value = value
        elif value is None:
            fields[key].null_value = 0
        else:
            return False
    return True


def _with_metadata(message: Any, metadata: dict[str, Any] | None) -> bool:
    """Give ``message`` (just made, without metadata) ``metadata`` as its constructor would
    (``_filled``); False when the constructor has to (the message is then to be made again)."""
    if metadata is None:
        return True
    if type(metadata) is not dict:
        return False
    target = message.metadata
    target.Clear()  # present, as the constructor leaves it, even when empty
    try:
        return _filled(target, metadata)
    except (TypeError, ValueError, OverflowError):  # an int past a double: the constructor's
        return False


class MeshTaskUpdater(TaskUpdater):
    """A ``TaskUpdater`` for one task of ``event_queue`` (see the module docstring)."""

    def __init__(self, event_queue: EventQueue, task_id: str, context_id: str) -> None:
        # Not the SDK's constructor: every method that reads what it sets is overridden here.
        self.event_queue = event_queue
        self.task_id = task_id
        self.context_id = context_id
        # One update at a time: the terminal check and the enqueue of one are not interleaved
        # with another's (an enqueue may await the store).
        self._updating = asyncio.Lock()
        self._ended = False

    async def update_status(
        self,
        state: TaskState,
        message: Message | None = None,
        timestamp: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        async with self._updating:
            if self._ended:
                raise RuntimeError(f"Task {self.task_id} is already in a terminal state.")
            if timestamp:
                at = Timestamp()
                at.FromDatetime(datetime.fromisoformat(timestamp.replace("Z", "+00:00")))
            else:
                at = _now()
            status = TaskStatus(state=state, message=message or None, timestamp=at)
            event = TaskStatusUpdateEvent(
                task_id=self.task_id, context_id=self.context_id, status=status
            )
            if not _with_metadata(event, metadata):
                event = TaskStatusUpdateEvent(
                    task_id=self.task_id,
                    context_id=self.context_id,
                    metadata=metadata,
                    status=status,
                )
            if state in TERMINAL_STATES:
                self._ended = True
            await self.event_queue.enqueue_event(event)

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
        await self.event_queue.enqueue_event(
            TaskArtifactUpdateEvent(
                task_id=self.task_id,
                context_id=self.context_id,
                artifact=Artifact(
                    artifact_id=artifact_id or uuid4_text(),
                    name=name,
                    parts=parts,
                    metadata=metadata,
                    extensions=extensions,
                ),
                append=append,
                last_chunk=last_chunk,
            )
        )

    def new_agent_message(
        self, parts: list[Part], metadata: dict[str, Any] | None = None
    ) -> Message:
        message_id = uuid4_text()
        message = Message(
            role=_AGENT,
            task_id=self.task_id,
            context_id=self.context_id,
            message_id=message_id,
            parts=parts,
        )
        if _with_metadata(message, metadata):
            return message
        return Message(
            role=_AGENT,
            task_id=self.task_id,
            context_id=self.context_id,
            message_id=message_id,
            metadata=metadata,
            parts=parts,
        )
