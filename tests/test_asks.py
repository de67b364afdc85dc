"""The vocabulary of tasks that wait (mesh._asks), the question status message through
protobuf (mesh._a2a.questions), and ``SkillContext.ask``'s replay, in process."""

from __future__ import annotations

from typing import Literal

import pytest
from a2a.types import Task, TaskState
from google.protobuf.json_format import MessageToDict, ParseDict
from pydantic import BaseModel, Field

from mesh import ConfigError, Question, ReplayDiverged, SkillContext, skill
from mesh._a2a.questions import question_message, questions_of, waiting_state
from mesh._a2a.results import TaskResult, as_json
from mesh._asks import ChildRef, Recorded, Suspend, answer_of, relay_id, relayed, schema_hash
from mesh._errors import SchemaViolation
from mesh._pending import PendingCall, PendingTurn
from mesh._schema_order import with_property_order


class Approval(BaseModel):
    decision: Literal["approve", "decline"]
    note: str = ""
    score: int = Field(default=0, ge=0, le=900)


SCHEMA = with_property_order(Approval.model_json_schema())


def _through_the_wire(task: Task) -> Task:
    """What a client parses back: the task as JSON, and JSON again."""
    again = Task()
    ParseDict(MessageToDict(task), again)
    return again


def test_questions_survive_the_status_message_and_a_struct_round_trip() -> None:
    asked = [
        Question(id="q-0", text="Approve APP-738 for 600,000?", schema=SCHEMA),
        Question(
            id="q-7c1e",
            text="Who signs?",
            kind="auth",
            asker={"agent": "underwriter", "task": "T-u"},
            path=({"agent": "credit-desk", "task": "T-m", "question": "q-51a0"},),
        ),
    ]
    task = Task(id="T", context_id="C")
    task.status.state = waiting_state(asked)
    task.status.message.CopyFrom(question_message("T", "C", asked))
    back = questions_of(_through_the_wire(task))
    assert back == asked
    # Integers (a Struct's doubles) and the property order come back as declared.
    score = back[0].schema["properties"]["score"]  # type: ignore[index]
    assert score["maximum"] == 900
    assert isinstance(score["maximum"], int)
    assert back[0].schema_hash == schema_hash(SCHEMA)
    assert task.status.state == TaskState.TASK_STATE_AUTH_REQUIRED  # auth wins


def test_an_invalid_answer_puts_its_reason_first_and_in_the_entry() -> None:
    bad = Question(
        id="q-0",
        text="Approve?",
        schema=SCHEMA,
        invalid=({"field": "decision", "message": "Input should be 'approve' or 'decline'"},),
    )
    message = question_message("T", "C", [bad])
    texts = [p.text for p in message.parts if p.HasField("text")]
    assert texts == [
        "invalid answer to q-0: field 'decision': Input should be 'approve' or 'decline'",
        "Approve?",
    ]
    entry = MessageToDict(message.metadata)["urn:mesh:tasks:v1"]["questions"][0]
    assert entry["invalid"] == [
        {"field": "decision", "message": "Input should be 'approve' or 'decline'"}
    ]


def test_a_task_without_mesh_questions_has_none() -> None:
    task = Task(id="T", context_id="C")
    assert questions_of(task) == []
    task.status.message.metadata.update({"urn:mesh:tasks:v1": {"questions": [{"text": 1}]}})
    assert questions_of(task) == []  # malformed: not waiting on mesh's terms


def test_an_answer_is_the_one_data_part_or_the_text() -> None:
    structured = Question(id="q-0", text="?", schema=SCHEMA)
    assert answer_of(structured, [{"decision": "approve"}], []) == {"decision": "approve"}
    with pytest.raises(SchemaViolation, match="exactly one data part"):
        answer_of(structured, [], ["approve"])
    free = Question(id="q-1", text="?")
    assert answer_of(free, [], ["  Ada "]) == "Ada"
    with pytest.raises(SchemaViolation, match="takes a text answer"):
        answer_of(free, [{"x": 1}], [])


class Req(BaseModel):
    key: str


class Out(BaseModel):
    said: str


@skill(asks=True)
async def asking(req: Req, ctx: SkillContext) -> Out:
    ok = await ctx.ask("Approve?", schema=Approval)
    name = await ctx.ask("Who?")
    return Out(said=f"{ok.decision} by {name}")


def _ctx(*replay: Recorded) -> SkillContext:
    return SkillContext(skill_id="asking", may_ask=True, replay=list(replay))


