"""A tool of an LLM agent asks (``mesh.Ask``): the Runner in process, on the scripted model and a
real SQLite session store. The turn stops with ``TurnSuspended`` once the response's other
calls finished, and ``resume`` goes on with the answer as that call's response. The history a
model is sent never has a call without its response, the state the tools wrote is applied
once, ``max_model_calls`` counts across resumes, and a new turn waits for the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from mesh import Ask
from mesh._agent import Agent
from mesh._errors import (
    ConfigError,
    MaxModelCallsExceeded,
    RunError,
    SchemaViolation,
    SessionWaiting,
)
from mesh._models.scripted import Call, Rule, Script
from mesh._pending import WAITING_KEY, PendingTurn, TurnSuspended
from mesh._runner import Runner
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._sqlite import Database
from mesh._tools import ToolContext, tool
from mesh._types import Content
from tests.test_runner import RecordingModel


class Approval(BaseModel):
    decision: Literal["approve", "decline"]
    note: str = ""


@tool
def lookup(applicant_id: str, ctx: ToolContext) -> dict[str, Any]:
    """The applicant's profile; counts the lookups in session state."""
    ctx.state_delta["lookups"] = int(ctx.state.get("lookups", 0)) + 1
    return {"name": "Ann Lee", "income": 5200}


@tool
def approval(applicant_id: str, amount: float, ctx: ToolContext) -> Ask | dict[str, Any]:
    """Ask a human to approve amounts above 50,000."""
    ctx.state_delta["asked_about"] = applicant_id
    if amount > 50_000:
        return Ask(f"Approve {applicant_id} for {amount:,.0f}?", schema=Approval)
    return {"decision": "approve", "note": "small amount"}


@tool
def reviewer(applicant_id: str) -> Ask:
    """Ask who reviews (a text answer)."""
    return Ask(f"Who reviews {applicant_id}?")


ASK_RULE = Rule(
    when=r"(?i)pay (?P<applicant_id>APP-\d+) (?P<amount>[\d,]+)",
    steps=[
        [
            Call("lookup", {"applicant_id": "{applicant_id}"}),
            Call("approval", {"applicant_id": "{applicant_id}", "amount": "{amount|number}"}),
        ]
    ],
    answer="{lookup.name}: {approval.decision} ({approval.note})",
)
TWO_ASKS = Rule(
    when=r"(?i)both (?P<applicant_id>APP-\d+)",
    steps=[
        [
            Call("approval", {"applicant_id": "{applicant_id}", "amount": 90000}),
            Call("lookup", {"applicant_id": "{applicant_id}"}),
            Call("reviewer", {"applicant_id": "{applicant_id}"}),
        ]
    ],
    answer="{approval.decision} by {reviewer} for {lookup.name}",
)
ASK_THEN_LOOKUP = Rule(
    when=r"(?i)slow (?P<applicant_id>APP-\d+)",
    steps=[
        [Call("approval", {"applicant_id": "{applicant_id}", "amount": 90000})],
        [Call("lookup", {"applicant_id": "{applicant_id}"})],
    ],
    answer="{approval.decision}, {lookup.name}",
)
PLAIN = Rule(when=r"(?i)hello", answer="hello back")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    db = await Database.open(tmp_path / "node.db")
    try:
        yield SqliteSessionStore(db)
    finally:
        await db.aclose()


def runner_for(
    store: SqliteSessionStore, *, max_model_calls: int = 10
) -> tuple[Runner, RecordingModel]:
    script = Script(rules=[ASK_RULE, TWO_ASKS, ASK_THEN_LOOKUP, PLAIN], fallback="?")
    model = RecordingModel(script)
    agent = Agent(
        name="officer",
        instruction="You pay out loans.",
        tools=[lookup, approval, reviewer],
        max_model_calls=max_model_calls,
    )
    return Runner(agent, sessions=store, model=model), model


def assert_well_formed(contents: Sequence[Content]) -> None:
    """Every content with calls is followed by one answering exactly those calls."""
    for i, content in enumerate(contents):
        calls = content.function_calls
        if not calls:
            continue
        assert i + 1 < len(contents), f"calls {calls} without responses"
        responses = contents[i + 1].function_responses
        assert [r.id for r in responses] == [c.id for c in calls]


async def suspend(runner: Runner, message: str, session: str = "s1") -> TurnSuspended:
    with pytest.raises(TurnSuspended) as waiting:
        await runner.run(
            user_id="u1", session_id=session, message=message, metadata={"task_id": "T-1"}
        )
    return waiting.value


