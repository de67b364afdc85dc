"""ScriptedModel: rules, templates, stateless steps, structured output, usage, streaming;
resolve_model: which model an agent gets."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from mesh._agent import Agent
from mesh._errors import ConfigError
from mesh._models import resolve_model
from mesh._models.base import Model, ModelRequest, ModelResponse, ToolDeclaration
from mesh._models.scripted import Call, Rule, Script, ScriptedModel, example_from_schema
from mesh._tools import ToolContext, reset_current_context, set_current_context
from mesh._types import Content, FunctionResponse, Part

LOAN = Script(
    rules=[
        Rule(
            when=r"(?i)approve (?P<applicant_id>APP-\d+) for (?P<amount>[\d,]+)",
            steps=[
                [Call("lookup_applicant", {"applicant_id": "{applicant_id}"})],
                [
                    Call("score", {"applicant_id": "{applicant_id}", "amount": "{amount|number}"}),
                    Call(
                        "verify_income", {"applicant_id": "{applicant_id}", "note": "for {amount}"}
                    ),
                ],
            ],
            answer="Score {score.score} ({score.tier}); income verified: {verify_income.verified}; "
            "first loan: {lookup_applicant.loans.0.id}",
            on_error="I could not complete the assessment: {error}",
        ),
        Rule(when=r"(?i)^hello", answer="Hello {state.name}! {{not a placeholder}} {unknown.path}"),
    ],
    fallback="I can assess loans, e.g. 'approve APP-612 for 400,000'. You said: {input}",
)


def user(text: str) -> Content:
    return Content.user(text)


def calls_of(content: Content) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.args) for c in content.function_calls]


def answer(model_content: Content, results: dict[str, Any], *, error: str | None = None) -> Content:
    """The tool event answering ``model_content``'s calls with ``results`` by tool name."""
    parts = []
    for call in model_content.function_calls:
        response = (
            {"error": {"type": "RuntimeError", "message": error}}
            if error and call.name not in results
            else {"result": results[call.name]}
        )
        parts.append(
            Part(function_response=FunctionResponse(id=call.id, name=call.name, response=response))
        )
    return Content(role="user", parts=tuple(parts))


async def test_rule_steps_are_derived_from_the_request() -> None:
    model = ScriptedModel(LOAN)
    history: list[Content] = [user("Please approve APP-612 for 400,000 today")]

    step1 = (await model.generate(ModelRequest(contents=tuple(history)))).content
    assert calls_of(step1) == [("lookup_applicant", {"applicant_id": "APP-612"})]
    history += [step1, answer(step1, {"lookup_applicant": {"loans": [{"id": "L-1"}]}})]

    step2 = (await model.generate(ModelRequest(contents=tuple(history)))).content
    assert calls_of(step2) == [
        # |number turns "400,000" into a number; a whole-value template keeps the type.
        ("score", {"applicant_id": "APP-612", "amount": 400000}),
        ("verify_income", {"applicant_id": "APP-612", "note": "for 400,000"}),
    ]
    assert len({c.id for c in step2.function_calls} | {c.id for c in step1.function_calls}) == 3
    history += [
        step2,
        answer(step2, {"score": {"score": 712, "tier": "B"}, "verify_income": {"verified": True}}),
    ]

    final = await model.generate(ModelRequest(contents=tuple(history)))
    assert final.content.function_calls == []
    assert final.content.text == "Score 712 (B); income verified: true; first loan: L-1"

    # Stateless: the same request gives the same answer, from another instance too.
    again = await ScriptedModel(LOAN).generate(ModelRequest(contents=tuple(history)))
    assert again.content == final.content


