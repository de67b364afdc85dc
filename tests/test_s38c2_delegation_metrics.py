"""``NodeMetrics.delegation`` counts a call and observes its duration, with the series looked
up while the peer works (``delegation_series``) or not: the same exposition as the labelled
children's own ``inc()`` and ``observe()`` give, for every outcome, duration (on a bucket's
bound, between, past the last, zero, negative, infinite, NaN) and series given or not, in any
order. (Session 38 measured going around those methods through prometheus_client's private
parts: ~3 k instructions a delegation, not kept: the package's range is open.)"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from mesh._metrics import DURATION_BUCKETS, NodeMetrics

OUTCOMES = ["ok", "failed", "unavailable", "deadline", "rejected", "canceled", "waiting"]
seconds = st.one_of(
    st.sampled_from([*DURATION_BUCKETS, 0.0, -0.0, -1.0, math.inf, -math.inf, math.nan]),
    st.floats(min_value=0, max_value=400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=0, max_value=500),
)
calls = st.lists(
    st.tuples(
        st.sampled_from(["bureau", "verifier"]),
        st.sampled_from(["score", "check"]),
        st.sampled_from(OUTCOMES),
        seconds,
        st.booleans(),  # the series looked up first (as a call's line does while it waits)
    ),
    max_size=30,
)


def _exposition(registry: CollectorRegistry) -> list[str]:
    # Without the creation times (each series' own clock reading) and the process's series.
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if "_created" not in line and "mesh_delegation" in line
    ]


def _reference(metrics: NodeMetrics, peer: str, skill: str, outcome: str, value: float) -> None:
    """``delegation`` as it was (d67a51c): the children's own methods."""
    metrics.delegations.labels(metrics.agent, peer, skill, outcome).inc()
    metrics.delegation_duration.labels(metrics.agent, peer, skill).observe(value)


@settings(max_examples=200, deadline=None)
@given(calls)
def test_the_same_exposition_as_the_series_methods(
    sequence: list[tuple[str, str, str, float, bool]],
) -> None:
    fast_registry, slow_registry = CollectorRegistry(), CollectorRegistry()
    fast = NodeMetrics(fast_registry, "coordinator")
    slow = NodeMetrics(slow_registry, "coordinator")
    for peer, skill, outcome, value, looked_up in sequence:
        series = fast.delegation_series(peer, skill) if looked_up else None
        fast.delegation(peer, skill, outcome, value, series)
        _reference(slow, peer, skill, outcome, value)
    assert _exposition(fast_registry) == _exposition(slow_registry)


def test_a_nan_duration_counts_in_no_bucket_as_observe() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, "coordinator")
    metrics.delegation("bureau", "score", "ok", 0.001)
    metrics.delegation(
        "bureau", "score", "ok", math.nan, metrics.delegation_series("bureau", "score")
    )
    child = metrics.delegation_duration.labels("coordinator", "bureau", "score")
    buckets = {
        s.labels["le"]: s.value
        for s in next(iter(child.collect())).samples
        if s.name.endswith("_bucket")
    }
    assert buckets["0.005"] == 1.0
    assert buckets["+Inf"] == 1.0
    assert metrics.delegations.labels("coordinator", "bureau", "score", "ok")._value.get() == 2.0
