"""A tool of an LLM agent asks (``mesh.Ask``): real ``mesh serve`` processes of
tests.llm_ask_agents (scripted model, offline), driven by the real a2a-sdk client. The task
waits INPUT_REQUIRED with the tool's question; the answer is that call's response and the turn
completes with it (``chat`` and a typed ``llm_skill`` alike); an invalid answer names the field;
a new turn in the waiting context is REJECTED; a kill -9 while waiting loses nothing; a cancel
frees the context."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import CancelTaskRequest, Message, Task, TaskState
from google.protobuf.json_format import MessageToDict

from tests.support import eventually
from tests.test_node_ask import (
    Asker,
    artifact_data,
    error_of,
    ext_of,
    get,
    message,
    send,
    status_texts,
    stream,
)

pytestmark = pytest.mark.integration

WAITING = TaskState.TASK_STATE_INPUT_REQUIRED
COMPLETED = TaskState.TASK_STATE_COMPLETED


def desk_node(tmp: Path) -> Asker:
    """One restartable node of tests.llm_ask_agents."""
    return Asker(tmp, name="desk", target="tests.llm_ask_agents:agent")


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asker]:
    node = desk_node(tmp_path_factory.mktemp("llm-ask"))
    with node.serve():
        yield node


def chat(text: str, *, context: str | None = None) -> Message:
    msg = message(text=text)
    if context is not None:
        msg.context_id = context
    return msg


def answer(task: Task, **data: Any) -> Message:
    return message(data=data, task=task)


def text_of(task: Task) -> str:
    return task.artifacts[-1].parts[0].text


async def test_a_chat_turn_whose_tool_asks_waits_and_the_answer_completes_it(
    desk: Asker, http: httpx.AsyncClient
) -> None:
    client = await desk.client(http)
    task = await send(client, chat("pay APP-1 80,000"))
    assert task.status.state == WAITING, task
    assert status_texts(task) == ["Approve APP-1 for 80,000?"]
    schema = MessageToDict(task.status.message.parts[1].data)
    assert schema["properties"]["decision"]["enum"] == ["approve", "decline"]
    (entry,) = ext_of(task.status.message.metadata)["questions"]
    assert entry["text"] == "Approve APP-1 for 80,000?"
    assert entry["id"].startswith("q-")
    assert entry["schema"] is True
    assert ext_of(task.metadata)["questions"] == [entry]
    assert desk.waits("task_id, kind, state") == [(task.id, "turn", "waiting")]

    # A new turn in the same context, while the task waits: REJECTED, naming it.
    other = await send(client, chat("hello", context=task.context_id))
    assert other.status.state == TaskState.TASK_STATE_REJECTED
    assert status_texts(other) == [
        f"context {task.context_id} has task {task.id} waiting for input; answer it (a "
        f"message with taskId {task.id}) or cancel it"
    ]

    done = await send(client, answer(task, decision="approve", note="checked"))
    assert done.status.state == COMPLETED, done
    stored = await get(client, task.id)
    # The answer is the call's response; the finished call's state was applied once.
    assert text_of(stored) == "Ann Lee: approve (checked); lookups 1"
    assert desk.calls().count("lookup APP-1") == 1
    assert await eventually(lambda: desk.waits() == [], what="the resume point to go")

    # The context takes turns again.
    hello = await send(client, chat("hello", context=task.context_id))
    assert hello.status.state == COMPLETED
    assert text_of(await get(client, hello.id)) == "hello back"


async def test_a_typed_llm_skill_asks_an_invalid_answer_names_the_field_and_a_streamed_answer_completes_it(
    desk: Asker, http: httpx.AsyncClient
) -> None:
    client = await desk.client(http)
    task = await send(
        client, message(data={"applicant_id": "APP-2", "amount": 90000}, skill="payout")
    )
    assert task.status.state == WAITING, task
    assert status_texts(task) == ["Approve APP-2 for 90,000?"]
    qid = ext_of(task.status.message.metadata)["questions"][0]["id"]

    wrong = await send(client, answer(task, decision="maybe"))
    assert wrong.status.state == WAITING
    texts = status_texts(wrong)
    assert texts[0].startswith(f"invalid answer to {qid}: field 'decision': ")
    assert texts[1] == "Approve APP-2 for 90,000?"

    streaming = await desk.client(http, streaming=True)
    events = await stream(streaming, answer(task, decision="decline", note="too much"))
    final = events[-1]
    assert final.WhichOneof("payload") == "status_update"
    assert final.status_update.status.state == COMPLETED
    done = await get(client, task.id)
    assert artifact_data(done) == {
        "applicant_id": "APP-2",
        "decision": "decline",
        "note": "too much",
    }


async def test_a_turn_waiting_at_a_kill_9_waits_after_the_restart_and_its_answer_completes_it(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    node = desk_node(tmp_path)
    with node.serve() as proc:
        client = await node.client(http)
        task = await send(client, chat("pay APP-3 70,000"))
        assert task.status.state == WAITING
        proc.kill()
    with node.serve():
        client = await node.client(http)
        stored = await get(client, task.id)
        assert stored.status.state == WAITING
        assert status_texts(stored) == ["Approve APP-3 for 70,000?"]
        # Still waiting across the restart: a new turn in its context is refused.
        other = await send(client, chat("hello", context=task.context_id))
        assert other.status.state == TaskState.TASK_STATE_REJECTED
        done = await send(client, answer(task, decision="approve", note="after restart"))
        assert done.status.state == COMPLETED, done
        assert text_of(await get(client, task.id)) == "Ann Lee: approve (after restart); lookups 1"
    assert node.calls() == ["lookup APP-3"]


async def test_cancel_of_a_waiting_turn_frees_its_context(
    desk: Asker, http: httpx.AsyncClient
) -> None:
    client = await desk.client(http)
    task = await send(client, chat("pay APP-4 60,000"))
    assert task.status.state == WAITING
    canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert error_of(await get(client, task.id))["reason"] == "canceled"
    # The context takes a new turn; the model is never sent the call left unanswered.
    hello = await send(client, chat("hello", context=task.context_id))
    assert hello.status.state == COMPLETED, hello
    assert text_of(await get(client, hello.id)) == "hello back"
    again = await send(client, chat("pay APP-4 20,000", context=task.context_id))
    assert again.status.state == COMPLETED, again
    assert text_of(await get(client, again.id)).startswith("Ann Lee: approve (small amount)")
