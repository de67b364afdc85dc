"""``Relay``: live progress of a task, and of the tasks it delegates to, for whoever follows it.

A task is *followed* while its caller reads it as a stream (``SendStreamingMessage``: the
request handler marks the call, ``mark_streamed``) or someone subscribes to it
(``SubscribeToTask``: counted in ``Followers`` while the subscription lasts). Only then:

* ``ctx.progress(text)`` of a function skill becomes a WORKING status update of its task;
* each delegation of the turn streams its child (``A2APeer.stream``, the same message id)
  instead of the one blocking ``SendMessage``, and ``ChildRelay.forward`` publishes the child's
  events as WORKING status updates of this task, tagged in their message's metadata
  ``["urn:mesh:tasks:v1"]["relay"]``::

      {"from": [{"agent": "stream-middle", "task": "T-m"}, {"agent": "stream-bottom", "task": "T-b"}],
       "kind": "status", "state": "TASK_STATE_WORKING", "partial": false}

  ``from`` runs from this task's direct child down to where the event happened: a child's own
  event gets ``[child]``, an event the child relayed gets ``[child] + its from``, so progress
  three hops down reaches the top in order with its whole path. An artifact chunk of a child
  is relayed with ``kind: "artifact"`` (and ``artifactId``, ``append``, ``lastChunk``): its
  parts become the status message's parts, never an artifact of this task. A chunk that is
  not the last (a child's model writing its answer, see ``mesh._a2a.artifacts``) is partial
  text; partial text is coalesced (at most one update per source every ``COALESCE_S``). A
  child's interrupted and final states are not relayed as progress: its question or its answer is the delegation's
  result, as on the blocking path.

A task nobody follows pays a flag check: nothing here runs, and a delegation stays one
blocking request.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskUpdater
from a2a.types import Part, TaskState
from google.protobuf.json_format import ParseDict, ParseError

from mesh._a2a.metadata_keys import ARTIFACT_ID, LAST_CHUNK, read
from mesh._a2a.results import TaskUpdate
from mesh._asks import TASKS_EXTENSION

__all__ = ["COALESCE_S", "STREAMED", "ChildRelay", "Followers", "Relay", "mark_streamed"]

#: Key of ``ServerCallContext.state``: true in the call of a ``SendStreamingMessage``.
STREAMED = "mesh.streamed"
#: Partial text of one source is relayed at most this often (the rest is joined to it).
COALESCE_S = 0.05
# A child's states that are not progress: the delegation's result says them.
_NOT_PROGRESS = frozenset(
    {"completed", "failed", "rejected", "canceled", "input-required", "auth-required"}
)


def mark_streamed(context: ServerCallContext) -> None:
    """Tell the executor that ``context`` is the call of a streamed send."""
    context.state[STREAMED] = True


class Followers:
    """The tasks someone follows by ``SubscribeToTask`` now (in this process), by count, and
    those a follower on another replica asked for (``remote``: the ``TaskFeed`` of replicas
    on one PostgreSQL, whose followers' leases it keeps)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self.remote: _Remote | None = None

    def add(self, task_id: str) -> None:
        self._count[task_id] = self._count.get(task_id, 0) + 1

    def discard(self, task_id: str) -> None:
        left = self._count.get(task_id, 0) - 1
        if left > 0:
            self._count[task_id] = left
        else:
            self._count.pop(task_id, None)

    def __contains__(self, task_id: object) -> bool:
        if task_id in self._count:
            return True
        return self.remote is not None and isinstance(task_id, str) and self.remote.wanted(task_id)


class _Remote(Protocol):
    def wanted(self, task_id: str) -> bool: ...


class Relay:
    """The live side of one run of a task: its own progress, and its children's relayed.

    ``live`` is read at each use (a subscription that starts mid-run counts from the next
    delegation or progress report on)."""

    def __init__(self, updater: TaskUpdater, *, streamed: bool, followers: Followers) -> None:
        self.updater = updater
        self.streamed = streamed
        self.followers = followers

    @property
    def live(self) -> bool:
        """Whether someone follows the task now."""
        return self.streamed or self.updater.task_id in self.followers

    async def say(self, text: str) -> None:
        """A WORKING status update saying ``text``, when someone follows the task."""
        if not self.live:
            return
        updater = self.updater
        await updater.update_status(
            TaskState.TASK_STATE_WORKING,
            message=updater.new_agent_message([new_text_part(text)], {"progress": True}),
        )

    def child(self, agent: str) -> ChildRelay:
        """The relay of one delegation's child task at ``agent`` (one per stream: its events
        are forwarded in order, by the one coroutine reading that stream)."""
        return ChildRelay(self.updater, agent)


class ChildRelay:
    """Forwards one child task's events (see the module docstring)."""

    def __init__(self, updater: TaskUpdater, agent: str) -> None:
        self.updater = updater
        self.agent = agent
        self.task_id = ""
        # Partial text not relayed yet: its tag, its text, when the first chunk came.
        self._pending: tuple[dict[str, Any], str, float] | None = None

    async def forward(self, update: TaskUpdate) -> None:
        """Relay ``update`` of the child (its task id is learnt from the first event)."""
        if update.task_id and not self.task_id:
            self.task_id = update.task_id
        tag: dict[str, Any]
        if update.kind == "artifact":
            # A chunk that is not the last is the child's model writing: partial text.
            tag = {
                "kind": "artifact",
                ARTIFACT_ID: update.artifact_id,
                "append": update.append,
                LAST_CHUNK: update.last_chunk,
                "partial": not update.last_chunk,
            }
        elif update.kind != "status" or update.state in _NOT_PROGRESS or not update.parts:
            return
        else:
            relayed = update.relay or {}
            tag = {
                "kind": str(relayed.get("kind") or "status"),
                "state": str(relayed.get("state") or _proto_state(update.state)),
                "partial": bool(update.partial or relayed.get("partial")),
            }
            for key in (ARTIFACT_ID, "append", LAST_CHUNK):
                value = read(relayed, key)  # a node before camelCase: artifact_id, last_chunk
                if value is not None:
                    tag[key] = value
        tagged = self._tagged(update, tag)
        if not tag["partial"]:
            await self.flush()
            await self._publish(tagged, list(update.parts))
            return
        pending, now = self._pending, time.monotonic()
        if pending is not None and pending[0] != tagged:
            await self.flush()
            pending = None
        text = (pending[1] if pending else "") + update.text
        started = pending[2] if pending else now
        self._pending = (tagged, text, started)
        if now - started >= COALESCE_S:
            await self.flush()

    async def flush(self) -> None:
        """Relay the partial text held back (call at the end of the child's stream)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[1]:
            await self._publish(pending[0], [{"text": pending[1]}])

    def _tagged(self, update: TaskUpdate, tag: dict[str, Any]) -> dict[str, Any]:
        hop = {"agent": self.agent, "task": self.task_id or update.task_id}
        return {"from": [hop, *update.hops], **tag}

    async def _publish(self, relay: dict[str, Any], parts: list[Mapping[str, Any]]) -> None:
        message = self.updater.new_agent_message(
            [_part(p) for p in parts] or [new_text_part("")], {TASKS_EXTENSION: {"relay": relay}}
        )
        await self.updater.update_status(TaskState.TASK_STATE_WORKING, message=message)


def _proto_state(state: str) -> str:
    """``"working"`` -> ``"TASK_STATE_WORKING"`` (the wire's spelling)."""
    return "TASK_STATE_" + state.upper().replace("-", "_")


def _part(part: Mapping[str, Any]) -> Part:
    """A part in its JSON form back as protobuf; one the SDK cannot read becomes its text."""
    try:
        parsed: Part = ParseDict(dict(part), Part())
    except ParseError:
        return new_text_part(str(part.get("text") or ""))
    return parsed
