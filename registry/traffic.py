"""``Traffic``: what the instances said about their own traffic, as the prober last heard it.

A mesh node answers the prober's ``/health?stats=1`` with its window stats (``mesh._stats``):
tasks and delegation edges (calls, errors, duration buckets), tokens and cost, breaker counts,
the peers it may call. The prober hands each answer here (``observe``); nothing else is fetched.
An answer is a process boundary: it is validated (``NodeStatsIn``, every list and string
bounded) and one that does not validate is dropped and counted, never shown half. Memory is one
answer per instance (the last), dropped with the instance (``keep``).

Restarts are what the registry saw: the same URL answering with another ``pid`` or
``instance_id`` than the last time (since the registry started).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mesh._stats import WINDOW_S, quantile
from registry.store import InstanceRecord

__all__ = ["Instance", "NodeStatsIn", "RowIn", "Traffic", "Window"]

_Name = Annotated[str, Field(max_length=200)]
_Count = Annotated[int, Field(ge=0)]


class _In(BaseModel):
    # Fields a newer node adds are ignored; the ones read here must be right.
    model_config = ConfigDict(extra="ignore", frozen=True)


class RowIn(_In):
    calls_total: _Count = 0
    errors_total: _Count = 0
    calls: _Count = 0
    errors: _Count = 0
    buckets: Annotated[list[_Count], Field(max_length=64)] = []


class SkillRowIn(RowIn):
    skill: _Name


class EdgeIn(RowIn):
    peer: _Name
    skill: _Name


class TokensIn(_In):
    model: _Name
    input: _Count = 0
    output: _Count = 0
    input_total: _Count = 0
    output_total: _Count = 0


class BreakersIn(_In):
    peer: _Name
    closed: _Count = 0
    half_open: _Count = 0
    open: _Count = 0


class NodeStatsIn(_In):
    """``/health?stats=1``'s ``stats`` (``mesh._stats``, version 1)."""

    v: int
    window_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    le: Annotated[list[Annotated[float, Field(allow_inf_nan=False)]], Field(max_length=63)]
    tasks: RowIn = RowIn()
    skills: Annotated[list[SkillRowIn], Field(max_length=256)] = []
    edges: Annotated[list[EdgeIn], Field(max_length=64)] = []
    tokens: Annotated[list[TokensIn], Field(max_length=64)] = []
    cost: Annotated[float | None, Field(ge=0, allow_inf_nan=False)] = None
    cost_total: Annotated[float | None, Field(ge=0, allow_inf_nan=False)] = None
    breakers: Annotated[list[BreakersIn], Field(max_length=256)] = []
    peers: Annotated[list[_Name], Field(max_length=256)] = []
    in_flight: _Count = 0


@dataclass
class Instance:
    """The last word of one instance: who answered, when, and its stats (if it sends any)."""

    instance_id: str
    url: str
    pid: int | None = None
    uptime_s: float | None = None
    stats: NodeStatsIn | None = None
    heard_at: float = 0.0
    restarts: int = 0


@dataclass
class Window:
    """Rows of several instances summed: the window's calls, rate, errors and percentiles."""

    calls_total: int = 0
    errors_total: int = 0
    calls: int = 0
    errors: int = 0
    per_min: float = 0.0
    le: Sequence[float] = ()
    buckets: list[int] = field(default_factory=list)

    def add(self, row: RowIn, window_s: float, le: Sequence[float]) -> None:
        self.calls_total += row.calls_total
        self.errors_total += row.errors_total
        self.calls += row.calls
        self.errors += row.errors
        # A just-started node's window is short: counted as a whole window (its calls so
        # far), never extrapolated (three calls in two seconds are not 90 a minute).
        self.per_min += row.calls / max(window_s, WINDOW_S) * 60.0
        if len(row.buckets) != len(le) + 1:
            return
        if not self.buckets:
            self.le, self.buckets = le, list(row.buckets)
        elif list(le) == list(self.le):  # another bucket layout cannot be merged: left out
            self.buckets = [a + b for a, b in zip(self.buckets, row.buckets, strict=True)]

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.calls if self.calls else None

    def percentile(self, q: float) -> float | None:
        return quantile(q, self.le, self.buckets) if self.buckets else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls_total": self.calls_total,
            "errors_total": self.errors_total,
            "calls": self.calls,
            "errors": self.errors,
            "per_min": round(self.per_min, 2),
            "error_rate": None if self.error_rate is None else round(self.error_rate, 4),
            "p50_s": _round(self.percentile(0.5)),
            "p95_s": _round(self.percentile(0.95)),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class Traffic:
    """The last answer of every instance (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._by_id: dict[str, Instance] = {}
        # url -> (pid, instance_id) last heard there, and the restarts seen at that URL.
        self._at_url: dict[str, tuple[int | None, str, int]] = {}
        self.answers = 0
        self.with_stats = 0
        self.unreadable = 0
        self.last_unreadable = ""

    def observe(self, inst: InstanceRecord, health: dict[str, Any] | None) -> None:
        """``inst`` answered its probe with ``health`` (parsed JSON; None: not a JSON object)."""
        self.answers += 1
        now = self._clock()
        seen = self._by_id.get(inst.instance_id) or Instance(inst.instance_id, inst.url)
        seen.heard_at = now
        health = health or {}
        pid = health.get("pid")
        seen.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        uptime = health.get("uptime_s")
        seen.uptime_s = float(uptime) if isinstance(uptime, int | float) else None
        before = self._at_url.get(inst.url)
        restarts = before[2] if before else 0
        if before is not None and (before[0], before[1]) != (seen.pid, inst.instance_id):
            restarts += 1
        self._at_url[inst.url] = (seen.pid, inst.instance_id, restarts)
        seen.restarts = restarts
        raw = health.get("stats")
        seen.stats = None
        if raw is not None:
            try:
                seen.stats = NodeStatsIn.model_validate(raw)
                self.with_stats += 1
            except ValidationError as exc:
                self.unreadable += 1
                # For the registry's /introspect: where, never the value (it is the node's).
                self.last_unreadable = f"{inst.url}: {exc.error_count()} invalid field(s)"
        self._by_id[inst.instance_id] = seen

    def keep(self, instances: Iterable[InstanceRecord]) -> None:
        """Forget every instance (and URL) not in ``instances``: the store removed it."""
        live = list(instances)
        ids = {i.instance_id for i in live}
        urls = {i.url for i in live}
        for gone in self._by_id.keys() - ids:
            del self._by_id[gone]
        for gone in self._at_url.keys() - urls:
            del self._at_url[gone]

    def get(self, instance_id: str) -> Instance | None:
        return self._by_id.get(instance_id)

    def state(self) -> dict[str, Any]:
        """For the registry's /introspect."""
        now = self._clock()
        heard = [i.heard_at for i in self._by_id.values()]
        return {
            "instances_heard": len(self._by_id),
            "instances_with_stats": sum(1 for i in self._by_id.values() if i.stats),
            "answers": self.answers,
            "answers_with_stats": self.with_stats,
            "unreadable_stats": self.unreadable,
            "last_unreadable": self.last_unreadable or None,
            "oldest_answer_age_s": round(now - min(heard), 3) if heard else None,
        }
