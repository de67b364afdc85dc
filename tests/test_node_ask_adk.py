"""Google ADK answering a waiting mesh task: an ADK ``RemoteA2aAgent`` (run directly in ADK's
``InMemoryRunner``, one session, one user turn after the other) starts a typed skill that asks,
and answers its questions as the user types them. ADK continues a task whose last answer was
INPUT_REQUIRED by itself: its next message names that ``taskId`` (and ``contextId``), text only,
each part flagged ``is_user_input``. The mesh node is a real ``mesh serve`` process of
tests.ask_adk_agents; no model is involved (the RemoteA2aAgent is the whole ADK agent)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
from google.adk.events import Event
from google.adk.runners import InMemoryRunner
from google.genai import types

from tests.test_node_ask import Asker

pytestmark = pytest.mark.integration

RUN_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def approver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asker]:
    asker = Asker(tmp_path_factory.mktemp("ask-adk"), "approver", "tests.ask_adk_agents:approver")
    with asker.serve():
        yield asker


class Session:
    """One ADK session talking to the node through a RemoteA2aAgent, turn after turn."""

    def __init__(self, remote: RemoteA2aAgent) -> None:
        self.remote = remote
        self.runner = InMemoryRunner(agent=remote, app_name="ask")
        self.session_id = ""

    async def turn(self, text: str) -> list[Event]:
        if not self.session_id:
            session = await self.runner.session_service.create_session(app_name="ask", user_id="u1")
            self.session_id = session.id
        message = types.Content(role="user", parts=[types.Part(text=text)])

        async def collect() -> list[Event]:
            return [
                event
                async for event in self.runner.run_async(
                    user_id="u1", session_id=self.session_id, new_message=message
                )
            ]

        return await asyncio.wait_for(collect(), RUN_TIMEOUT_S)

    async def close(self) -> None:
        await self.runner.close()
        await self.remote.cleanup()  # the runner leaves the agent's HTTP client open


@pytest.fixture
async def adk(approver: Asker) -> AsyncIterator[Session]:
    card = f"{approver.url}/.well-known/agent-card.json"
    session = Session(RemoteA2aAgent(name="approver", agent_card=card))
    try:
        yield session
    finally:
        await session.close()


def texts(events: list[Event]) -> list[str]:
    """What the remote agent said, as ADK shows it (its WORKING messages are thoughts)."""
    return [
        part.text
        for event in events
        if event.author == "approver" and not event.partial and event.content
        for part in event.content.parts or ()
        if part.text and not part.thought
    ]


def questions(events: list[Event]) -> list[str]:
    """The questions of an INPUT_REQUIRED answer as ADK shows them: its status message's last
    text becomes a call of ADK's ``mock_function_call_for_required_user_input`` (args
    ``{"input_required": <text>}``), what an ADK parent agent's model would see."""
    return [
        str((part.function_call.args or {}).get("input_required"))
        for event in events
        if event.author == "approver" and event.content
        for part in event.content.parts or ()
        if part.function_call and (part.function_call.name or "").endswith("required_user_input")
    ]


def errors(events: list[Event]) -> list[str]:
    return [event.error_message for event in events if event.error_message]


def task_ids(events: list[Event]) -> set[str]:
    return {
        str(event.custom_metadata["a2a:task_id"])
        for event in events
        if event.custom_metadata and "a2a:task_id" in event.custom_metadata
    }


async def test_adk_answers_a_structured_and_a_text_question_of_one_waiting_task(
    adk: Session, approver: Asker
) -> None:
    asked = await adk.turn(json.dumps({"applicant_id": "APP-ADK1", "amount": 600000}))
    assert not errors(asked), errors(asked)
    assert questions(asked) == ["Approve APP-ADK1 for 600,000?"], asked
    (task,) = task_ids(asked)

    # A wrong answer: the task still waits, saying which field; ADK shows it as text.
    wrong = await adk.turn('{"decision": "maybe"}')
    assert not errors(wrong), errors(wrong)
    said = texts(wrong)
    assert any(t.startswith("invalid answer to q-0: field 'decision': ") for t in said), said
    assert questions(wrong) == ["Approve APP-ADK1 for 600,000?"], wrong
    assert task_ids(wrong) == {task}

    # ADK sends the next turn to the same waiting task: the structured answer as JSON text.
    who = await adk.turn('{"decision": "approve", "note": "via adk"}')
    assert not errors(who), errors(who)
    assert questions(who) == ["Who approves?"], who
    assert task_ids(who) == {task}

    done = await adk.turn("Ada")
    assert not errors(done), errors(done)
    assert task_ids(done) == {task}
    answers = [json.loads(t) for t in texts(done) if t.startswith("{")]
    assert {
        "applicant_id": "APP-ADK1",
        "decision": "approve",
        "note": "via adk",
        "reviewer": "Ada",
    } in answers, texts(done)
    assert approver.calls("review decided APP-ADK1") == ["review decided APP-ADK1 approve"]