async def test_a_new_user_message_starts_the_steps_again() -> None:
    model = ScriptedModel(LOAN)
    first = (await model.generate(ModelRequest(contents=(user("approve APP-1 for 10"),)))).content
    earlier = [
        user("approve APP-1 for 10"),
        first,
        answer(first, {"lookup_applicant": {}}),
        Content.model("an earlier answer"),
    ]
    step = (
        await model.generate(ModelRequest(contents=(*earlier, user("approve APP-2 for 20"))))
    ).content
    assert calls_of(step) == [("lookup_applicant", {"applicant_id": "APP-2"})]
    # Call ids stay unique across the session's rounds.
    assert step.function_calls[0].id != first.function_calls[0].id


async def test_on_error_names_the_tool_and_message() -> None:
    model = ScriptedModel(LOAN)
    history = [user("approve APP-9 for 5")]
    step1 = (await model.generate(ModelRequest(contents=tuple(history)))).content
    history += [step1, answer(step1, {}, error="bureau unreachable")]
    final = await model.generate(ModelRequest(contents=tuple(history)))
    assert final.content.text == (
        "I could not complete the assessment: lookup_applicant: bureau unreachable"
    )


async def test_state_escapes_unknown_placeholders_and_fallback() -> None:
    model = ScriptedModel(LOAN)
    token = set_current_context(ToolContext(session_state={"name": "Ann"}))
    try:
        hello = await model.generate(ModelRequest(contents=(user("hello there"),)))
    finally:
        reset_current_context(token)
    assert hello.content.text == "Hello Ann! {not a placeholder} {unknown.path}"
    other = await model.generate(ModelRequest(contents=(user("what's up?"),)))
    assert other.content.text.endswith("You said: what's up?")
    # Outside a turn there is no state: the placeholder stays visible.
    bare = await model.generate(ModelRequest(contents=(user("hello"),)))
    assert bare.content.text.startswith("Hello {state.name}!")


async def test_input_json_fields_and_filters() -> None:
    script = Script(
        rules=[
            Rule(
                when=r'"applicant_id"',
                steps=[
                    [
                        Call(
                            "score",
                            {
                                "id": "{input.applicant_id|upper}",
                                "amount": "{input.amount|int}",
                                "raw": "{input.amount}",
                                "all": "{input}",
                            },
                        )
                    ]
                ],
                answer="{score|json}",
            )
        ]
    )
    payload = json.dumps({"applicant_id": "app-3", "amount": "12,500.00"})
    step = (await ScriptedModel(script).generate(ModelRequest(contents=(user(payload),)))).content
    assert calls_of(step) == [
        ("score", {"id": "APP-3", "amount": 12500, "raw": "12,500.00", "all": payload})
    ]
    done = await ScriptedModel(script).generate(
        ModelRequest(contents=(user(payload), step, answer(step, {"score": {"a": [1, 2]}})))
    )
    assert json.loads(done.content.text) == {"a": [1, 2]}


class Verdict(BaseModel):
    decision: Literal["approve", "decline", "refer"]
    score: int = Field(ge=300)
    reasons: list[str] = Field(min_length=1)
    note: str | None = None
    applicant: Applicant


class Applicant(BaseModel):
    id: str = Field(min_length=3)
    verified: bool


Verdict.model_rebuild()


async def test_structured_output_from_answer_data_or_the_schema() -> None:
    schema = Verdict.model_json_schema()
    with_data = Script(
        rules=[
            Rule(
                when=r"(?P<id>APP-\d+)",
                answer_data={
                    "decision": "approve",
                    "score": "{state.score}",
                    "reasons": ["good score for {id}"],
                    "applicant": {"id": "{id}", "verified": "{state.verified}"},
                },
            )
        ]
    )
    token = set_current_context(ToolContext(session_state={"score": 712, "verified": True}))
    try:
        response = await ScriptedModel(with_data).generate(
            ModelRequest(contents=(user("APP-5"),), response_schema=schema)
        )
    finally:
        reset_current_context(token)
    verdict = Verdict.model_validate_json(response.content.text)
    assert verdict.score == 712
    assert verdict.reasons == ["good score for APP-5"]
    assert verdict.applicant.verified is True

    # No answer_data (or no rule): a minimal object that still validates.
    minimal = await ScriptedModel(Script()).generate(
        ModelRequest(contents=(user("anything"),), response_schema=schema)
    )
    Verdict.model_validate_json(minimal.content.text)
    assert example_from_schema({"type": "array", "items": {"type": "integer"}, "minItems": 2}) == [
        0,
        0,
    ]


