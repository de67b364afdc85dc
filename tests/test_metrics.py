"""``NodeMetrics``' closed label sets: what a caller (or a model steered by one) chooses never
becomes a label value."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from mesh._agent import Agent
from mesh._metrics import MAX_CACHED_CHILDREN, NodeMetrics, render
from mesh._models.scripted import Call, Rule, Script
from mesh._runner import Runner
from mesh._sessions.memory import InMemorySessionStore
from mesh._tools import tool


def _values(registry: CollectorRegistry, metric: str, label: str) -> set[str]:
    return {
        s.labels[label]
        for family in registry.collect()
        for s in family.samples
        if s.name == metric and label in s.labels
    }


def test_methods_and_skills_outside_the_closed_sets_are_other() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(
        registry, "a", skills=["score"], methods=["SendMessage"], process_collectors=False
    )
    for name in ("SendMessage", "Bogus" * 1000, "unauthorized", "busy"):
        metrics.request(name, ok=False)
    for skill in ("score", "x" * 5000, "unknown"):
        metrics.task_started()
        metrics.task_done(skill, "rejected", 0.01)
    assert _values(registry, "mesh_requests_total", "method") == {
        "SendMessage",
        "other",
        "unauthorized",
        "busy",
    }
    assert _values(registry, "mesh_tasks_total", "skill") == {"score", "other"}


def test_without_closed_sets_values_pass_through() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", process_collectors=False)
    metrics.request("AnyMethod", ok=True)
    assert _values(registry, "mesh_requests_total", "method") == {"AnyMethod"}


async def test_a_tool_name_the_model_invents_is_counted_as_other() -> None:
    @tool
    def lookup(applicant_id: str) -> dict[str, str]:
        """Look an applicant up."""
        return {"applicant_id": applicant_id}

    script = Script(
        rules=[
            Rule(
                when=r"go",
                steps=[[Call("lookup", {"applicant_id": "A"}), Call("made_up_tool_9f3", {})]],
                answer="done",
                on_error=None,
            )
        ]
    )
    agent = Agent(name="a", instruction="Use tools.", tools=[lookup], script=script)
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", process_collectors=False)
    runner = Runner(agent, sessions=InMemorySessionStore(), observer=metrics)
    await runner.run(user_id="u", session_id=None, message="go")
    assert _values(registry, "mesh_tool_calls_total", "tool") == {"lookup", "other"}


def _breakers(registry: CollectorRegistry, peer: str) -> dict[str, float]:
    return {
        s.labels["target"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "mesh_circuit_breaker_state" and s.labels["peer"] == peer
    }


def test_breaker_series_are_the_latest_targets_and_at_most_max_per_peer() -> None:
    """Junk registrations of a peer grew the officer's breaker series from 4 to 304: each
    resolved URL was a series, and stayed one after it was gone."""
    from mesh._metrics import MAX_BREAKER_TARGETS

    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "officer", process_collectors=False)
    junk = [f"http://127.0.0.1:{9000 + i}" for i in range(300)]
    states: dict[str, Any] = dict.fromkeys(junk, "closed")
    states[junk[200]] = "open"  # beyond the first MAX_BREAKER_TARGETS: folded into "other"
    metrics.breaker_states("income-verifier", states)
    metrics.breaker_states("credit-bureau", {"http://127.0.0.1:8411": "half-open"})
    series = _breakers(registry, "income-verifier")
    assert len(series) == MAX_BREAKER_TARGETS + 1
    assert list(series)[:MAX_BREAKER_TARGETS] == junk[:MAX_BREAKER_TARGETS]
    assert series["other"] == 2  # the worst state of the rest
    # The next resolution names two instances: only they have series; other peers keep theirs.
    metrics.breaker_states("income-verifier", {junk[0]: "open", junk[1]: "closed"})
    assert _breakers(registry, "income-verifier") == {junk[0]: 2, junk[1]: 0}
    assert _breakers(registry, "credit-bureau") == {"http://127.0.0.1:8411": 1}


def test_label_children_are_resolved_once_per_label_set_and_the_cache_is_bounded() -> None:
    """A turn's metrics do not call ``labels()`` each time (issue 19 item 1); values beyond
    ``MAX_CACHED_CHILDREN`` label sets still count, without growing the cache."""
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", process_collectors=False)
    resolved: list[tuple[str, ...]] = []
    for metric in (metrics.tool_calls, metrics.model_calls, metrics.tasks):
        real = metric.labels

        def counting(*values: str, real: Any = real) -> Any:
            resolved.append(values)
            return real(*values)

        metric.labels = counting  # type: ignore[method-assign]
    for _ in range(3):
        metrics.on_tool_call("lookup", ok=True)
        metrics.on_model_call("scripted", 0.01, None, ok=True)
        metrics.task_started()
        metrics.task_done("chat", "completed", 0.01)
    assert sorted(resolved) == [
        ("a", "chat", "completed"),
        ("a", "lookup", "ok"),
        ("a", "scripted", "ok"),
    ]
    beyond = [f"tool{i}" for i in range(MAX_CACHED_CHILDREN + 10)]
    for name in beyond + beyond:
        metrics.on_tool_call(name, ok=False)
    counts = {
        s.labels["tool"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "mesh_tool_calls_total"
    }
    assert counts["lookup"] == 3
    assert all(counts[name] == 2 for name in beyond)
    assert len(metrics._tool_calls._cache) == MAX_CACHED_CHILDREN


def test_tasks_in_flight_are_counted_by_the_node_and_read_when_scraped() -> None:
    """``mesh_tasks_in_flight`` is the tasks started and not done, as the gauge's inc and dec
    kept it, without calling them (a lock through three Python calls each, twice per task)."""
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", skills=["score"], process_collectors=False)
    gauge = metrics.tasks_in_flight.labels("a")
    called: list[str] = []
    gauge.inc = lambda *_: called.append("inc")  # type: ignore[method-assign]
    gauge.dec = lambda *_: called.append("dec")  # type: ignore[method-assign]

    def in_flight() -> float | None:
        return registry.get_sample_value("mesh_tasks_in_flight", {"agent": "a"})

    assert in_flight() == 0.0
    for _ in range(3):
        metrics.task_started()
    metrics.task_done("score", "completed", 0.01)
    assert in_flight() == 2.0
    assert 'mesh_tasks_in_flight{agent="a"} 2.0' in render(registry)[0].decode()
    metrics.task_done("score", "failed", 0.01)
    metrics.task_done("other", "canceled", 0.01)
    assert in_flight() == 0.0
    assert called == []


def test_a_tasks_series_are_looked_up_once_per_skill_and_outcome_and_bounded() -> None:
    """``task_done`` resolves its counter and histogram once per skill and outcome it is
    given; skills beyond the declared ones still count as ``other``, and the names kept are
    at most ``MAX_CACHED_CHILDREN``."""
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", skills=["score"], process_collectors=False)
    resolved: list[tuple[str, ...]] = []
    real = metrics._tasks

    def counting(*values: str) -> Any:
        resolved.append(values)
        return real(*values)

    metrics._tasks = counting  # type: ignore[assignment]
    for _ in range(3):
        metrics.task_started()
        metrics.task_done("score", "completed", 0.01)
    assert resolved == [("a", "score", "completed")]
    junk = [f"skill-{i}" for i in range(MAX_CACHED_CHILDREN + 10)]
    for skill in junk + junk:
        metrics.task_started()
        metrics.task_done(skill, "rejected", 0.01)
    assert set(metrics._task_series) == {("score", "completed")}  # an undeclared skill: not kept

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"agent": "a", **labels})

    assert value("mesh_tasks_total", skill="score", outcome="completed") == 3
    assert value("mesh_tasks_total", skill="other", outcome="rejected") == 2 * len(junk)
    assert value("mesh_task_duration_seconds_count", skill="score") == 3
    assert value("mesh_task_duration_seconds_count", skill="other") == 2 * len(junk)
    assert value("mesh_tasks_in_flight") == 0


def test_a_requests_counter_is_looked_up_once_per_method_and_outcome_and_bounded() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "a", methods=["SendMessage"], process_collectors=False)
    resolved: list[tuple[str, ...]] = []
    real = metrics._requests

    def counting(*values: str) -> Any:
        resolved.append(values)
        return real(*values)

    metrics._requests = counting  # type: ignore[assignment]
    for ok in (True, True, False, True):
        metrics.request("SendMessage", ok=ok)
    assert resolved == [("a", "SendMessage", "ok"), ("a", "SendMessage", "error")]
    junk = [f"Method{i}" for i in range(MAX_CACHED_CHILDREN + 10)]
    for name in junk + junk:
        metrics.request(name, ok=False)
    # A method name comes from the caller (up to the body limit): an unknown one is not kept.
    assert set(metrics._request_series) == {("SendMessage", True), ("SendMessage", False)}

    def value(method: str, outcome: str) -> float | None:
        labels = {"agent": "a", "method": method, "outcome": outcome}
        return registry.get_sample_value("mesh_requests_total", labels)

    assert value("SendMessage", "ok") == 3
    assert value("SendMessage", "error") == 1
    assert value("other", "error") == 2 * len(junk)
