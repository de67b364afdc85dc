"""``AppliedEvents.fail``: a run on the fast path that raised ends its task FAILED with a
status message a client shows as the error (role agent, a text part), on the SDK's own
``TaskManager`` and ``InMemoryTaskStore`` (no node: an executor raising is a bug, which a real
agent cannot be made to have on purpose)."""

from __future__ import annotations

from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore, TaskManager
from a2a.types import Role, Task, TaskState, TaskStatus

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