async def test_a_tool_that_asks_stops_the_turn_and_the_answer_is_its_response(
    store: SqliteSessionStore,
) -> None:
    runner, model = runner_for(store)
    waiting = await suspend(runner, "Pay APP-9 80,000")
    [question] = waiting.questions
    assert question.text == "Approve APP-9 for 80,000?"
    assert question.schema is not None
    assert question.schema["required"] == ["decision"]
    assert waiting.turn.task_id == "T-1"

    # The other call finished, but nothing answers the calls in the session yet: no tool event,
    # no state written; the session is marked waiting by a content-less event.
    session = await store.get("u1", "s1")
    assert session is not None
    assert [e.author for e in session.events] == ["user", "officer", "mesh"]
    assert session.events[-1].content is None
    assert session.state == {WAITING_KEY: "T-1"}
    finished = [c for c in waiting.turn.calls if c.response is not None]
    assert [(c.name, c.response) for c in finished] == [
        ("lookup", {"result": {"name": "Ann Lee", "income": 5200}})
    ]

    # The answer goes through JSON, as a node keeps it; and a fresh runner on the same file.
    again, model = runner_for(store)
    turn = PendingTurn.from_json(waiting.turn.to_json())
    result = await again.resume(
        user_id="u1",
        session_id="s1",
        turn=turn,
        answers={question.id: {"decision": "approve", "note": "checked"}},
    )
    assert result.text == "Ann Lee: approve (checked)"
    tool_event = result.events[0]
    assert [(r.name, r.response) for r in tool_event.function_responses] == [
        ("lookup", {"result": {"name": "Ann Lee", "income": 5200}}),
        ("approval", {"result": {"decision": "approve", "note": "checked"}}),
    ]
    # Both calls' state, applied once, with the mark cleared in the same event.
    assert tool_event.state_delta == {"lookups": 1, "asked_about": "APP-9", WAITING_KEY: None}
    stored = await store.get("u1", "s1")
    assert stored is not None
    assert stored.state == {"lookups": 1, "asked_about": "APP-9", WAITING_KEY: None}
    assert [e.author for e in stored.events] == ["user", "officer", "mesh", "tool", "officer"]
    for request in model.requests:
        assert_well_formed(request.contents)

    # Resuming again (a node that stopped after the answer was stored) changes nothing.
    calls_before = len(model.requests)
    repeat = await again.resume(
        user_id="u1", session_id="s1", turn=turn, answers={question.id: {"decision": "decline"}}
    )
    assert repeat.text == "Ann Lee: approve (checked)"
    assert len(model.requests) == calls_before
    assert len((await store.get("u1", "s1")).events) == 5  # type: ignore[union-attr]


async def test_an_answer_is_checked_against_the_schema_and_a_bad_one_stores_nothing(
    store: SqliteSessionStore,
) -> None:
    runner, _ = runner_for(store)
    waiting = await suspend(runner, "Pay APP-9 80,000")
    qid = waiting.questions[0].id
    with pytest.raises(SchemaViolation) as bad:
        await runner.resume(
            user_id="u1", session_id="s1", turn=waiting.turn, answers={qid: {"decision": "maybe"}}
        )
    assert bad.value.errors[0]["field"] == "decision"
    session = await store.get("u1", "s1")
    assert session is not None
    assert len(session.events) == 3
    assert session.state[WAITING_KEY] == "T-1"
    # Not every tool may ask with anything: Ask refuses a schema that is not a model.
    with pytest.raises(ConfigError, match="pydantic BaseModel"):
        Ask("Sure?", schema=dict)  # type: ignore[arg-type]


async def test_two_calls_that_ask_wait_for_both_answers_and_respond_in_call_order(
    store: SqliteSessionStore,
) -> None:
    runner, model = runner_for(store)
    waiting = await suspend(runner, "both APP-3")
    first, second = waiting.questions
    assert (first.text, second.text) == ("Approve APP-3 for 90,000?", "Who reviews APP-3?")
    assert first.id != second.id

    # One answer: still waiting, on the other question only, and nothing stored.
    with pytest.raises(TurnSuspended) as still:
        await runner.resume(
            user_id="u1",
            session_id="s1",
            turn=waiting.turn,
            answers={first.id: {"decision": "decline"}},
        )
    assert still.value.questions == [second]
    session = await store.get("u1", "s1")
    assert session is not None
    assert [e.author for e in session.events] == ["user", "officer", "mesh"]

    with pytest.raises(SchemaViolation, match="text answer"):
        await runner.resume(
            user_id="u1", session_id="s1", turn=still.value.turn, answers={second.id: {"x": 1}}
        )
    result = await runner.resume(
        user_id="u1", session_id="s1", turn=still.value.turn, answers={second.id: "Bo"}
    )
    assert result.text == "decline by Bo for Ann Lee"
    assert [r.name for r in result.events[0].function_responses] == [
        "approval",
        "lookup",
        "reviewer",
    ]
    assert (await store.get("u1", "s1")).state["lookups"] == 1  # type: ignore[union-attr]
    for request in model.requests:
        assert_well_formed(request.contents)