async def test_usage_is_plausible() -> None:
    model = ScriptedModel(LOAN)
    short = await model.generate(ModelRequest(contents=(user("hi"),)))
    long_request = ModelRequest(
        system_instruction="You are a careful loan officer. " * 20,
        contents=(user("hi " * 50),),
        tools=(ToolDeclaration(name="score", description="Score an applicant for a loan."),),
    )
    long = await model.generate(long_request)
    assert short.usage is not None
    assert long.usage is not None
    assert 0 < short.usage.input_tokens < long.usage.input_tokens
    assert long.usage.input_tokens >= 50 + 5 * 20
    assert short.usage.output_tokens == len(short.content.text.split())
    assert short.usage.total_tokens == short.usage.input_tokens + short.usage.output_tokens


async def test_stream_yields_chunks_then_the_whole_response() -> None:
    model = ScriptedModel(LOAN)
    request = ModelRequest(contents=(user("tell me something long enough to split"),))
    chunks: list[ModelResponse] = [c async for c in model.stream(request)]
    *partial, final = chunks
    assert len(partial) >= 2
    assert all(c.partial for c in partial)
    assert not final.partial
    assert "".join(c.content.text for c in partial) == final.content.text
    assert final == await model.generate(request)
    # Function calls are not streamed: one complete response.
    calls = [c async for c in model.stream(ModelRequest(contents=(user("approve APP-1 for 2"),)))]
    assert len(calls) == 1
    assert calls[0].content.function_calls


def test_script_mistakes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="not a valid regex"):
        Rule(when="(unclosed")
    with pytest.raises(ConfigError, match="Call"):
        Rule(when="x", steps=[["score"]])  # type: ignore[list-item]
    # A single Call is accepted as a one-call step.
    assert Rule(when="x", steps=[Call("a"), [Call("b"), Call("c")]]).calls == (
        (Call("a"),),
        (Call("b"), Call("c")),
    )


# -- resolve_model -------------------------------------------------------------------------


