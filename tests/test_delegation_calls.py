"""``remote()`` tools against real specialist nodes (no registry: fixed URLs).

A delegation is driven from the test process: either a tool called directly with a
``ToolContext``, or a whole turn of a ``Runner`` with a scripted model. A flaky proxy (a real
uvicorn server on 127.0.0.1) loses the first answer, to show that a retried call runs the skill
once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mesh._agent import Agent
from mesh._errors import RemoteError, ToolError
from mesh._models.scripted import Call, Rule, Script, ScriptedModel
from mesh._remote import RemoteAgent, RemoteSkillTool, context_key, remote
from mesh._resilience import RetryPolicy
from mesh._runner import Runner
from mesh._tools import ToolContext
from mesh._tracing import TraceParent
from tests.support import (
    BUREAU_SCORES,
    StaticDiscovery,
    clean_env,
    eventually,
    free_port,
    running,
    uvicorn_serving,
)

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def node(tmp: Path, module: str, name: str, **env: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        "mesh", "serve", module, "--port", str(port), "--data-dir", str(tmp / name),
        "--no-register", "--grace", "1",
    ]  # fmt: skip
    with running(argv, name=name, tmp=tmp, health=f"{url}/health", env=clean_env(**env)):
        yield url


@pytest.fixture(scope="module")
def bureau(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with node(tmp_path_factory.mktemp("bureau"), "agents.credit_bureau:agent", "bureau") as url:
        yield url


@pytest.fixture(scope="module")
def slow_verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("slow")
    with node(
        tmp, "agents.income_verifier:agent", "verifier", INCOME_VERIFIER_LATENCY_MS="4000"
    ) as url:
        yield url


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def tool_context(**metadata: Any) -> ToolContext:
    return ToolContext(
        agent_name="test-caller",
        user_id="u",
        session_id="s",
        invocation_id=TraceParent.new().span_id,
        metadata=metadata,
    )


@contextlib.asynccontextmanager
async def toolset(rem: RemoteAgent) -> AsyncIterator[dict[str, RemoteSkillTool]]:
    try:
        yield {t.name: t for t in await rem.tools(tool_context())}
    finally:
        await rem.aclose()


_SENDS = {"SendMessage", "SendStreamingMessage"}


def _rpc_method(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return ""
    return str(parsed.get("method", "")) if isinstance(parsed, dict) else ""


@contextlib.asynccontextmanager
async def flaky_proxy(upstream: str, *, lose: int = 1) -> AsyncIterator[dict[str, Any]]:
    """Forwards everything to ``upstream``; the first ``lose`` A2A sends reach the node, but
    their answers are replaced by a 503 (as if a load balancer dropped them)."""
    state: dict[str, Any] = {"sends": 0, "lost": 0}
    http = httpx.AsyncClient(timeout=30, trust_env=False)

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in ("content-type", "accept", "a2a-version")
        }
        upstream_response = await http.request(
            request.method, upstream + request.url.path, content=body, headers=headers
        )
        if request.method == "POST" and _rpc_method(body) in _SENDS:
            state["sends"] += 1
            if state["lost"] < lose:
                state["lost"] += 1
                return Response("upstream connection reset", status_code=503)
        return Response(
            upstream_response.content,
            status_code=upstream_response.status_code,
            media_type=upstream_response.headers.get("content-type"),
        )

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    port = free_port()
    try:
        async with uvicorn_serving(
            app, port, what="the proxy", log_level="warning", lifespan="off"
        ):
            state["url"] = f"http://127.0.0.1:{port}"
            yield state
    finally:
        await http.aclose()


# -- declarations -----------------------------------------------------------------------------


async def test_typed_skill_becomes_a_tool_with_the_card_schema(bureau: str) -> None:
    async with toolset(remote(bureau)) as tools:
        assert set(tools) == {"credit_bureau_score"}
        score = tools["credit_bureau_score"]
        assert score.parameters["required"] == ["applicant_id", "amount"]
        assert "Credit score" in score.description
        result = await score.call({"applicant_id": "APP-501", "amount": 250000}, tool_context())
    assert result["score"] == BUREAU_SCORES["APP-501"]
    assert isinstance(result["score"], int)  # the card's schema says integer; the wire said 445.0


async def test_a_text_agent_is_usable_through_its_text_skill(tmp_path: Path, bureau: str) -> None:
    with node(tmp_path, "agents.loan_officer:agent", "officer") as officer:
        async with toolset(remote(officer)) as tools:
            ask = tools["ask_loan_officer"]
            assert ask.parameters["required"] == ["text"]
            answer = await ask.call({"text": "hello"}, tool_context())
    assert "Applicants on file" in answer


# -- arguments and results --------------------------------------------------------------------


async def test_invalid_arguments_never_leave_the_caller(bureau: str) -> None:
    before = metric(bureau, "mesh_tasks_total")
    async with toolset(remote(bureau)) as tools:
        with pytest.raises(ToolError) as info:
            await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-501", "amount": "a lot"}, tool_context()
            )
    assert info.value.kind == "invalid_arguments"
    assert "amount" in str(info.value)
    assert info.value.details == [{"field": "amount", "message": "must be number, got a string"}]
    assert metric(bureau, "mesh_tasks_total") == before


async def test_the_model_gets_invalid_arguments_back_as_a_tool_error(bureau: str) -> None:
    script = Script(
        rules=[
            Rule(
                when=r"score (?P<who>APP-\d+)",
                steps=[[Call("credit_bureau_score", {"applicant_id": "{who}"})]],  # no amount
                answer="score {credit_bureau_score.score}",
                on_error="the tool said: {error}",
            )
        ]
    )
    rem = remote(bureau, skill="score")
    agent = Agent(name="caller", instruction="test", tools=[rem])
    runner = Runner(agent, model=ScriptedModel(script))
    try:
        result = await runner.run(user_id="u", session_id=None, message="score APP-501")
    finally:
        await rem.aclose()
        await runner.aclose()
    responses = [r for e in result.events for r in e.function_responses]
    assert len(responses) == 1
    assert responses[0].response["error"]["type"] == "invalid_arguments"
    assert result.text == "the tool said: credit_bureau_score: invalid arguments for " + (
        "credit_bureau_score: amount: is required"
    )


async def test_a_rejected_task_is_a_remote_error_naming_peer_skill_and_reason(
    tmp_path: Path,
) -> None:
    with node(tmp_path, "agents.income_verifier:agent", "verifier") as verifier:
        async with toolset(remote(verifier)) as tools:
            with pytest.raises(RemoteError) as info:
                await tools["income_verifier_verify"].call(
                    {"applicant_id": "APP-000"}, tool_context()
                )
    err = info.value
    assert (err.peer, err.skill, err.reason) == ("income-verifier", "verify", "rejected")
    assert "no applicant 'APP-000'" in str(err)
    assert err.to_result()["error"]["type"] == "remote_rejected"


# -- resilience -------------------------------------------------------------------------------


async def test_a_retried_call_runs_the_skill_once(
    bureau: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mesh._remote")
    before = metric(bureau, "mesh_tasks_total", skill="score")
    async with flaky_proxy(bureau) as proxy:
        rem = remote("credit-bureau", url=proxy["url"], policy=RetryPolicy(initial_delay=0.05))
        async with toolset(rem) as tools:
            result = await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-738", "amount": 100000}, tool_context()
            )
        assert proxy["sends"] == 2  # the original and one retry, same message id
    assert result["score"] == BUREAU_SCORES["APP-738"]
    assert rem.recent[-1].attempts == 2
    assert rem.recent[-1].outcome == "ok"
    # The delegation's one line (docs/delegation.md), as operators read it.
    call = rem.recent[-1]
    lines = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("delegation caller=")
    ]
    assert len(lines) == 1
    assert re.fullmatch(
        rf"delegation caller=test-caller peer=credit-bureau skill=score outcome=ok attempts=2 "
        rf"target={re.escape(proxy['url'])} task={re.escape(call.task_id)} "
        rf"duration_ms=\d+\.\d trace_id={call.trace_id}",
        lines[0],
    ), lines[0]
    # The node saw two sends of one message and ran the skill once.
    assert metric(bureau, "mesh_tasks_total", skill="score") == before + 1


async def test_failover_to_a_healthy_instance(bureau: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    rem = remote("credit-bureau", policy=RetryPolicy(initial_delay=0.01))
    rem.bind(discovery=StaticDiscovery([dead, bureau]))  # type: ignore[arg-type]
    async with toolset(rem) as tools:
        for _ in range(3):
            out = await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-501", "amount": 1000}, tool_context()
            )
            assert out["score"] == BUREAU_SCORES["APP-501"]
    assert any(r.attempts == 2 for r in rem.recent)
    assert all(r.target == bureau and r.outcome == "ok" for r in rem.recent)
    assert rem.breakers.states()[bureau] == "closed"
    assert rem.describe()["instances"] == [dead, bureau]


async def test_the_deadline_bounds_a_slow_peer(slow_verifier: str) -> None:
    rem = remote(slow_verifier, deadline_s=1.0)
    async with toolset(rem) as tools:
        started = time.monotonic()
        with pytest.raises(RemoteError) as info:
            await tools["income_verifier_verify"].call({"applicant_id": "APP-501"}, tool_context())
        elapsed = time.monotonic() - started
    assert info.value.reason == "deadline"
    assert elapsed < 2.5
    # The specialist was told the deadline and gave up too.
    await eventually(
        lambda: metric(slow_verifier, "mesh_tasks_in_flight") == 0, what="the task to end"
    )


async def test_the_caller_deadline_wins_when_sooner(slow_verifier: str) -> None:
    rem = remote(slow_verifier, deadline_s=30)
    async with toolset(rem) as tools:
        started = time.monotonic()
        with pytest.raises(RemoteError, match="deadline"):
            await tools["income_verifier_verify"].call(
                {"applicant_id": "APP-501"}, tool_context(deadline=time.time() + 0.8)
            )
    assert time.monotonic() - started < 2.0


async def test_cancelling_the_caller_cancels_the_child_task(slow_verifier: str) -> None:
    before = metric(slow_verifier, "mesh_tasks_total", outcome="canceled")
    rem = remote(slow_verifier, deadline_s=30)
    async with toolset(rem) as tools:
        call = asyncio.create_task(
            tools["income_verifier_verify"].call({"applicant_id": "APP-612"}, tool_context())
        )
        await eventually(
            lambda: metric(slow_verifier, "mesh_tasks_in_flight") >= 1, what="the child task"
        )
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        task_id = rem.recent[-1].task_id
        assert rem.recent[-1].outcome == "canceled"
    from mesh._a2a.client import A2APeer

    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        peer = A2APeer(http, slow_verifier)
        try:
            task = await peer.get_task(task_id)
        finally:
            await peer.aclose()
    assert task.state == "canceled"
    await eventually(
        lambda: metric(slow_verifier, "mesh_tasks_total", outcome="canceled") == before + 1,
        what="the canceled task to be counted",
    )


# -- context, trace, usage --------------------------------------------------------------------


async def test_session_keeps_one_context_per_peer_and_the_trace_goes_along(bureau: str) -> None:
    root = TraceParent.new()
    rem = remote(bureau)
    async with toolset(rem) as tools:
        score = tools["credit_bureau_score"]
        ctx1 = tool_context(traceparent=str(root))
        await score.call({"applicant_id": "APP-501", "amount": 5000}, ctx1)
        key = context_key("credit-bureau")
        assert key in ctx1.state_delta
        ctx2 = ToolContext(
            agent_name="test-caller",
            session_state=dict(ctx1.state_delta),
            metadata={"traceparent": str(root)},
        )
        await score.call({"applicant_id": "APP-612", "amount": 5000}, ctx2)
        assert key not in ctx2.state_delta  # unchanged: same context
    from mesh._a2a.client import A2APeer

    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        peer = A2APeer(http, bureau)
        try:
            tasks = [await peer.get_task(r.task_id) for r in rem.recent]
        finally:
            await peer.aclose()
    assert tasks[0].context_id == tasks[1].context_id == ctx1.state_delta[key]
    for task in tasks:
        tp = TraceParent.parse(task.metadata["traceparent"])
        assert tp is not None
        assert tp.trace_id == root.trace_id
        assert tp.span_id != root.span_id
        assert task.metadata["caller"] == "test-caller"


async def test_child_usage_goes_to_the_callers_sink(tmp_path: Path) -> None:
    with node(tmp_path, "agents.loan_officer:agent", "officer") as officer:
        sink: list[dict[str, int]] = []
        async with toolset(remote(officer)) as tools:
            await tools["ask_loan_officer"].call({"text": "hello"}, tool_context(usage_sink=sink))
    assert len(sink) == 1
    assert sink[0]["inputTokens"] > 0
    assert sink[0]["outputTokens"] > 0


async def test_delegation_metrics_on_the_bound_registry(bureau: str) -> None:
    from prometheus_client import CollectorRegistry

    from mesh._metrics import NodeMetrics
    from mesh._resilience import BreakerBoard

    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "caller", process_collectors=False)

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"agent": "caller", **labels}) or 0.0

    async with flaky_proxy(bureau) as proxy:
        rem = remote("credit-bureau", policy=RetryPolicy(initial_delay=0.01))
        rem.bind(discovery=StaticDiscovery([proxy["url"]]), metrics=metrics)  # type: ignore[arg-type]
        async with toolset(rem) as tools:
            out = await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-501", "amount": 1000}, tool_context()
            )
            with pytest.raises(ToolError):
                await tools["credit_bureau_score"].call({"applicant_id": 5}, tool_context())
    assert out["score"] == BUREAU_SCORES["APP-501"]
    labels = {"peer": "credit-bureau", "skill": "score"}
    assert value("mesh_delegation_retries_total", **labels) == 1
    assert value("mesh_delegations_total", outcome="ok", **labels) == 1
    assert value("mesh_delegations_total", outcome="rejected", **labels) == 1
    assert value("mesh_delegation_duration_seconds_count", **labels) == 2

    # An instance that refuses connections: its breaker opens (gauge 2), the call is
    # "unavailable" after the retries.
    dead = f"http://127.0.0.1:{free_port()}"
    down = remote(
        "credit-bureau",
        skill="score",
        policy=RetryPolicy(attempts=3, initial_delay=0.01),
        breakers=BreakerBoard(failure_threshold=2, cool_down=60),
    )
    down.bind(discovery=StaticDiscovery([bureau]), metrics=metrics)  # type: ignore[arg-type]
    async with toolset(down) as tools:  # the card is read (and cached) while the bureau is up
        down.bind(discovery=StaticDiscovery([dead]))  # type: ignore[arg-type]
        with pytest.raises(RemoteError) as info:
            await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-1", "amount": 1000}, tool_context()
            )
    assert info.value.reason == "unavailable"
    assert value("mesh_circuit_breaker_state", peer="credit-bureau", target=dead) == 2
    assert value("mesh_delegations_total", outcome="unavailable", **labels) == 1
    assert down.describe()["breakers"] == {dead: "open"}


async def test_a_sent_call_counts_in_its_own_outcomes_series(tmp_path: Path) -> None:
    """The ``ok`` series a call looks up while the peer works (``NodeMetrics.delegation_series``)
    are used for an ``ok`` call only, and not made by the lookup: a call sent and answered
    with a rejected task counts as rejected (no ``ok`` series shown yet), and each call's
    duration once."""
    from prometheus_client import CollectorRegistry

    from mesh._metrics import NodeMetrics

    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "caller", process_collectors=False)
    looked_up = []
    series = metrics.delegation_series

    def delegation_series(peer: str, skill: str) -> Any:
        looked_up.append((peer, skill))
        return series(peer, skill)

    metrics.delegation_series = delegation_series  # type: ignore[method-assign]

    def value(name: str, **labels: str) -> float:
        found = registry.get_sample_value(
            name, {"agent": "caller", "peer": "income-verifier", "skill": "verify", **labels}
        )
        return found or 0.0

    with node(tmp_path, "agents.income_verifier:agent", "verifier") as verifier:
        rem = remote(verifier)
        rem.bind(metrics=metrics)
        async with toolset(rem) as tools:
            with pytest.raises(RemoteError):
                await tools["income_verifier_verify"].call(
                    {"applicant_id": "APP-000"}, tool_context()
                )
            assert value("mesh_delegations_total", outcome="rejected") == 1
            assert (
                registry.get_sample_value(
                    "mesh_delegations_total",
                    {
                        "agent": "caller",
                        "peer": "income-verifier",
                        "skill": "verify",
                        "outcome": "ok",
                    },
                )
                is None
            )
            await tools["income_verifier_verify"].call({"applicant_id": "APP-501"}, tool_context())
    assert value("mesh_delegations_total", outcome="rejected") == 1
    assert value("mesh_delegations_total", outcome="ok") == 1
    assert value("mesh_delegation_duration_seconds_count") == 2
    assert looked_up == [("income-verifier", "verify")] * 2  # once each call, once it was sent


async def test_breaker_series_follow_the_resolved_instances_and_stay_bounded(bureau: str) -> None:
    """Junk instances registered under a peer's name set the breaker gauge's ``target`` label:
    the officer's series grew from 4 to 304 and never shrank."""
    from prometheus_client import CollectorRegistry

    from mesh._metrics import MAX_BREAKER_TARGETS, NodeMetrics
    from mesh._resilience import BreakerBoard

    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "caller", process_collectors=False)

    def series() -> dict[str, float]:
        return {
            s.labels["target"]: s.value
            for family in registry.collect()
            for s in family.samples
            if s.name == "mesh_circuit_breaker_state"
        }

    # Closed ports: junk as an attacker registers it (the bureau first: the card comes from it).
    junk = [f"http://127.0.0.1:{free_port()}/i/{i}" for i in range(299)]
    discovery = StaticDiscovery([bureau, *junk])
    rem = remote("credit-bureau", skill="score", breakers=BreakerBoard(failure_threshold=1))
    rem.bind(discovery=discovery, metrics=metrics)  # type: ignore[arg-type]
    async with toolset(rem) as tools:
        shown = series()
        assert len(shown) == MAX_BREAKER_TARGETS + 1, len(shown)
        assert shown[bureau] == 0
        assert shown["other"] == 0
        rem.breakers.get(junk[250]).record_failure()  # opens: "other" shows the worst
        assert series()["other"] == 2
        # The junk is gone from discovery: so are its series and its breakers.
        discovery.urls = [bureau]
        out = await tools["credit_bureau_score"].call(
            {"applicant_id": "APP-501", "amount": 1000}, tool_context()
        )
    assert out["score"] == BUREAU_SCORES["APP-501"]
    assert series() == {bureau: 0}
    assert set(rem.describe()["breakers"]) <= {bureau}


