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


_METADATA = [
    None,
    {},
    {"skill": "chat", "usage": {"inputTokens": 3, "outputTokens": 0}, "childrenUsage": {}},
    {
        "skill": "s",
        "caller": "lead",
        "traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01",
        "usage": {"inputTokens": 120, "outputTokens": 40, "totalTokens": 160, "requests": 2},
        "childrenUsage": {"inputTokens": 7, "outputTokens": 1, "totalTokens": 8, "requests": 1},
    },
    {"n": 1.5, "neg": -0.0, "big": 2**60, "t": True, "f": False, "none": None, "s": ""},
    {"deep": {"a": {"b": {"c": {}}}, "z": {"y": 1}}, "é": "ü"},
    {"nan": float("nan"), "inf": float("-inf")},
    # Not plain: made by protobuf as before.
    {"flags": [True, None, "x"], "t": ("a", 1)},
    {"enum": TaskState.TASK_STATE_WORKING, "sub": {"k": [1, {"x": 2}]}},
]


class _Sub(dict):  # type: ignore[type-arg]
    pass


@pytest.mark.parametrize("metadata", [*_METADATA, _Sub(a=1), {"x": _Sub(b=2)}])
async def test_metadata_is_the_constructors_to_the_byte(metadata: dict | None) -> None:
    """A status's and a message's metadata as ``TaskStatusUpdateEvent(metadata=...)`` and
    ``Message(metadata=...)`` make it: the same bytes, the same keys in the same order (upb's
    map order follows how a map was filled), present when empty."""
    from a2a.types import Message, Role, TaskStatus

    from mesh._a2a.updater import _AGENT

    kept = _Kept()
    updater = MeshTaskUpdater(kept, "t", "c")
    message = updater.new_agent_message([new_text_part("m")], metadata)
    await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=metadata)
    (event,) = kept.events
    assert isinstance(event, TaskStatusUpdateEvent)
    want = TaskStatusUpdateEvent(
        task_id="t",
        context_id="c",
        metadata=metadata,
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED, timestamp=event.status.timestamp),
    )
    want_message = Message(
        role=_AGENT,
        task_id="t",
        context_id="c",
        message_id=message.message_id,
        metadata=metadata,
        parts=[new_text_part("m")],
    )
    assert _AGENT == Role.ROLE_AGENT
    for got, expected in ((event, want), (message, want_message)):
        assert got.SerializeToString() == expected.SerializeToString()
        assert got.HasField("metadata") == expected.HasField("metadata")
        if metadata is None or "nan" not in metadata:  # NaN has no JSON: bytes only
            assert MessageToDict(got) == MessageToDict(expected)
        assert _keys(got.metadata) == _keys(expected.metadata)


def _keys(struct: object) -> list[object]:
    """Every key of a Struct, nested ones too, in the order upb iterates them."""
    from google.protobuf.struct_pb2 import Struct

    assert isinstance(struct, Struct)
    out: list[object] = []
    for key in struct.fields:
        value = struct.fields[key]
        out.append(key)
        if value.WhichOneof("kind") == "struct_value":
            out.append(_keys(value.struct_value))
    return out


@pytest.mark.parametrize(
    "metadata",
    [
        {"x": object()},
        {1: 2},
        {"x": 10**400},
        {"a": {2: 1}},
        {"s": "\ud800"},
        {"a": {"b": [object()]}},
    ],
)
async def test_metadata_protobuf_refuses_is_refused_as_before(metadata: dict) -> None:
    from a2a.types import TaskStatus

    try:
        TaskStatusUpdateEvent(metadata=metadata, status=TaskStatus())
    except Exception as exc:  # whatever protobuf raises, the updater raises
        expected: BaseException = exc
    updater = MeshTaskUpdater(_Kept(), "t", "c")
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        await updater.update_status(TaskState.TASK_STATE_WORKING, metadata=metadata)
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        updater.new_agent_message([new_text_part("m")], metadata)


async def test_plain_metadata_is_set_without_protobufs_python_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The usage counts of a final status (str, numbers, dicts of them) are set field by field
    without ``Struct.update``'s Python call and ``isinstance`` chain per value."""
    from google.protobuf.internal import well_known_types

    def refused(*args: object) -> None:
        raise AssertionError("Struct.update called")

    monkeypatch.setattr(well_known_types.Struct, "update", refused)
    kept = _Kept()
    updater = MeshTaskUpdater(kept, "t", "c")
    meta = {"skill": "s", "usage": {"inputTokens": 3}, "childrenUsage": {"inputTokens": 1}}
    message = updater.new_agent_message([new_text_part("m")], {"toolCalls": True})
    await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=meta)
    assert MessageToDict(kept.events[0])["metadata"] == meta
    assert MessageToDict(message)["metadata"] == {"toolCalls": True}
