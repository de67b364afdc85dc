"""The Runner loop: tools, concurrency, errors, limits, state, streaming usage, sessions."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mesh._agent import Agent
from mesh._errors import ConfigError, MaxModelCallsExceeded, ModelError
from mesh._models.base import Model, ModelRequest, ModelResponse
from mesh._models.scripted import Call, Rule, Script, ScriptedModel
from mesh._runner import Runner, SessionLocks
from mesh._sessions.memory import InMemorySessionStore
from mesh._sessions.sqlite import SqliteSessionStore
from mesh._skills import skill
from mesh._sqlite import Database
from mesh._tools import FunctionTool, Tool, ToolContext, tool
from mesh._types import Content, Part, Usage
from tests.support import eventually


class Number(BaseModel):
    x: int


class Recorder:
    """A RunObserver that remembers what it saw."""

    def __init__(self) -> None:
        self.model_calls: list[tuple[str, float, Usage | None, bool]] = []
        self.tool_calls: list[tuple[str, bool]] = []
        self.sessions_created = 0

    def on_model_call(self, model_name: str, seconds: float, usage: Usage | None, ok: bool) -> None:
        self.model_calls.append((model_name, seconds, usage, ok))

    def on_tool_call(self, tool_name: str, ok: bool) -> None:
        self.tool_calls.append((tool_name, ok))

    def on_session_created(self) -> None:
        self.sessions_created += 1


class RecordingModel(ScriptedModel):
    """The scripted model, keeping every request it was sent."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.requests: list[ModelRequest] = []

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return await super().generate(request)


def make_agent(tools: Sequence[Any], *rules: Rule, max_model_calls: int = 10) -> Agent:
    return Agent(
        name="loan-officer",
        instruction="You are a careful loan officer.",
        tools=list(tools),
        script=Script(rules=rules, fallback="fallback: {input}"),
        max_model_calls=max_model_calls,
    )


def runner_for(agent: Agent, **kwargs: Any) -> Runner:
    # env={}: no key, so the agent runs on its script whatever the machine's environment.
    return Runner(agent, env={}, **kwargs)


@tool
async def lookup_applicant(applicant_id: str) -> dict[str, Any]:
    """Return the applicant's profile."""
    return {"id": applicant_id, "name": "Ann Lee", "monthly_income": 5200}


@tool
def score(applicant_id: str, amount: float) -> dict[str, Any]:
    """Score an applicant for an amount."""
    return {"score": 712 if amount < 500_000 else 540, "tier": "B"}


LOAN_RULE = Rule(
    when=r"(?i)approve (?P<applicant_id>APP-\d+) for (?P<amount>[\d,]+)",
    steps=[
        [Call("lookup_applicant", {"applicant_id": "{applicant_id}"})],
        [Call("score", {"applicant_id": "{applicant_id}", "amount": "{amount|number}"})],
    ],
    answer="{lookup_applicant.name}: score {score.score} ({score.tier})",
)


async def test_tool_loop_events_and_persistence(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "node.db")
    try:
        store = SqliteSessionStore(db)
        observer = Recorder()
        runner = runner_for(
            make_agent([lookup_applicant, score], LOAN_RULE), sessions=store, observer=observer
        )
        result = await runner.run(
            user_id="u1", session_id="s1", message="Please approve APP-612 for 400,000"
        )
        assert result.text == "Ann Lee: score 712 (B)"
        assert result.session_id == "s1"
        assert [e.author for e in result.events] == [
            "loan-officer",
            "tool",
            "loan-officer",
            "tool",
            "loan-officer",
        ]
        assert [e.final for e in result.events] == [False, False, False, False, True]
        calls = result.events[2].function_calls
        assert [(c.name, c.args) for c in calls] == [
            ("score", {"applicant_id": "APP-612", "amount": 400000})
        ]
        responses = result.events[3].function_responses
        assert responses[0].id == calls[0].id
        assert responses[0].response == {"result": {"score": 712, "tier": "B"}}
        # Usage: one per model event, summed over the turn; tool events carry none.
        model_usages = [e.usage for e in result.events if e.author == "loan-officer"]
        assert all(u is not None and u.input_tokens > 0 for u in model_usages)
        assert result.usage.output_tokens == sum(u.output_tokens for u in model_usages if u)
        assert all(e.usage is None for e in result.events if e.author == "tool")
        assert observer.sessions_created == 1
        assert observer.tool_calls == [("lookup_applicant", True), ("score", True)]
        assert [ok for *_, ok in observer.model_calls] == [True, True, True]

        stored = await store.get("u1", "s1")
        assert stored is not None
        assert [e.author for e in stored.events] == ["user", *[e.author for e in result.events]]
        assert stored.events[1:] == result.events
    finally:
        await db.aclose()


