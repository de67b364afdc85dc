"""The loan desk end to end: registry, two credit-bureau replicas, income verifier, loan officer,
each a real process; questions sent with the real a2a-sdk client (``A2APeer``)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh._a2a.client import A2APeer, TaskResult
from mesh._tracing import TraceParent
from tests.support import (
    BUREAU_SCORES,
    Proc,
    clean_env,
    free_port,
    running,
    wait_for,
    wait_until_ok,
)

pytestmark = pytest.mark.integration

DEADLINE_S = 8.0
QUESTION = "Should we approve APP-612 for 400,000 over 48 months?"


@dataclass
class Desk:
    registry: str
    officer: str
    bureaus: dict[str, Proc] = field(default_factory=dict)  # url -> process
    verifier: str = ""
    procs: list[Proc] = field(default_factory=list)


@contextlib.contextmanager
def loan_desk(
    tmp: Path,
    *,
    verifier_latency_ms: int = 0,
    token: str | None = None,
    officer_env: dict[str, str] | None = None,
) -> Iterator[Desk]:
    reg_port = free_port()
    registry = f"http://127.0.0.1:{reg_port}"
    env = clean_env(MESH_REGISTRY=registry, LOAN_DESK_DEADLINE_S=str(DEADLINE_S))
    if token is not None:
        env["MESH_TOKEN"] = token
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            running(
                [
                    "mesh", "registry", "--port", str(reg_port), "--data-dir", str(tmp / "reg"),
                    "--probe-interval", "0.5", "--probe-timeout", "0.4",
                ],
                name="registry", tmp=tmp, health=f"{registry}/health", env=env,
            )
        )  # fmt: skip
        desk = Desk(registry=registry, officer="")
        nodes = [
            ("credit-bureau-1", "agents.credit_bureau:agent", {}),
            ("credit-bureau-2", "agents.credit_bureau:agent", {}),
            (
                "income-verifier",
                "agents.income_verifier:agent",
                {"INCOME_VERIFIER_LATENCY_MS": str(verifier_latency_ms)},
            ),
            ("loan-officer", "agents.loan_officer:agent", officer_env or {}),
        ]
        started: list[tuple[str, Proc, str]] = []
        for name, module, extra in nodes:
            port = free_port()
            argv = [
                "mesh", "serve", module, "--port", str(port),
                "--data-dir", str(tmp / name), "--registry", registry, "--grace", "2",
            ]  # fmt: skip
            proc = Proc.start(argv, name=name, tmp=tmp, env={**env, **extra})
            stack.callback(proc.terminate)
            started.append((name, proc, f"http://127.0.0.1:{port}"))
        for name, proc, url in started:
            wait_until_ok(f"{url}/health", proc=proc, timeout=40)
            desk.procs.append(proc)
            if name.startswith("credit-bureau"):
                desk.bureaus[url] = proc
            elif name == "income-verifier":
                desk.verifier = url
            else:
                desk.officer = url
        yield desk


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desk]:
    with loan_desk(tmp_path_factory.mktemp("desk"), verifier_latency_ms=300) as d:
        yield d


@contextlib.asynccontextmanager
async def client(url: str) -> AsyncIterator[A2APeer]:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, url)
        try:
            yield peer
        finally:
            await peer.aclose()


async def ask(url: str, text: str, *, traceparent: str | None = None) -> TaskResult:
    async with client(url) as peer:
        meta = {"traceparent": traceparent} if traceparent else None
        return await peer.send(text, metadata=meta, timeout=30)


async def tasks_of(url: str) -> list[TaskResult]:
    async with client(url) as peer:
        return (await peer.list_tasks(page_size=100)).tasks


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def peers_of(url: str) -> dict[str, dict[str, Any]]:
    doc = httpx.get(f"{url}/introspect", timeout=5, trust_env=False).json()
    return {p["name"]: p for p in doc["peers"]}


def _keys(value: Any) -> list[str]:
    """Every key of a JSON value, however deep."""
    if isinstance(value, dict):
        return [k for key, inner in value.items() for k in (str(key), *_keys(inner))]
    if isinstance(value, list):
        return [k for inner in value for k in _keys(inner)]
    return []


def trace_of(result: TaskResult) -> str | None:
    parsed = TraceParent.parse(result.metadata.get("traceparent"))
    return parsed.trace_id if parsed else None


# -- the happy path ---------------------------------------------------------------------------


async def test_loan_question_uses_both_specialists_under_one_trace(desk: Desk) -> None:
    root = TraceParent.new()
    result = await ask(desk.officer, QUESTION, traceparent=str(root))
    assert result.state == "completed", result
    expected_score = BUREAU_SCORES["APP-612"]
    assert f"score {expected_score}" in result.text
    assert "Income verifier: discrepancy" in result.text  # APP-612 declared 25% too much
    assert "DECLINE" in result.text or "REFER" in result.text or "APPROVE" in result.text

    # One trace id in the three nodes' task metadata.
    assert trace_of(result) == root.trace_id
    bureau_tasks = [t for url in desk.bureaus for t in await tasks_of(url)]
    verifier_tasks = await tasks_of(desk.verifier)
    scored = [t for t in bureau_tasks if trace_of(t) == root.trace_id]
    verified = [t for t in verifier_tasks if trace_of(t) == root.trace_id]
    assert len(scored) == 1
    assert scored[0].data is not None
    assert scored[0].data["score"] == expected_score
    assert len(verified) == 1
    assert verified[0].data is not None
    assert verified[0].data["status"] == "discrepancy"
    # Each hop has its own span under the same trace.
    spans = {TraceParent.parse(t.metadata["traceparent"]).span_id for t in (scored[0], verified[0])}  # type: ignore[union-attr]
    assert root.span_id not in spans
    assert len(spans) == 2
    # The specialists know who called.
    assert scored[0].metadata.get("caller") == "loan-officer"


async def test_the_two_specialist_calls_of_one_turn_overlap(desk: Desk) -> None:
    root = TraceParent.new()
    result = await ask(
        desk.officer, "approve APP-738 for 500000 over 36 months", traceparent=str(root)
    )
    assert result.state == "completed", result
    peers = peers_of(desk.officer)
    score = [r for r in peers["credit-bureau"]["recent"] if r["trace_id"] == root.trace_id]
    verify = [r for r in peers["income-verifier"]["recent"] if r["trace_id"] == root.trace_id]
    assert len(score) == 1
    assert len(verify) == 1
    a, b = score[0], verify[0]
    # The verifier takes 300 ms; the bureau call started before the verifier's ended and
    # vice versa: they ran at the same time, not one after the other.
    assert a["started_at"] < b["ended_at"]
    assert b["started_at"] < a["ended_at"]
    assert b["ended_at"] - b["started_at"] >= 0.3


async def test_introspect_shows_each_peer_as_a_node(desk: Desk) -> None:
    await ask(desk.officer, QUESTION)
    peers = peers_of(desk.officer)
    # The underwriter is declared too (consulted only above the threshold: not running here).
    assert set(peers) == {"credit-bureau", "income-verifier", "underwriter"}
    bureau = peers["credit-bureau"]
    assert bureau["kind"] == "remote"
    assert bureau["skills"] == ["score"]
    assert set(bureau["instances"]) == set(desk.bureaus)
    assert set(bureau["breakers"].values()) <= {"closed"}
    assert peers["income-verifier"]["tools"] == ["income_verifier_verify"]


async def test_a_trace_is_created_when_the_caller_sends_none(desk: Desk) -> None:
    result = await ask(desk.officer, QUESTION)
    assert result.state == "completed", result
    trace = trace_of(result)
    assert trace is not None, "the coordinator's task carries the trace it created"
    bureau_tasks = [t for url in desk.bureaus for t in await tasks_of(url)]
    children = [t for t in bureau_tasks if trace_of(t) == trace]
    assert children, "the child task shares it"
    # The turn reports its own usage and its children's (deterministic specialists: zero),
    # every key in A2A's JSON naming (camelCase), the child's too.
    assert result.metadata["usage"]["outputTokens"] > 0
    assert result.metadata["childrenUsage"].get("outputTokens") == 0
    assert all(t.metadata["callerTask"] == result.task_id for t in children)
    for task in (result, *children):
        snake = [k for k in _keys(task.metadata) if "_" in k]
        assert snake == [], (snake, task.metadata)


async def test_the_officer_reports_delegations_in_metrics(desk: Desk) -> None:
    before = metric(desk.officer, "mesh_delegations_total", peer="credit-bureau", outcome="ok")
    result = await ask(desk.officer, QUESTION)
    assert result.state == "completed"
    after = metric(desk.officer, "mesh_delegations_total", peer="credit-bureau", outcome="ok")
    assert after == before + 1


async def test_a_specialist_conversation_keeps_one_context_per_peer(desk: Desk) -> None:
    traces = [TraceParent.new(), TraceParent.new()]
    async with client(desk.officer) as peer:
        first = await peer.send(
            "Tell me about APP-501", metadata={"traceparent": str(traces[0])}, timeout=30
        )
        second = await peer.send(
            "Tell me about APP-847",
            context_id=first.context_id,
            metadata={"traceparent": str(traces[1])},
            timeout=30,
        )
    assert first.state == second.state == "completed"
    assert first.context_id == second.context_id
    by_trace = {trace_of(t): t for t in await tasks_of(desk.verifier)}
    mine = [by_trace[t.trace_id] for t in traces]
    assert [t.data["applicant_id"] for t in mine if t.data] == ["APP-501", "APP-847"]
    assert mine[0].context_id == mine[1].context_id, "one A2A context with the verifier"
    # A new officer session gets a new context with the verifier.
    third_trace = TraceParent.new()
    await ask(desk.officer, "Tell me about APP-902", traceparent=str(third_trace))
    third = {trace_of(t): t for t in await tasks_of(desk.verifier)}[third_trace.trace_id]
    assert third.context_id != mine[0].context_id


# -- failures ---------------------------------------------------------------------------------


async def test_killing_one_bureau_replica_does_not_fail_the_next_requests(tmp_path: Path) -> None:
    with loan_desk(tmp_path) as desk:
        assert (await ask(desk.officer, QUESTION)).state == "completed"
        dead_url, dead = next(iter(desk.bureaus.items()))
        dead.kill()  # SIGKILL: no deregistration, the registry still lists it for a moment
        for _ in range(4):
            result = await ask(desk.officer, QUESTION)
            assert result.state == "completed"
            assert f"score {BUREAU_SCORES['APP-612']}" in result.text, result.text
        recent = peers_of(desk.officer)["credit-bureau"]["recent"]
        failed_over = [r for r in recent if r["attempts"] > 1]
        assert failed_over, f"the dead replica was never tried: {recent}"
        assert all(r["outcome"] == "ok" and r["target"] != dead_url for r in failed_over)


async def test_with_both_bureaus_down_the_officer_says_so_within_the_deadline(
    tmp_path: Path,
) -> None:
    with loan_desk(tmp_path) as desk:
        for proc in desk.bureaus.values():
            proc.kill()
        started = time.monotonic()
        result = await ask(desk.officer, QUESTION)
        elapsed = time.monotonic() - started
        assert result.state == "completed"
        assert re.search(r"credit.bureau is unavailable", result.text), result.text
        assert elapsed < DEADLINE_S
        recent = peers_of(desk.officer)["credit-bureau"]["recent"]
        assert recent[-1]["outcome"] == "unavailable"


async def test_with_both_bureaus_stopped_discovery_says_unavailable(tmp_path: Path) -> None:
    with loan_desk(tmp_path) as desk:
        for proc in desk.bureaus.values():
            assert proc.terminate() == 0
        wait_for(
            lambda: (
                httpx.get(
                    f"{desk.registry}/v1/instances",
                    params={"agent": "credit-bureau"},
                    trust_env=False,
                ).json()["instances"]
                == []
            ),
            what="the bureaus to deregister",
        )
        started = time.monotonic()
        result = await ask(desk.officer, QUESTION)
        assert time.monotonic() - started < DEADLINE_S
        assert re.search(r"credit.bureau is unavailable", result.text), result.text