# -- configuration stays the caller's ----------------------------------------------------------


async def test_a_breaker_board_passed_to_remote_keeps_its_on_change(bureau: str) -> None:
    """``remote(breakers=board)`` replaced the board's ``on_change`` with its own gauge hook."""
    from prometheus_client import CollectorRegistry

    from mesh._metrics import NodeMetrics
    from mesh._resilience import BreakerBoard, BreakerState

    seen: list[tuple[str, str]] = []

    def mine(target: str, state: BreakerState) -> None:
        seen.append((target, state.name.lower()))

    board = BreakerBoard(failure_threshold=1, cool_down=60, on_change=mine)
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "caller", process_collectors=False)
    rem = remote(
        "credit-bureau",
        skill="score",
        policy=RetryPolicy(attempts=2, initial_delay=0.01),
        breakers=board,
    )
    assert board.on_change is mine
    dead = f"http://127.0.0.1:{free_port()}"
    rem.bind(discovery=StaticDiscovery([bureau]), metrics=metrics)  # type: ignore[arg-type]
    async with toolset(rem) as tools:  # the card comes from the bureau
        rem.bind(discovery=StaticDiscovery([dead]))  # type: ignore[arg-type]
        with pytest.raises(RemoteError):
            await tools["credit_bureau_score"].call(
                {"applicant_id": "APP-1", "amount": 1000}, tool_context()
            )
    assert board.on_change is mine
    assert seen == [(dead, "open")]
    # The toolset still shows the breaker, as a listener of the board.
    labels = {"agent": "caller", "peer": "credit-bureau", "target": dead}
    assert registry.get_sample_value("mesh_circuit_breaker_state", labels) == 2


