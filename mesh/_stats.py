"""``NodeStats``: a node's traffic over a recent window, what the registry's console shows.

The node serves it inside ``/health?stats=1``, the answer the registry's prober fetches anyway
(one request per instance per interval). Nothing is counted for it: ``NodeMetrics`` already
counts every task (by skill and outcome, with a duration histogram), every delegation (by peer,
skill and outcome, with a duration histogram), the model tokens and the breaker states. When
asked, ``report`` reads those cumulative series and keeps them as a snapshot (at most one per
``SNAPSHOT_EVERY_S``, only as many as the window needs); the window's figures are the
difference between now and the newest snapshot at least ``WINDOW_S`` old (the node's start
until one is). So the fast path pays nothing, and the memory is a few vectors per series: O(1)
per edge, with at most ``MAX_EDGES`` edges reported (the rest folded into one ``other`` edge,
like the breaker series). Percentiles are estimated from the histogram buckets (``quantile``,
linear within a bucket like Prometheus' ``histogram_quantile``).

    {"v": 1, "window_s": 61.2, "le": [0.005, ..., 300.0],
     "tasks": ROW, "skills": [{"skill", **ROW}], "edges": [{"peer", "skill", **ROW}],
     "tokens": [{"model", "input", "output", "input_total", "output_total"}],
     "cost": float | None, "cost_total": float | None,
     "breakers": [{"peer", "closed", "half_open", "open"}], "peers": [name], "in_flight": n}

    ROW = {"calls_total", "errors_total", "calls", "errors", "buckets"}

``calls``/``errors`` count the window, ``*_total`` since the node started; ``buckets`` are the
window's calls per upper bound of ``le`` (cumulative, one more for +Inf). An error is an outcome
other than completed/ok, canceled (the caller's choice) and waiting (not ended). Cost is in the
unit of the configured prices (``MESH_MODEL_PRICES``, per 1M tokens), over the priced models
only; ``None`` when no model with tokens has a price.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from mesh._metrics import DURATION_BUCKETS, OTHER, NodeMetrics

__all__ = ["MAX_EDGES", "SNAPSHOT_EVERY_S", "STATS_VERSION", "WINDOW_S", "NodeStats", "quantile"]

STATS_VERSION = 1
#: The recent window the rates and percentiles cover, seconds.
WINDOW_S = 60.0
#: Snapshots are kept at most this often (the window is WINDOW_S to WINDOW_S + this).
SNAPSHOT_EVERY_S = 5.0
#: Edges (peer, skill) reported; the rest are one ``other`` edge.
MAX_EDGES = 32

# Outcomes that are not errors: success, the caller's cancel, a task waiting for its caller.
_NOT_ERRORS = frozenset({"completed", "ok", "canceled", "waiting"})
_BREAKER_NAMES = {0: "closed", 1: "half_open", 2: "open"}

Key = tuple[str, ...]
Snapshot = dict[Key, list[float]]


def quantile(q: float, le: Sequence[float], buckets: Sequence[float]) -> float | None:
    """The ``q`` quantile (0..1) of observations counted in cumulative ``buckets`` (one per
    bound of ``le``, then +Inf); ``None`` without observations. Linear within the bucket it
    falls in; past the last finite bound, that bound."""
    total = buckets[-1] if buckets else 0
    if total <= 0:
        return None
    rank = q * total
    below, lower = 0.0, 0.0
    for bound, count in zip(le, buckets, strict=False):
        if count >= rank:
            span = count - below
            return lower + (bound - lower) * ((rank - below) / span if span else 1.0)
        below, lower = count, bound
    return float(le[-1]) if le else None


class NodeStats:
    """The window figures of the node counted by ``metrics`` (see the module docstring)."""

    def __init__(
        self,
        metrics: NodeMetrics,
        *,
        bounds: Sequence[float] = DURATION_BUCKETS,
        prices: Mapping[str, tuple[float, float]] | None = None,
        window_s: float = WINDOW_S,
        every_s: float = SNAPSHOT_EVERY_S,
        max_edges: int = MAX_EDGES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._le = [float(b) for b in bounds]
        self._slot = {b: i for i, b in enumerate(self._le)} | {math.inf: len(self._le)}
        self._prices = dict(prices or {})
        self._window_s = window_s
        self._every_s = every_s
        self._max_edges = max_edges
        self._clock = clock
        # Everything is zero when the node starts: the first window counts from there.
        self._snapshots: deque[tuple[float, Snapshot]] = deque([(clock(), {})])

    # -- reading the metrics ------------------------------------------------------------------
    def _row(self, snap: Snapshot, key: Key) -> list[float]:
        row = snap.get(key)
        if row is None:
            row = snap[key] = [0.0] * (3 + len(self._le))
        return row

    def _outcomes(self, snap: Snapshot, counter: Any, kind: str, labels: Sequence[str]) -> None:
        for metric in counter.collect():
            for s in metric.samples:
                if not s.name.endswith("_total") or s.labels.get("outcome") == "waiting":
                    continue
                row = self._row(snap, (kind, *(s.labels[n] for n in labels)))
                row[0] += s.value
                if s.labels.get("outcome") not in _NOT_ERRORS:
                    row[1] += s.value

    def _buckets(self, snap: Snapshot, histogram: Any, kind: str, labels: Sequence[str]) -> None:
        for metric in histogram.collect():
            for s in metric.samples:
                if not s.name.endswith("_bucket"):
                    continue
                slot = self._slot.get(float(s.labels["le"]))
                if slot is not None:
                    row = self._row(snap, (kind, *(s.labels[n] for n in labels)))
                    row[2 + slot] = s.value

    def _read(self) -> Snapshot:
        m = self._metrics
        snap: Snapshot = {}
        self._outcomes(snap, m.tasks, "skill", ("skill",))
        self._buckets(snap, m.task_duration, "skill", ("skill",))
        self._outcomes(snap, m.delegations, "edge", ("peer", "skill"))
        self._buckets(snap, m.delegation_duration, "edge", ("peer", "skill"))
        for metric in m.tokens.collect():
            for s in metric.samples:
                kind = s.labels.get("kind")
                if s.name.endswith("_total") and kind in ("input", "output"):
                    row = snap.setdefault(("tokens", s.labels["model"]), [0.0, 0.0])
                    row[0 if kind == "input" else 1] += s.value
        return snap

    # -- the report -----------------------------------------------------------------------------
    def _base(self, now: float) -> tuple[float, Snapshot]:
        """The snapshot the window starts at; keeps only the snapshots a later window needs."""
        snaps = self._snapshots
        while len(snaps) > 1 and snaps[1][0] <= now - self._window_s:
            snaps.popleft()
        return snaps[0]

    def report(self, *, peers: Iterable[str] = (), in_flight: int = 0) -> dict[str, Any]:
        """The stats document (module docstring); ``peers``: the agents this node may call."""
        now = self._clock()
        current = self._read()
        since, base = self._base(now)
        if now - self._snapshots[-1][0] >= self._every_s:
            self._snapshots.append((now, current))

        def row(key: Key) -> dict[str, Any]:
            cur, old = current[key], base.get(key)
            win = cur if old is None else [c - o for c, o in zip(cur, old, strict=True)]
            return {
                "calls_total": int(cur[0]),
                "errors_total": int(cur[1]),
                "calls": int(win[0]),
                "errors": int(win[1]),
                "buckets": [int(v) for v in win[2:]],
            }

        skills = [{"skill": k[1], **row(k)} for k in current if k[0] == "skill"]
        edges = [{"peer": k[1], "skill": k[2], **row(k)} for k in current if k[0] == "edge"]
        return {
            "v": STATS_VERSION,
            "window_s": round(now - since, 3),
            "le": self._le,
            "tasks": _fold(skills, {}, len(self._le) + 1),
            "skills": skills,
            "edges": self._bounded(edges),
            **self._tokens(current, base),
            "breakers": self._breakers(),
            "peers": sorted(set(peers)),
            "in_flight": in_flight,
        }

    def _bounded(self, edges: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(edges) <= self._max_edges:
            return edges
        edges.sort(key=lambda e: (e["calls"], e["calls_total"]), reverse=True)
        kept, rest = edges[: self._max_edges], edges[self._max_edges :]
        return [*kept, _fold(rest, {"peer": OTHER, "skill": OTHER}, len(self._le) + 1)]

    def _tokens(self, current: Snapshot, base: Snapshot) -> dict[str, Any]:
        tokens = []
        cost: float | None = None
        cost_total: float | None = None
        for key, values in current.items():
            if key[0] != "tokens":
                continue
            inp, out = values
            old_in, old_out = base.get(key, (0.0, 0.0))
            model = key[1]
            tokens.append(
                {
                    "model": model,
                    "input": int(inp - old_in),
                    "output": int(out - old_out),
                    "input_total": int(inp),
                    "output_total": int(out),
                }
            )
            price = self._prices.get(model)
            if price is not None:
                p_in, p_out = price
                cost = (cost or 0.0) + ((inp - old_in) * p_in + (out - old_out) * p_out) / 1e6
                cost_total = (cost_total or 0.0) + (inp * p_in + out * p_out) / 1e6
        return {"tokens": tokens, "cost": cost, "cost_total": cost_total}

    def _breakers(self) -> list[dict[str, Any]]:
        by_peer: dict[str, dict[str, Any]] = {}
        for metric in self._metrics.circuit_breaker.collect():
            for s in metric.samples:
                peer = s.labels["peer"]
                counts = by_peer.setdefault(
                    peer, {"peer": peer, "closed": 0, "half_open": 0, "open": 0}
                )
                counts[_BREAKER_NAMES.get(int(s.value), "open")] += 1
        return list(by_peer.values())


def _fold(rows: Sequence[Mapping[str, Any]], head: dict[str, Any], width: int) -> dict[str, Any]:
    """``rows`` summed into one (``head`` holds its labels; ``width`` buckets)."""
    total = {**head, "calls_total": 0, "errors_total": 0, "calls": 0, "errors": 0}
    buckets = [0] * width
    for r in rows:
        for name in ("calls_total", "errors_total", "calls", "errors"):
            total[name] += r[name]
        for i, v in enumerate(r["buckets"]):
            buckets[i] += v
    total["buckets"] = buckets
    return total
