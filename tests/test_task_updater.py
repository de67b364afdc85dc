"""``MeshTaskUpdater`` makes the events the SDK's ``TaskUpdater`` makes (modulo the ids and
times each generates), and refuses what it refuses."""

from __future__ import annotations

import re
import time

import pytest
from a2a.helpers import new_text_part
from a2a.server.events import Event, EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent
from google.protobuf.json_format import MessageToDict

from mesh._a2a.updater import MeshTaskUpdater

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


class _Kept(EventQueue):
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def enqueue_event(self, event: Event) -> None:
        self.events.append(event)


async def _publish(updater: TaskUpdater) -> None:
    await updater.start_work(updater.new_agent_message([new_text_part("running")], {"k": 1}))
    await updater.add_artifact([new_text_part("chunk")], name="answer", last_chunk=False)
    await updater.add_artifact(
        [new_text_part("all")], artifact_id="a-1", name="answer", append=False, last_chunk=True
    )
    await updater.update_status(
        TaskState.TASK_STATE_COMPLETED,
        metadata={"skill": "s", "usage": {"input_tokens": 3}, "flags": [True, None, "x"]},
    )


def _shape(event: Event, ids: dict[str, str]) -> object:
    """The event as a dict, each generated id named by its order, times checked and dropped."""
    found = MessageToDict(event)
    if isinstance(event, TaskStatusUpdateEvent):
        status = found["status"]
        stamp = event.status.timestamp
        assert abs(stamp.ToNanoseconds() - time.time_ns()) < 10**9
        assert stamp.nanos % 1000 == 0  # microseconds, as datetime gives
        del status["timestamp"]
        if "message" in status:
            generated = status["message"]["messageId"]
            assert _UUID.match(generated)
            status["message"]["messageId"] = ids.setdefault(generated, f"id-{len(ids)}")
    if isinstance(event, TaskArtifactUpdateEvent) and event.artifact.artifact_id != "a-1":
        generated = event.artifact.artifact_id
        assert _UUID.match(generated)
        found["artifact"]["artifactId"] = ids.setdefault(generated, f"id-{len(ids)}")
    return found


async def test_the_events_are_the_sdks() -> None:
    sdk, mine = _Kept(), _Kept()
    await _publish(TaskUpdater(sdk, "t-1", "c-1"))
    await _publish(MeshTaskUpdater(mine, "t-1", "c-1"))
    assert [type(e) for e in mine.events] == [type(e) for e in sdk.events]
    assert [_shape(e, {}) for e in mine.events] == [_shape(e, {}) for e in sdk.events]


async def test_a_given_timestamp_is_kept() -> None:
    sdk, mine = _Kept(), _Kept()
    at = "2026-01-02T03:04:05.123456Z"
    await TaskUpdater(sdk, "t", "c").update_status(TaskState.TASK_STATE_WORKING, timestamp=at)
    await MeshTaskUpdater(mine, "t", "c").update_status(TaskState.TASK_STATE_WORKING, timestamp=at)
    assert mine.events == sdk.events


@pytest.mark.parametrize("cls", [TaskUpdater, MeshTaskUpdater])
async def test_no_update_after_a_terminal_state(cls: type[TaskUpdater]) -> None:
    updater = cls(_Kept(), "t-9", "c")
    await updater.update_status(TaskState.TASK_STATE_FAILED)
    with pytest.raises(RuntimeError, match="t-9 is already in a terminal state"):
        await updater.update_status(TaskState.TASK_STATE_WORKING)
