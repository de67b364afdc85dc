"""A settled task's answer writes a held agent text message (``OneShotUpdater.work``) from the
values it was made of, not by walking the task's copy of it: the same text as the walk, for
any ids and text, any number of such messages among others, and any first history index."""

from __future__ import annotations

import json

from a2a.helpers import new_text_part
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import Message, Role, TaskState
from google.protobuf.json_format import MessageToDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh._a2a import fastpath_json
from mesh._a2a.artifacts import answer_parts
from mesh._a2a.fastpath import AppliedEvents
from mesh._a2a.fastpath_json import SETTLED, AgentText, Settled, response_text, rpc_result
from mesh._a2a.one_shot import OneShotUpdater, _AgentText
from mesh._a2a.store import SINGLE_WRITE

TRACE = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
META = {"skill": "score", "traceparent": TRACE}
# Any text protobuf takes (UTF-8: no lone surrogates), JSON's escapes and a template's sign.
TEXT = st.text(st.characters(exclude_categories=["Cs"])) | st.sampled_from(
    ["", "%s", "%%", '"\\', "\u2028\u2029", "\x00", "grüße 🙂"]
)
# A held run's steps before its answer: an agent text message (work), or a message of the
# skill's own (a Message, walked as before).
STEP = st.one_of(st.tuples(st.just("work"), TEXT), st.tuples(st.just("message"), TEXT))


async def _run(task_id: str, context_id: str, steps: list[tuple[str, str]]) -> AppliedEvents:
    context = ServerCallContext()
    context.state[SINGLE_WRITE] = True
    first = Message(
        role=Role.ROLE_USER,
        message_id="m-0",
        task_id=task_id,
        context_id=context_id,
        parts=[new_text_part("score me")],
    )
    events = AppliedEvents(
        None,
        InMemoryTaskStore(),
        context,
        task_id=task_id,
        context_id=context_id,
        initial_message=first,
    )
    updater = OneShotUpdater(events, task_id, context_id, first)
    for i, (kind, text) in enumerate(steps):
        if kind == "work":
            await updater.work(text)
        else:
            message = Message(
                role=Role.ROLE_AGENT,
                message_id=f"m-{i + 1}",
                task_id=task_id,
                context_id=context_id,
                parts=[new_text_part(text)],
            )
            await updater.start_work(message)
    await updater.add_artifact(
        answer_parts({"tier": "A", "score": 1.5}, "", typed=True),
        artifact_id="answer-1",
        name="score",
        append=False,
        last_chunk=True,
    )
    await updater.update_status(TaskState.TASK_STATE_COMPLETED, metadata=dict(META))
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    task_id=st.sampled_from(["task-1", 't\u03b1sk "1"', "%s"]) | st.text(max_size=8),
    context_id=st.sampled_from(["context-1", "ctx\u2028"]) | st.text(max_size=8),
    steps=st.lists(STEP, max_size=4),
    extra=st.integers(-3, 3),
)
async def test_a_held_agent_message_is_written_as_the_walk_writes_it(
    task_id: str, context_id: str, steps: list[tuple[str, str]], extra: int
) -> None:
    events = await _run(task_id, context_id, steps)
    assert events._context is not None
    settled = events._context.state.get(SETTLED)
    task = events.task
    assert task is not None
    assert isinstance(settled, Settled)  # this run's shape is always settled
    assert settled.task is task
    assert len(settled.history) == len(task.history) == 1 + len(steps)
    held = [entry for entry in settled.history if isinstance(entry, AgentText)]
    assert len(held) == sum(kind == "work" for kind, _ in steps)
    for start in [*range(len(task.history) + 1), extra, len(task.history) + extra]:
        walked = MessageToDict(task)
        if walked["history"][start:]:
            walked["history"] = walked["history"][start:]
        else:
            del walked["history"]
        expected = json.dumps({"task": walked}, ensure_ascii=False, separators=(",", ":"))
        assert response_text(task, start, settled) == expected
        assert response_text(task, start) == expected
        enveloped = rpc_result(task, "r-%s", start, settled)
        assert enveloped == rpc_result(task, "r-%s", start)


@settings(max_examples=300, deadline=None)
@given(message_id=TEXT, task_id=TEXT, context_id=TEXT, text=TEXT)
def test_an_agent_message_from_its_values_is_its_walked_text(
    message_id: str, task_id: str, context_id: str, text: str
) -> None:
    held = _AgentText(message_id, task_id, context_id, text)
    written = fastpath_json._agent_text(held)
    walked = fastpath_json._message_text(Message(**held.fields()))
    if message_id and task_id and context_id:
        assert written == walked
    else:
        assert written is None  # the walk leaves an empty id's member out: walked instead


def test_the_template_is_the_walks_own() -> None:
    template = fastpath_json._agent_text_template()
    assert template == (
        '{"messageId":%s,"contextId":%s,"taskId":%s,"role":"ROLE_AGENT","parts":[{"text":%s}]}'
    )


async def test_a_settled_task_without_held_messages_reads_its_history() -> None:
    events = await _run("task-1", "context-1", [("message", "running")])
    assert events._context is not None
    settled = events._context.state[SETTLED]
    assert len(settled.history) == 2
    assert not any(isinstance(entry, AgentText) for entry in settled.history)
    task = events.task
    assert task is not None
    # A Settled made without its history (any other maker) reads the task's, as before.
    bare = Settled(**{**settled.__dict__, "history": ()})
    for start in range(3):
        assert response_text(task, start, bare) == response_text(task, start, settled)
