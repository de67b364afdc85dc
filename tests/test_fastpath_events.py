"""``AppliedEvents.fail``: a run on the fast path that raised ends its task FAILED with a
status message a client shows as the error (role agent, a text part), on the SDK's own
``TaskManager`` and ``InMemoryTaskStore`` (no node: an executor raising is a bug, which a real
agent cannot be made to have on purpose)."""

from __future__ import annotations

from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore, TaskManager
from a2a.types import (
    Artifact,
    Message,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidAgentResponseError
from google.protobuf.struct_pb2 import Struct, Value

from mesh._a2a.fastpath import FAILED_TEXT, AppliedEvents


def events_for(store: InMemoryTaskStore, task_id: str) -> AppliedEvents:
    manager = TaskManager(
        task_store=store,
        context=ServerCallContext(),
        task_id=task_id,
        context_id="c-1",
        initial_message=None,
    )
    return AppliedEvents(manager)


async def test_a_run_that_raised_before_its_task_ends_failed_with_a_message() -> None:
    store = InMemoryTaskStore()
    events = events_for(store, "t-1")
    await events.fail("t-1", by_agent=True)
    stored = await store.get("t-1", ServerCallContext())
    assert stored is not None
    assert stored.status.state == TaskState.TASK_STATE_FAILED
    assert stored.status.message.role == Role.ROLE_AGENT
    assert [p.text for p in stored.status.message.parts] == [FAILED_TEXT]


async def test_a_run_that_raised_midway_ends_failed_with_a_message() -> None:
    store = InMemoryTaskStore()
    events = events_for(store, "t-2")
    working = TaskStatus(state=TaskState.TASK_STATE_WORKING)
    await events.enqueue_event(Task(id="t-2", context_id="c-1", status=working))
    await events.fail("t-2", by_agent=True)
    stored = await store.get("t-2", ServerCallContext())
    assert stored is not None
    assert stored.status.state == TaskState.TASK_STATE_FAILED
    assert "internal error" in stored.status.message.parts[0].text


async def _applied(events: AppliedEvents, store: InMemoryTaskStore) -> tuple[Task | None, str]:
    """The stored task after a run of updates (status with metadata, artifacts created,
    replaced, appended to), and the error of an append to an artifact that does not exist."""
    working = TaskStatus(state=TaskState.TASK_STATE_WORKING)
    working.message.CopyFrom(Message(message_id="m-1", role=Role.ROLE_AGENT))
    first = Message(message_id="m-0", role=Role.ROLE_USER, parts=[new_text_part("hi")])
    await events.enqueue_event(
        Task(id="t-3", context_id="c-1", status=TaskStatus(state=1), history=[first])
    )
    await events.enqueue_event(
        TaskStatusUpdateEvent(task_id="t-3", context_id="c-1", status=working)
    )

    def chunk(artifact_id: str, text: str, *, append: bool) -> TaskArtifactUpdateEvent:
        artifact = Artifact(artifact_id=artifact_id, name="a", parts=[new_text_part(text)])
        artifact.metadata.update({"n": text})
        return TaskArtifactUpdateEvent(
            task_id="t-3", context_id="c-1", artifact=artifact, append=append
        )

    for event in (
        chunk("a-1", "one", append=False),
        chunk("a-2", "two", append=False),
        chunk("a-1", "one more", append=True),
        chunk("a-2", "two again", append=False),
    ):
        await events.enqueue_event(event)
    done = TaskStatusUpdateEvent(
        task_id="t-3",
        context_id="c-1",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
        metadata=Struct(fields={"skill": Value(string_value="s")}),
    )
    await events.enqueue_event(done)
    error = ""
    try:
        await events.enqueue_event(chunk("a-9", "none", append=True))
    except InvalidAgentResponseError as exc:
        error = str(exc)
    return await store.get("t-3", ServerCallContext()), error


async def test_updates_are_applied_as_the_sdks_task_manager_applies_them() -> None:
    """Given a store and a call context, ``AppliedEvents`` applies the events itself: the
    stored task and the refusal are the ``TaskManager``'s."""
    by_manager = InMemoryTaskStore()
    expected = await _applied(events_for(by_manager, "t-3"), by_manager)
    here = InMemoryTaskStore()
    direct = AppliedEvents(None, here, ServerCallContext(), task_id="t-3", context_id="c-1")
    assert await _applied(direct, here) == expected
    assert expected[1].startswith("append=True for nonexistent artifact_id='a-9'")


async def test_direct_is_the_constructors_events() -> None:
    """``AppliedEvents.direct`` (the fast path's, made without ``EventQueue.__new__``) holds
    what ``AppliedEvents(None, store, context, ...)`` holds, and applies the same events."""
    store, context = InMemoryTaskStore(), ServerCallContext(state={"mesh.x": True})
    first = Message(message_id="m-1", role=Role.ROLE_USER)
    made = AppliedEvents(
        None, store, context, task_id="t-3", context_id="c-1", initial_message=first
    )
    direct = AppliedEvents.direct(
        store, context, task_id="t-3", context_id="c-1", initial_message=first
    )
    assert type(direct) is AppliedEvents
    assert direct.taps == []
    assert direct.taps is not made.taps
    assert vars(direct) == vars(made)
    here = InMemoryTaskStore()
    expected = await _applied(
        AppliedEvents(None, here, ServerCallContext(), task_id="t-3", context_id="c-1"), here
    )
    again = InMemoryTaskStore()
    applied = AppliedEvents.direct(
        again, ServerCallContext(), task_id="t-3", context_id="c-1", initial_message=None
    )
    assert await _applied(applied, again) == expected