async def test_a_node_runs_its_own_copy_of_the_agents_remote_toolsets(
    tmp_path: Path, bureau: str
) -> None:
    """The node bound (and recorded calls on) the toolset stored in the user's ``Agent``: after
    the node stopped, that toolset still held the node's closed HTTP client."""
    from mesh._a2a.client import A2APeer
    from mesh._node import Node
    from mesh._settings import NodeSettings

    rem = remote("credit-bureau", skill="score", url=bureau)
    agent = Agent(
        name="test-officer",
        instruction="Score applicants through the credit bureau.",
        tools=[rem],
        script=Script(
            rules=[
                Rule(
                    when=r"score (?P<who>APP-\d+)",
                    steps=[[Call("credit_bureau_score", {"applicant_id": "{who}", "amount": 10})]],
                    answer="score {credit_bureau_score.score}",
                )
            ]
        ),
    )
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=tmp_path / "node", grace_seconds=1))
    async with uvicorn_serving(node.app, port, what="the node", log_level="warning"):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            peer = A2APeer(http, f"http://127.0.0.1:{port}")
            answer = await peer.send("score APP-501")
        ran = node.agent.tools[0]
    assert answer.text == f"score {BUREAU_SCORES['APP-501']}", answer
    assert agent.tools == [rem]
    assert isinstance(ran, RemoteAgent)
    assert ran is not rem
    assert [r.outcome for r in ran.recent] == ["ok"]
    assert list(rem.recent) == []
    assert rem.caller == ""
    # The user's toolset still works on its own (it held the node's closed client before).
    async with toolset(rem) as tools:
        out = await tools["credit_bureau_score"].call(
            {"applicant_id": "APP-612", "amount": 10}, tool_context()
        )
    assert out["score"] == BUREAU_SCORES["APP-612"]