def test_resolve_model_without_a_key_uses_the_script(caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(name="loan-officer", instruction="x", model="gemini-2.5-flash", script=LOAN)
    with caplog.at_level(logging.INFO, logger="mesh._models"):
        model = resolve_model(agent, {})
    assert isinstance(model, ScriptedModel)
    assert model.script is LOAN
    lines = [r.getMessage() for r in caplog.records if r.name == "mesh._models"]
    assert lines == [
        "loan-officer runs offline: no GOOGLE_API_KEY/GEMINI_API_KEY, so instead of "
        "gemini-2.5-flash it follows its offline script (2 rules); set GOOGLE_API_KEY for the "
        "real model"
    ]


def test_an_agent_without_a_script_says_it_echoes(caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(name="fx-desk", instruction="x", model="gemini-2.5-flash")
    with caplog.at_level(logging.INFO, logger="mesh._models"):
        resolve_model(agent, {})
    lines = [r.getMessage() for r in caplog.records if r.name == "mesh._models"]
    assert lines == [
        "fx-desk runs offline: no GOOGLE_API_KEY/GEMINI_API_KEY, so instead of gemini-2.5-flash "
        "it echoes each message back (it has no offline script: Agent(script=...)); set "
        "GOOGLE_API_KEY for the real model"
    ]


async def test_resolve_model_default_script_echoes() -> None:
    model = resolve_model(Agent(name="echo", instruction="x"), {"GOOGLE_API_KEY": ""})
    assert isinstance(model, ScriptedModel)
    response = await model.generate(ModelRequest(contents=(user("ping 42"),)))
    assert response.content.text == "ping 42"


def test_resolve_model_passes_models_through_and_picks_gemini_with_a_key() -> None:
    mine = ScriptedModel(LOAN, name="mine")
    assert resolve_model(Agent(name="a", model=mine), {"GOOGLE_API_KEY": "k"}) is mine
    gemini = resolve_model(Agent(name="a", model="gemini-2.5-flash"), {"GEMINI_API_KEY": "k"})
    assert type(gemini).__name__ == "GeminiModel"
    assert isinstance(gemini, Model)
    assert gemini.name == "gemini-2.5-flash"


async def test_two_calls_of_one_tool_in_a_step_get_distinct_ids() -> None:
    script = Script(rules=[Rule(when="x", steps=[[Call("a", {"n": 1}), Call("a", {"n": 2})]])])
    step = (await ScriptedModel(script).generate(ModelRequest(contents=(user("x"),)))).content
    assert calls_of(step) == [("a", {"n": 1}), ("a", {"n": 2})]
    assert len({c.id for c in step.function_calls}) == 2


# -- remembered values, find, requires, typed errors, bounded matching ---------------------

MEMO = Script(
    rules=[
        Rule(
            when=r"(?<![\w-])\d{4,}",
            find={"who": r"\bAPP-\d+\b", "amount": r"(?<![\w-])(\d{4,})"},
            remember=["who", "amount"],
            requires=["who", "amount"],
            answer="assess {who} for {amount|number}",
            on_error={"not_found": "{who} is not on file", "*": "down: {error}"},
            steps=[[Call("lookup", {"id": "{who}"})]],
        ),
        Rule(when=r"\bAPP-\d+\b", find={"who": r"\bAPP-\d+\b"}, remember=["who"], answer="{who}"),
    ],
    fallback="which applicant?",
)


async def _turn(model: ScriptedModel, state: dict[str, Any], *contents: Content) -> ModelResponse:
    """One model call inside a turn whose session state is ``state`` (updated like the runner
    does with the response's ``state_delta``)."""
    token = set_current_context(ToolContext(session_state=dict(state)))
    try:
        response = await model.generate(ModelRequest(contents=contents))
    finally:
        reset_current_context(token)
    state.update(response.state_delta)
    return response


async def test_remembered_values_carry_a_conversation() -> None:
    model = ScriptedModel(MEMO)
    state: dict[str, Any] = {}
    question = user("approve APP-612 for 400000")
    first = await _turn(model, state, question)
    assert calls_of(first.content) == [("lookup", {"id": "APP-612"})]
    assert first.state_delta == {"who": "APP-612", "amount": "400000"}
    done = await _turn(model, state, question, first.content, answer(first.content, {"lookup": 1}))
    assert done.content.text == "assess APP-612 for 400000"
    assert done.state_delta == {}  # nothing new to remember

    # A follow-up without the applicant: recalled from the session; the new amount is kept.
    follow = await _turn(model, state, user("what if it were 200000 instead?"))
    assert calls_of(follow.content) == [("lookup", {"id": "APP-612"})]
    assert follow.state_delta == {"amount": "200000"}
    assert state == {"who": "APP-612", "amount": "200000"}

    # The other rule remembers a new applicant; the amount stays.
    await _turn(model, state, user("tell me about APP-738"))
    again = await _turn(model, state, user("and for 600000?"))
    assert calls_of(again.content) == [("lookup", {"id": "APP-738"})]


async def test_requires_falls_through_to_the_next_rule() -> None:
    model = ScriptedModel(MEMO)
    # No applicant named and none remembered: the assessment rule does not apply.
    response = await _turn(model, {}, user("what about 200000?"))
    assert response.content.text == "which applicant?"
    assert response.state_delta == {}


async def test_on_error_by_type() -> None:
    model = ScriptedModel(MEMO)
    step = (await _turn(model, {}, user("APP-9 for 5000"))).content

    def failed(kind: str) -> Content:
        response = {"error": {"type": kind, "message": "no such applicant"}}
        part = Part(function_response=FunctionResponse(id="1", name="lookup", response=response))
        return Content(role="user", parts=(part,))

    missing = await _turn(model, {}, user("APP-9 for 5000"), step, failed("not_found"))
    assert missing.content.text == "APP-9 is not on file"
    other = await _turn(model, {}, user("APP-9 for 5000"), step, failed("remote_unavailable"))
    assert other.content.text == "down: lookup: no such applicant"


def test_rule_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="remember is a list of names"):
        Rule(when="x", remember="who")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"requires name 'a\.b'"):
        Rule(when="x", requires=["a.b"])
    with pytest.raises(ConfigError, match=r"find\['who'\]"):
        Rule(when="x", find={"who": "(unclosed"})
    with pytest.raises(ConfigError, match="max_match_chars"):
        Script(max_match_chars=0)


