"""A structured answer sent as text (issue 14 item 4 for waiting tasks): a text-only client
(Google ADK, a chat UI, curl) answers a question that has a JSON Schema with ONE text part
holding a JSON object, or ADK's ``<a2a_datapart_json>`` wrapping of it, the same rules as a
typed skill's input (``mesh._a2a.json_text``). Real ``mesh serve`` processes of
tests.ask_agents, driven by the real a2a-sdk client."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import Message, Part, Role, TaskState

from tests.test_delegation_wait import Chain
from tests.test_node_ask import (
    EXT,
    WAITING,
    Asker,
    artifact_data,
    ext_of,
    get,
    message,
    review,
    send,
    status_texts,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asker]:
    asker = Asker(tmp_path_factory.mktemp("ask-text"))
    with asker.serve():
        yield asker


def parts_answer(task: Any, parts: list[Part], **meta: Any) -> Message:
    msg = Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=parts)
    msg.task_id, msg.context_id = task.id, task.context_id
    if meta:
        msg.metadata.update(meta)
    return msg


@pytest.mark.parametrize(
    "written",
    [
        '{"decision": "approve", "note": "as text"}',
        '```json\n{"decision": "approve", "note": "as text"}\n```',
    ],
    ids=["bare", "fenced"],
)
async def test_a_json_object_in_text_answers_a_structured_question_and_the_task_completes(
    node: Asker, http: httpx.AsyncClient, written: str
) -> None:
    client = await node.client(http)
    applicant = f"APP-T{uuid.uuid4().hex[:6]}"
    task = await send(client, review(applicant))
    assert task.status.state == WAITING
    again = await send(client, message(text=written, task=task))
    # The answer was taken: the skill ran again and asks its next (text) question.
    assert again.status.state == WAITING, status_texts(again)
    assert status_texts(again) == ["Who approves?"]
    done = await send(client, message(text="Ada", task=task))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    assert artifact_data(await get(client, task.id)) == {
        "applicant_id": applicant,
        "decision": "approve",
        "note": "as text",
        "reviewer": "Ada",
    }
    assert node.calls(f"review decided {applicant}") == [f"review decided {applicant} approve"]


async def test_an_invalid_json_text_answer_names_the_field_and_the_task_stays_waiting(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http)
    task = await send(client, review("APP-T3"))
    runs = len(node.calls("review run APP-T3"))
    bad = await send(client, message(text='{"decision": "maybe"}', task=task))
    assert bad.status.state == WAITING
    texts = status_texts(bad)
    assert texts[0].startswith("invalid answer to q-0: field 'decision': "), texts
    assert texts[1] == "Approve APP-T3 for 600,000?"
    (entry,) = ext_of(bad.status.message.metadata)["questions"]
    assert entry["invalid"][0]["field"] == "decision"
    # A missing required field is named too.
    missing = await send(client, message(text='{"note": "no decision"}', task=task))
    assert status_texts(missing)[0] == "invalid answer to q-0: field 'decision': is required"
    # Text that looks like an object but is not JSON says so.
    broken = await send(client, message(text='{"decision": approve}', task=task))
    assert status_texts(broken)[0].startswith(
        "invalid answer to q-0: field '(answer)': the text is not a JSON object"
    ), status_texts(broken)
    # Plain text is still refused, saying what the question takes.
    plain = await send(client, message(text="yes", task=task))
    said = status_texts(plain)[0]
    assert "takes exactly one data part" in said, said
    assert "or one text part holding a JSON object" in said, said
    # Nothing ran, and the task is waiting on disk too; a good answer then resumes it.
    assert len(node.calls("review run APP-T3")) == runs
    assert (await get(client, task.id)).status.state == WAITING
    fine = await send(client, message(text='{"decision": "decline"}', task=task))
    assert fine.status.state == TaskState.TASK_STATE_COMPLETED, status_texts(fine)
    assert artifact_data(await get(client, task.id))["decision"] == "decline"
    # A schema bound is checked on a text answer as on a data part.
    picked = await send(client, message(data={}, skill="pick"))
    over = await send(client, message(text='{"n": 9}', task=picked))
    assert over.status.state == WAITING
    assert "field 'n'" in status_texts(over)[0]
    ok = await send(client, message(text='{"n": 4}', task=picked))
    assert ok.status.state == TaskState.TASK_STATE_COMPLETED
    assert artifact_data(await get(client, picked.id)) == {"n": 4}


async def test_adk_wrapped_answers_are_taken_and_its_context_parts_are_not(
    node: Asker, http: httpx.AsyncClient
) -> None:
    client = await node.client(http)
    # ADK's inline_data blob (text/plain) wrapping an a2a-sdk 0.3 DataPart, as a raw part.
    task = await send(client, review("APP-T4"))
    body = {"kind": "data", "data": {"decision": "approve", "note": "via adk"}}
    wrapped = f"<a2a_datapart_json>{json.dumps(body)}</a2a_datapart_json>"
    raw = Part(raw=wrapped.encode(), media_type="text/plain")
    again = await send(client, parts_answer(task, [raw], **{EXT: {"answers": "q-0"}}))
    assert status_texts(again) == ["Who approves?"], status_texts(again)
    done = await send(client, message(text="Ada", task=task))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert artifact_data(await get(client, task.id))["note"] == "via adk"

    # ADK's turns since the agent last answered: the request is the last part flagged
    # is_user_input, and a "For context:" part is never the answer.
    picked = await send(client, message(data={}, skill="pick"))
    user = Part(text='{"n": 1}')
    user.metadata.update({"is_user_input": True})
    later = Part(text='{"n": 2}')
    later.metadata.update({"is_user_input": True})
    context = Part(text='For context: [other-agent] said: {"n": 5}')
    done = await send(client, parts_answer(picked, [user, context, later]))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, status_texts(done)
    assert artifact_data(await get(client, picked.id)) == {"n": 2}


async def test_a_json_text_answer_at_the_top_of_a_chain_is_checked_there_and_used_at_the_bottom(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """A relayed question (top -> middle -> bottom, tests.delegation_wait_agents) answered at
    the top with JSON text: checked against the bottom's schema at the top (an invalid one
    names the field and goes nowhere), then forwarded down as a data part."""
    with Chain(tmp_path).serve() as chain:
        top = await chain.top.client(http)
        task = await send(top, message(text="assess APP-551 600,000"))
        assert task.status.state == WAITING
        (q,) = ext_of(task.status.message.metadata)["questions"]
        assert q["schema"] is True
        named = {EXT: {"answers": q["id"]}}
        bad = await send(top, message(text='{"decision": "maybe"}', task=task, metadata=named))
        assert bad.status.state == WAITING
        assert status_texts(bad)[0].startswith(f"invalid answer to {q['id']}: field 'decision'")
        done = await send(
            top,
            message(text='{"decision": "approve", "note": "ok"}', task=task, metadata=named),
        )
        assert done.status.state == TaskState.TASK_STATE_COMPLETED, status_texts(done)
        assert "APP-551: approve (ok)" in done.artifacts[-1].parts[0].text