async def test_history_instruction_and_tools_reach_the_model() -> None:
    agent = make_agent([lookup_applicant, score], LOAN_RULE)
    model = RecordingModel(agent.script or Script())
    runner = Runner(agent, model=model)
    await runner.run(user_id="u", session_id="s", message="hello")
    await runner.run(user_id="u", session_id="s", message="again")
    last = model.requests[-1]
    assert last.system_instruction == "You are a careful loan officer."
    assert [d.name for d in last.tools] == ["lookup_applicant", "score"]
    assert last.tools[1].parameters["required"] == ["applicant_id", "amount"]
    assert [(c.role, c.text) for c in last.contents] == [
        ("user", "hello"),
        ("model", "fallback: hello"),
        ("user", "again"),
    ]


async def test_calls_of_one_response_run_concurrently() -> None:
    barrier = asyncio.Barrier(2)
    timeline: list[str] = []

    async def meet(who: str) -> str:
        timeline.append(f"start {who}")
        # Passes only if the other call is running at the same time.
        async with asyncio.timeout(5):
            await barrier.wait()
        timeline.append(f"end {who}")
        return who

    @tool
    async def bureau() -> str:
        """Ask the bureau."""
        return await meet("bureau")

    @tool
    async def payroll() -> str:
        """Ask payroll."""
        return await meet("payroll")

    rule = Rule(
        when="check",
        steps=[[Call("bureau"), Call("payroll")]],
        answer="{bureau} and {payroll}",
        on_error="failed: {error}",
    )
    result = await runner_for(make_agent([bureau, payroll], rule)).run(
        user_id="u", session_id="s", message="check both"
    )
    assert result.text == "bureau and payroll"
    assert timeline[:2] == ["start bureau", "start payroll"]
    # Responses keep the call order regardless of which finished first.
    assert [r.name for r in result.events[1].function_responses] == ["bureau", "payroll"]


async def test_a_failing_tool_returns_an_error_and_the_run_goes_on() -> None:
    @tool
    async def flaky(applicant_id: str) -> dict[str, Any]:
        """Flaky."""
        raise ConnectionError(f"bureau down for {applicant_id}")

    @tool
    async def fallback_check() -> dict[str, Any]:
        """Fallback."""
        return {"ok": True}

    rule = Rule(
        when=r"(?P<id>APP-\d+)",
        steps=[
            [Call("flaky", {"applicant_id": "{id}"}), Call("score", {"amount": "lots"})],
            [Call("fallback_check")],
        ],
        answer="{flaky.error.type}: {flaky.error.message}; fallback ok={fallback_check.ok}",
        on_error=None,
    )
    observer = Recorder()
    result = await runner_for(
        make_agent([flaky, fallback_check, score], rule), observer=observer
    ).run(user_id="u", session_id="s", message="APP-1")
    assert result.text == "ConnectionError: bureau down for APP-1; fallback ok=true"
    errors = {r.name: r.response for r in result.events[1].function_responses}
    assert errors["flaky"] == {
        "error": {"type": "ConnectionError", "message": "bureau down for APP-1"}
    }
    assert errors["score"]["error"]["type"] == "invalid_arguments"
    assert {d["field"] for d in errors["score"]["error"]["details"]} == {"applicant_id", "amount"}
    assert observer.tool_calls == [("flaky", False), ("score", False), ("fallback_check", True)]


async def test_on_error_answers_with_the_tool_and_message() -> None:
    rule = Rule(
        when="go",
        steps=[[Call("nope", {"x": 1})], [Call("score", {"applicant_id": "A", "amount": 1})]],
        answer="done",
        on_error="Could not finish: {error}",
    )
    result = await runner_for(make_agent([score], rule)).run(
        user_id="u", session_id="s", message="go"
    )
    assert result.text.startswith("Could not finish: nope: there is no tool named 'nope'")
    assert "score" in result.text  # the error lists the available tools
    assert len(result.events) == 3  # stopped after the first error


