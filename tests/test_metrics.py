"""``NodeMetrics``' closed label sets: what a caller (or a model steered by one) chooses never
becomes a label value."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from mesh.agent import Agent
from mesh.metrics import NodeMetrics
from mesh.models.scripted import Call, Rule, Script
from mesh.runner import Runner
from mesh.sessions.memory import InMemorySessionStore
from mesh.tools import tool


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
