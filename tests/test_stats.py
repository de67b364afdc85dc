"""A node's window stats (mesh._stats), read from the metrics it already keeps, and the model
prices they cost tokens at (MESH_MODEL_PRICES)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from mesh._errors import ConfigError
from mesh._metrics import NodeMetrics
from mesh._settings.settings import NodeSettings
from mesh._stats import NodeStats, quantile
from mesh._types import Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node(**kwargs: object) -> tuple[NodeMetrics, NodeStats, Clock]:
    metrics = NodeMetrics(CollectorRegistry(), "officer", skills=["chat"], process_collectors=False)
    clock = Clock()
    return metrics, NodeStats(metrics, clock=clock, **kwargs), clock  # type: ignore[arg-type]


def test_edges_count_calls_and_errors_since_start_and_over_the_window() -> None:
    metrics, stats, clock = node(window_s=60, every_s=5)
    for outcome in ("ok", "ok", "unavailable", "canceled"):
        metrics.delegation("bureau", "score", outcome, 0.02)
    first = stats.report(peers=["bureau", "verifier"])
    (edge,) = first["edges"]
    assert (edge["peer"], edge["skill"], edge["calls_total"], edge["errors_total"]) == (
        "bureau",
        "score",
        4,
        1,  # canceled is the caller's choice, not an error
    )
    assert edge["calls"] == 4
    assert edge["buckets"][-1] == 4
    assert first["peers"] == ["bureau", "verifier"]

    clock.now += 30
    assert stats.report()["window_s"] == 30  # the start is the newest snapshot 60 s old
    clock.now += 40  # the +30 s snapshot is 40 s old: the window still starts at the start
    metrics.delegation("bureau", "score", "ok", 0.5)
    assert stats.report()["edges"][0]["calls"] == 5
    clock.now += 30  # +100 s: the +30 s snapshot is 70 s old, the newest that old
    later = stats.report()
    (edge,) = later["edges"]
    assert (edge["calls_total"], edge["calls"], edge["errors"]) == (5, 1, 0)
    assert later["window_s"] == 70
    assert quantile(0.5, later["le"], edge["buckets"]) == pytest.approx(0.375)


def test_tasks_by_skill_fold_into_the_agents_row() -> None:
    metrics, stats, _ = node()
    for outcome in ("completed", "failed", "rejected", "waiting"):
        metrics.task_started()
        metrics.task_done("chat", outcome, 0.1)
    report = stats.report()
    # Waiting is not an end: three tasks ended, two of them in error.
    assert (report["tasks"]["calls_total"], report["tasks"]["errors_total"]) == (3, 2)
    assert [s["skill"] for s in report["skills"]] == ["chat"]


def test_edges_beyond_the_bound_are_one_other_edge() -> None:
    metrics, stats, _ = node(max_edges=2)
    for i, calls in enumerate((5, 4, 3, 2)):
        for _ in range(calls):
            metrics.delegation(f"peer{i}", "s", "ok", 0.01)
    edges = stats.report()["edges"]
    assert [(e["peer"], e["calls_total"]) for e in edges] == [
        ("peer0", 5),
        ("peer1", 4),
        ("other", 5),
    ]
    assert edges[-1]["buckets"][-1] == 5


def test_tokens_cost_only_where_a_price_is_configured() -> None:
    metrics, stats, _ = node(prices={"priced": (1.0, 10.0)})
    metrics.on_model_call("priced", 0.1, Usage(input_tokens=2000, output_tokens=300), True)
    metrics.on_model_call("free", 0.1, Usage(input_tokens=50, output_tokens=5), True)
    report = stats.report()
    assert {t["model"]: (t["input_total"], t["output_total"]) for t in report["tokens"]} == {
        "priced": (2000, 300),
        "free": (50, 5),
    }
    assert report["cost_total"] == pytest.approx((2000 * 1.0 + 300 * 10.0) / 1e6)
    _, unpriced, _ = node()
    assert unpriced.report()["cost_total"] is None


def test_breaker_states_are_counted_per_peer() -> None:
    metrics, stats, _ = node()
    metrics.breaker_states("bureau", {"http://a": "closed", "http://b": "open"})
    assert stats.report()["breakers"] == [
        {"peer": "bureau", "closed": 1, "half_open": 0, "open": 1}
    ]


def test_quantile_interpolates_within_a_bucket() -> None:
    le = [0.1, 1.0]
    assert quantile(0.5, le, [0, 0, 0]) is None
    assert quantile(0.5, le, [10, 10, 10]) == pytest.approx(0.05)
    assert quantile(0.95, le, [0, 0, 4]) == 1.0  # past the last bound: that bound


def test_model_prices_come_from_the_environment() -> None:
    env = {"MESH_MODEL_PRICES": "gemini-2.5-flash=0.30/2.50, scripted=0/0"}
    prices = NodeSettings.from_env(env, agent_name="a").models.prices
    assert prices == {"gemini-2.5-flash": (0.30, 2.50), "scripted": (0.0, 0.0)}
    assert NodeSettings.from_env({}, agent_name="a").models.prices == {}


@pytest.mark.parametrize("value", ["gemini", "gemini=1", "=1/2", "m=-1/2", "m=1/nan"])
def test_a_price_that_is_not_one_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="MESH_MODEL_PRICES") as caught:
        NodeSettings.from_env({"MESH_MODEL_PRICES": value}, agent_name="a")
    assert "MODEL=INPUT/OUTPUT" in str(caught.value)