async def test_max_model_calls_is_enforced_with_a_clear_error() -> None:
    rule = Rule(
        when="loop",
        steps=[[Call("lookup_applicant", {"applicant_id": f"APP-{i}"})] for i in range(5)],
        answer="never",
    )
    store = InMemorySessionStore()
    runner = runner_for(make_agent([lookup_applicant], rule, max_model_calls=2), sessions=store)
    with pytest.raises(MaxModelCallsExceeded, match=r"max_model_calls=2") as info:
        await runner.run(user_id="u", session_id="s", message="loop")
    assert "lookup_applicant" in str(info.value)
    stored = await store.get("u", "s")
    assert stored is not None
    # Two model calls, each followed by its tool results: the history stays well-formed.
    assert [e.author for e in stored.events] == [
        "user",
        "loan-officer",
        "tool",
        "loan-officer",
        "tool",
    ]


async def test_state_delta_is_persisted_with_the_tool_event_and_read_later() -> None:
    @tool
    async def remember(applicant_id: str, ctx: ToolContext) -> str:
        """Remember."""
        assert ctx.state.get("seen") is None
        ctx.state_delta["last_applicant"] = applicant_id
        ctx.state_delta["seen"] = None
        assert ctx.state["last_applicant"] == applicant_id
        return "noted"

    @tool
    async def refuse(ctx: ToolContext) -> str:
        """Writes, then fails: its writes are dropped."""
        ctx.state_delta["refused"] = True
        raise RuntimeError("no")

    rules = (
        Rule(
            when=r"note (?P<id>\S+)",
            steps=[[Call("remember", {"applicant_id": "{id}"}), Call("refuse")]],
            answer="ok",
            on_error=None,
        ),
        Rule(when="who", answer="last was {state.last_applicant}"),
    )
    store = InMemorySessionStore()
    runner = runner_for(make_agent([remember, refuse], *rules), sessions=store)
    first = await runner.run(user_id="u", session_id="s", message="note APP-7")
    assert first.events[1].state_delta == {"last_applicant": "APP-7", "seen": None}
    second = await runner.run(user_id="u", session_id="s", message="who?")
    assert second.text == "last was APP-7"
    stored = await store.get("u", "s")
    assert stored is not None
    assert stored.state == {"last_applicant": "APP-7", "seen": None}


async def test_metadata_and_identity_reach_the_tool_context() -> None:
    seen: list[ToolContext] = []

    @tool
    async def peek(ctx: ToolContext) -> str:
        """Peek."""
        seen.append(ctx)
        return "ok"

    rule = Rule(when="peek", steps=[[Call("peek")]], answer="ok")
    result = await runner_for(make_agent([peek], rule)).run(
        user_id="u9",
        session_id="s9",
        message="peek",
        metadata={"traceparent": "00-abc-def-01", "deadline": 123.0},
    )
    (ctx,) = seen
    assert (ctx.agent_name, ctx.user_id, ctx.session_id) == ("loan-officer", "u9", "s9")
    assert ctx.invocation_id == result.events[0].invocation_id != ""
    assert ctx.metadata == {"traceparent": "00-abc-def-01", "deadline": 123.0}