async def test_max_model_calls_counts_the_calls_before_a_resume(
    store: SqliteSessionStore,
) -> None:
    # Call 1 asks; after the answer, call 2 looks up and call 3 would answer: 2 is too few.
    runner, _ = runner_for(store, max_model_calls=2)
    waiting = await suspend(runner, "slow APP-4")
    qid = waiting.questions[0].id
    with pytest.raises(MaxModelCallsExceeded, match="max_model_calls=2"):
        await runner.resume(
            user_id="u1", session_id="s1", turn=waiting.turn, answers={qid: {"decision": "approve"}}
        )

    runner, _ = runner_for(store, max_model_calls=3)
    waiting = await suspend(runner, "slow APP-5", session="s2")
    result = await runner.resume(
        user_id="u1",
        session_id="s2",
        turn=waiting.turn,
        answers={waiting.questions[0].id: {"decision": "approve"}},
    )
    assert result.text == "approve, Ann Lee"

    # A tool that asks at the last call allowed is not asked in vain: its call gets an error,
    # the turn ends MaxModelCallsExceeded, and the history stays answered.
    runner, _ = runner_for(store, max_model_calls=1)
    with pytest.raises(MaxModelCallsExceeded):
        await runner.run(user_id="u1", session_id="s3", message="Pay APP-6 80,000")
    session = await store.get("u1", "s3")
    assert session is not None
    assert WAITING_KEY not in session.state
    last = session.events[-1].function_responses
    assert last[1].response["error"]["type"] == "not_asked"


async def test_a_new_turn_is_refused_while_the_session_waits_and_not_after_a_cancel(
    store: SqliteSessionStore,
) -> None:
    runner, model = runner_for(store)
    await suspend(runner, "Pay APP-9 80,000")
    with pytest.raises(SessionWaiting) as refused:
        await runner.run(user_id="u1", session_id="s1", message="hello")
    assert str(refused.value) == (
        "context s1 has task T-1 waiting for input; answer it (a message with taskId T-1) or "
        "cancel it"
    )
    assert refused.value.task_id == "T-1"
    session = await store.get("u1", "s1")
    assert session is not None
    assert len(session.events) == 3  # nothing stored

    # Whoever keeps tasks says whether T-1 still waits: canceled, the context takes turns
    # again, the mark is cleared, and the model never sees the call left unanswered.
    async def still_waiting(task_id: str) -> bool:
        assert task_id == "T-1"
        return False

    result = await runner.run(user_id="u1", session_id="s1", message="hello", waiting=still_waiting)
    assert result.text == "hello back"
    session = await store.get("u1", "s1")
    assert session is not None
    assert session.state[WAITING_KEY] is None
    assert_well_formed(model.requests[-1].contents)
    assert [c.role for c in model.requests[-1].contents] == ["user", "user"]
    with pytest.raises(RunError, match="no turn of task T-1 waiting"):
        await runner.resume(
            user_id="u1",
            session_id="s1",
            turn=PendingTurn("T-1", "nope", ()),
            answers={},
        )


async def test_streaming_turns_ask_and_resume_the_same_way(store: SqliteSessionStore) -> None:
    runner, _ = runner_for(store)
    seen: list[str] = []

    async def play() -> None:
        async for event in runner.run_stream(
            user_id="u1", session_id="s9", message="Pay APP-1 60,000"
        ):
            seen.append(event.author)

    with pytest.raises(TurnSuspended) as waiting:
        await play()
    assert seen == ["officer"]
    events = [
        e
        async for e in runner.resume_stream(
            user_id="u1",
            session_id="s9",
            turn=waiting.value.turn,
            answers={waiting.value.questions[0].id: {"decision": "approve", "note": "ok"}},
        )
    ]
    assert [e.author for e in events if not e.partial] == ["tool", "officer"]
    assert events[-1].final
    assert events[-1].text == "Ann Lee: approve (ok)"