# Messages that make a pattern spanning the message (``APP-\d+.*?amount``) quadratic, or worse.
HOSTILE = [
    "APP-1 " * 8000,
    "1" * 48_000,
    "1 " * 24_000,
    "APP-612 " + "9 months " * 5000,
    "APP-612 for " + "," * 48_000,
    " " * 48_000 + "1",
]


@pytest.mark.parametrize("message", HOSTILE, ids=lambda m: repr(m[:12]))
async def test_a_48kb_message_costs_milliseconds(message: str) -> None:
    from agents.loan_officer import LOAN_SCRIPT

    model = ScriptedModel(LOAN_SCRIPT)
    contents: tuple[Content, ...] = (user(message),)
    started = time.perf_counter()
    response = await _turn(model, {}, *contents)
    while response.content.function_calls:  # bounded by the rule's steps
        results = {c.name: {} for c in response.content.function_calls}
        contents = (*contents, response.content, answer(response.content, results))
        response = await _turn(model, {}, *contents)
    elapsed = time.perf_counter() - started
    # Was 3.6 s per model call for "APP-1 " x 8000 (an assessment pattern spanning the message).
    assert elapsed < 0.25, f"{elapsed:.3f}s"


async def test_rules_see_a_bounded_prefix_and_templates_the_whole_message() -> None:
    script = Script(rules=[Rule(when=r"tail$", answer="matched")], max_match_chars=10)
    model = ScriptedModel(script)
    long = "x" * 20 + "tail"
    assert (await model.generate(ModelRequest(contents=(user(long),)))).content.text == long
    short = "tail"
    assert (await model.generate(ModelRequest(contents=(user(short),)))).content.text == "matched"


async def test_the_whole_state_renders_as_json_with_the_turns_pending_writes() -> None:
    """The model reads the turn's state through its read-only view (no copy per call);
    ``{state}`` still renders all of it, the writes pending in the turn on top."""
    model = ScriptedModel(Script(rules=[Rule(when="show", answer="state: {state|json}")]))
    ctx = ToolContext(session_state={"name": "Ann", "tier": "A"})
    ctx.state_delta["tier"] = "B"
    token = set_current_context(ctx)
    try:
        shown = await model.generate(ModelRequest(contents=(user("show"),)))
    finally:
        reset_current_context(token)
    assert json.loads(shown.content.text.removeprefix("state: ")) == {"name": "Ann", "tier": "B"}


async def test_usage_counts_a_declaration_again_once_it_changed() -> None:
    """Instruction and tool word counts are kept per object: the same request counts the
    same, another declaration (more words) counts its own."""
    model = ScriptedModel(LOAN)
    short = ToolDeclaration(name="score", description="Score.")
    longer = ToolDeclaration(name="score", description="Score an applicant for a loan amount.")

    async def tokens(tool: ToolDeclaration) -> int:
        request = ModelRequest(
            system_instruction="Be careful.", contents=(user("hi"),), tools=(tool,)
        )
        response = await model.generate(request)
        assert response.usage is not None
        return response.usage.input_tokens

    first = await tokens(short)
    assert await tokens(short) == first
    assert await tokens(longer) == first + 6
    assert await tokens(short) == first