class ChunkyModel(Model):
    """Streams like Gemini: every chunk carries the running usage totals."""

    name = "chunky"

    async def generate(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(
            content=Content.model("Hello there world"),
            usage=Usage(input_tokens=10, output_tokens=3, total_tokens=13),
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelResponse]:
        for running, word in enumerate(("Hello ", "there ", "world"), start=1):
            yield ModelResponse(
                content=Content.model(word),
                usage=Usage(input_tokens=10, output_tokens=running, total_tokens=10 + running),
                partial=True,
            )
        yield await self.generate(request)


async def test_streamed_usage_is_counted_once_per_response() -> None:
    observer = Recorder()
    store = InMemorySessionStore()
    agent = Agent(name="streamer", instruction="Be brief.")
    runner = Runner(agent, model=ChunkyModel(), observer=observer, sessions=store)
    events = [e async for e in runner.run_stream(user_id="u", session_id="s", message="hi")]
    partial = [e for e in events if e.partial]
    assert [e.text for e in partial] == ["Hello ", "there ", "world"]
    assert all(e.usage is None for e in partial)
    final = events[-1]
    assert final.final
    assert not final.partial
    assert final.text == "Hello there world"
    assert final.usage == Usage(input_tokens=10, output_tokens=3, total_tokens=13)
    assert [(u, ok) for _, _, u, ok in observer.model_calls] == [(final.usage, True)]
    stored = await store.get("u", "s")
    assert stored is not None
    assert [e.partial for e in stored.events] == [False, False]  # partial chunks not stored


async def test_scripted_stream_through_the_runner_matches_run() -> None:
    agent = make_agent([lookup_applicant, score], LOAN_RULE)
    runner = runner_for(agent)
    events = [
        e
        async for e in runner.run_stream(
            user_id="u", session_id="a", message="approve APP-1 for 1,000"
        )
    ]
    complete = [e for e in events if not e.partial]
    result = await runner.run(user_id="u", session_id="b", message="approve APP-1 for 1,000")
    assert [e.text for e in complete] == [e.text for e in result.events]
    assert [e.usage for e in complete] == [e.usage for e in result.events]
    assert "".join(e.text for e in events if e.partial) == result.text


async def test_response_schema_gives_parsed_data() -> None:
    class Decision(BaseModel):
        score: int
        reason: str

    rule = Rule(
        when=r"(?P<id>APP-\d+)",
        steps=[[Call("score", {"applicant_id": "{id}", "amount": 1000})]],
        answer_data={"score": "{score.score}", "reason": "tier {score.tier}"},
    )
    result = await runner_for(make_agent([score], rule)).run(
        user_id="u",
        session_id="s",
        message="decide APP-3",
        response_schema=Decision.model_json_schema(),
    )
    assert result.data == {"score": 712, "reason": "tier B"}
    assert Decision.model_validate(result.data).score == 712
    assert result.events[-1].metadata["data"] == result.data
    streamed = [
        e
        async for e in runner_for(make_agent([score], rule)).run_stream(
            user_id="u",
            session_id="s",
            message="decide APP-3",
            response_schema=Decision.model_json_schema(),
        )
    ]
    assert streamed[-1].final
    assert streamed[-1].metadata["data"] == {"score": 712, "reason": "tier B"}
    plain = await runner_for(make_agent([score], rule)).run(
        user_id="u", session_id="s", message="decide APP-3"
    )
    assert plain.data is None


class FailingModel(Model):
    name = "failing"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def generate(self, request: ModelRequest) -> ModelResponse:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "match"),
    [(ModelError("quota", status=429), "quota"), (RuntimeError("socket closed"), "socket closed")],
)
async def test_model_failures_surface_as_model_error(exc: Exception, match: str) -> None:
    observer = Recorder()
    runner = Runner(Agent(name="a", instruction="x"), model=FailingModel(exc), observer=observer)
    with pytest.raises(ModelError, match=match):
        await runner.run(user_id="u", session_id="s", message="hi")
    assert [(name, ok) for name, _, _, ok in observer.model_calls] == [("failing", False)]


async def test_toolsets_expand_each_turn() -> None:
    class Bureau:
        def __init__(self) -> None:
            self.expansions = 0

        async def tools(self, ctx: ToolContext) -> Sequence[Tool]:
            self.expansions += 1
            assert ctx.session_id == "s"

            async def bureau_score(applicant_id: str) -> int:
                """Score from the bureau."""
                return 640

            return [FunctionTool(bureau_score)]

    bureau = Bureau()
    rule = Rule(
        when="x", steps=[[Call("bureau_score", {"applicant_id": "A"})]], answer="{bureau_score}"
    )
    runner = runner_for(make_agent([bureau, lookup_applicant], rule))
    assert (await runner.run(user_id="u", session_id="s", message="x")).text == "640"
    await runner.run(user_id="u", session_id="s", message="x")
    assert bureau.expansions == 2