def _step(seq: int, text: str, answer: object, schema: dict[str, object] | None = None) -> Recorded:
    return Recorded(seq, f"q-{seq}", text, schema_hash(schema), "input", answer)


async def test_ask_suspends_at_the_first_unanswered_step_and_replays_the_answers() -> None:
    with pytest.raises(Suspend) as first:
        await asking(Req(key="k"), _ctx())
    assert (first.value.seq, first.value.question.id) == (0, "q-0")
    assert first.value.question.schema == SCHEMA
    approved = _step(0, "Approve?", {"decision": "approve"}, SCHEMA)
    with pytest.raises(Suspend) as second:
        await asking(Req(key="k"), _ctx(approved))
    assert (second.value.seq, second.value.question.schema) == (1, None)
    done = await asking(Req(key="k"), _ctx(approved, _step(1, "Who?", "Ada")))
    assert done == Out(said="approve by Ada")


async def test_suspend_is_not_swallowed_by_except_exception() -> None:
    @skill(asks=True)
    async def careless(req: Req, ctx: SkillContext) -> Out:
        try:
            await ctx.ask("Anything?")
        except Exception:  # what skill code often does
            return Out(said="swallowed")
        return Out(said="answered")

    with pytest.raises(Suspend):
        await careless(Req(key="k"), SkillContext(skill_id="careless", may_ask=True))


async def test_a_replay_that_asks_something_else_fails() -> None:
    with pytest.raises(
        ReplayDiverged, match=r"asked 'Approve\?' at step 0 where it asked 'Sure\?'"
    ):
        await asking(Req(key="k"), _ctx(_step(0, "Sure?", {"decision": "approve"}, SCHEMA)))
    # Same text, another schema: also another question.
    with pytest.raises(ReplayDiverged):
        await asking(Req(key="k"), _ctx(_step(0, "Approve?", "yes")))


async def test_a_recorded_answer_the_model_refuses_asks_again_saying_why() -> None:
    with pytest.raises(Suspend) as again:
        await asking(Req(key="k"), _ctx(_step(0, "Approve?", {"decision": "maybe"}, SCHEMA)))
    assert again.value.question.invalid[0]["field"] == "decision"


async def test_only_a_skill_declared_to_ask_may_ask() -> None:
    with pytest.raises(ConfigError, match=r"use @skill\(asks=True\)"):
        await asking(Req(key="k"), SkillContext(skill_id="asking"))
    with pytest.raises(ConfigError, match="must be a function taking"):

        @skill(asks=True)
        def no_context(req: Req) -> Out:
            return Out(said="")


def test_a_relayed_question_keeps_text_schema_and_kind_and_names_asker_and_path() -> None:
    """Two hops up: the middle relays the bottom's question, the top relays the middle's."""
    schema = with_property_order(Approval.model_json_schema())
    asked = Question(id="q-0", text="Approve APP-1?", kind="auth", schema=schema)
    bottom = ChildRef("bottom", "review", "http://b", "T-b", "C-b", "m-1")
    (at_middle,) = relayed(bottom, [asked])
    middle = ChildRef("middle", "assess", "http://m", "T-m", "C-m", "m-2")
    (at_top,) = relayed(middle, [at_middle])
    assert at_top.id == relay_id("T-m", at_middle.id) == relay_id("T-m", relay_id("T-b", "q-0"))
    assert (at_top.text, at_top.kind, at_top.schema) == ("Approve APP-1?", "auth", schema)
    assert at_top.asker == {"agent": "bottom", "task": "T-b"}
    assert at_top.path == (
        {"agent": "middle", "task": "T-m", "question": at_middle.id},
        {"agent": "bottom", "task": "T-b", "question": "q-0"},
    )
    # What the top's status message says is what a caller of the top reads back.
    message = question_message("T-t", "C-t", [at_top])
    task = Task(id="T-t", context_id="C-t")
    task.status.state = TaskState.TASK_STATE_AUTH_REQUIRED
    task.status.message.CopyFrom(message)
    (read,) = TaskResult.from_json(as_json(task)).questions
    assert read == at_top


def test_a_turn_waiting_on_a_child_survives_its_json() -> None:
    child = ChildRef("bottom", "review", "http://b", "T-b", "C-b", "m-1")
    questions = relayed(child, [Question(id="q-0", text="Code?")])
    turn = PendingTurn(
        "T", "inv", (PendingCall("c1", "bottom_review", child=child, relayed=questions),)
    )
    back = PendingTurn.from_json(turn.to_json())
    assert back == turn
    assert back.children == [child]
    assert back.questions == list(questions)