async def test_duplicate_tool_names_are_a_config_error() -> None:
    def lookup_applicant(applicant_id: str) -> str:
        """Shadow."""
        return applicant_id

    runner = runner_for(make_agent([lookup_applicant, globals()["lookup_applicant"]]))
    with pytest.raises(ConfigError, match="two tools named 'lookup_applicant'"):
        await runner.run(user_id="u", session_id="s", message="x")


def test_an_agent_without_a_model_cannot_be_run() -> None:
    @skill
    def double(req: Number) -> Number:
        """Double."""
        return Number(x=req.x * 2)

    with pytest.raises(ConfigError, match="nothing for a Runner"):
        Runner(Agent(name="calc", skills=[double]))


def blocking_tool() -> tuple[Tool, asyncio.Event, asyncio.Event]:
    """A tool ``slow`` that sets ``entered`` when called and returns once ``release`` is set."""
    entered = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Waits to be released."""
        entered.set()
        await release.wait()
        return "done"

    return slow, entered, release


async def test_turns_of_one_session_are_serialised() -> None:
    slow, entered, release = blocking_tool()
    rule = Rule(when="first", steps=[[Call("slow")]], answer="first done")
    store = InMemorySessionStore()
    runner = runner_for(make_agent([slow], rule), sessions=store)
    async with asyncio.timeout(10):
        first = asyncio.create_task(runner.run(user_id="u", session_id="s", message="first"))
        await entered.wait()
        second = asyncio.create_task(runner.run(user_id="u", session_id="s", message="second"))
        other = await runner.run(user_id="u", session_id="other", message="meanwhile")
        assert other.text == "fallback: meanwhile"  # other sessions are not blocked
        stored = await store.get("u", "s")
        assert stored is not None
        assert [e.text for e in stored.events if e.author == "user"] == ["first"]
        release.set()
        await asyncio.gather(first, second)
    stored = await store.get("u", "s")
    assert stored is not None
    assert [e.author for e in stored.events] == [
        "user",
        "loan-officer",
        "tool",
        "loan-officer",
        "user",
        "loan-officer",
    ]
    assert len(runner.locks) == 0  # no lock left behind


async def test_runners_sharing_locks_serialise_the_same_session() -> None:
    """A node's chat runner and a typed-skill runner share one SessionLocks."""
    slow, entered, release = blocking_tool()
    store = InMemorySessionStore()
    locks = SessionLocks()
    agent = make_agent([slow], Rule(when="first", steps=[[Call("slow")]], answer="first done"))
    one = runner_for(agent, sessions=store, locks=locks)
    two = runner_for(agent, sessions=store, locks=locks)
    async with asyncio.timeout(10):
        first = asyncio.create_task(one.run(user_id="u", session_id="s", message="first"))
        await entered.wait()
        second = asyncio.create_task(two.run(user_id="u", session_id="s", message="second"))
        await eventually(lambda: locks.turns("u", "s") == 2, what="the second turn waiting")
        stored = await store.get("u", "s")
        assert stored is not None
        assert [e.text for e in stored.events if e.author == "user"] == ["first"]
        release.set()
        await asyncio.gather(first, second)
    stored = await store.get("u", "s")
    assert stored is not None
    assert [e.author for e in stored.events][3:5] == ["loan-officer", "user"]
    assert len(locks) == 0


async def test_message_may_be_content_and_session_id_may_be_new() -> None:
    runner = runner_for(make_agent([]))
    result = await runner.run(
        user_id="u", session_id=None, message=Content(role="user", parts=(Part(text="hi"),))
    )
    assert result.session_id
    assert result.text == "fallback: hi"
    with pytest.raises(ConfigError, match="role 'model'"):
        await runner.run(user_id="u", session_id=None, message=Content.model("hi"))


async def test_a_stream_closed_early_releases_the_session() -> None:
    runner = Runner(Agent(name="streamer", instruction="x"), model=ChunkyModel())
    async with asyncio.timeout(10):
        stream = runner.run_stream(user_id="u", session_id="s", message="hi")
        async with contextlib.aclosing(stream):
            async for event in stream:
                assert event.partial
                break
        assert len(runner.locks) == 0
        result = await runner.run(user_id="u", session_id="s", message="again")
    assert result.text == "Hello there world"
