"""``Topology``: the agents and the delegation edges used between them, with their traffic.

Built on each read from the catalog (every registered agent and its instances, so an agent
never called is there too) and ``Traffic`` (each live instance's last stats): per agent, its
tasks (calls, rate, errors, p50/p95 over the nodes' recent window), tokens and cost, breakers,
peers and instances; per edge (caller -> callee, per skill) the same figures summed over the
caller's instances. A registered peer an agent may call but has not yet is an edge without
calls (``used: false``); a callee that is not registered is drawn too, up to
``MAX_UNREGISTERED`` of them. Instances that are critical count for nothing: what they said last is stale.

``layout`` places it for the page: a deterministic layered layout (each agent one column right
of the furthest agent calling it, cycles cut), rendered as inline SVG by the template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from registry.catalog import AgentView
from registry.traffic import Traffic, Window

__all__ = [
    "BOX_H",
    "BOX_W",
    "MAX_UNREGISTERED",
    "AgentLive",
    "Edge",
    "Graph",
    "InstanceLive",
    "Topology",
    "layout",
]


@dataclass
class InstanceLive:
    instance_id: str
    url: str
    status: str
    pid: int | None
    uptime_s: float | None
    restarts: int
    in_flight: int | None
    stats: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AgentLive:
    """One agent, live: what its live instances report, summed."""

    name: str
    registered: bool
    up: int = 0
    total: int = 0
    tasks: Window = field(default_factory=Window)
    skills: dict[str, Window] = field(default_factory=dict)
    tokens: dict[str, dict[str, int]] = field(default_factory=dict)
    cost: float | None = None
    cost_total: float | None = None
    breakers: dict[str, dict[str, int]] = field(default_factory=dict)
    peers: set[str] = field(default_factory=set)
    in_flight: int = 0
    instances: list[InstanceLive] = field(default_factory=list)

    @property
    def priced(self) -> bool:
        return self.cost_total is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "registered": self.registered,
            "instances_up": self.up,
            "instances_total": self.total,
            "tasks": self.tasks.as_dict(),
            "skills": {k: v.as_dict() for k, v in sorted(self.skills.items())},
            "tokens": [{"model": m, **t} for m, t in sorted(self.tokens.items())],
            "cost": _cents(self.cost),
            "cost_total": _cents(self.cost_total),
            "breakers": [{"peer": p, **b} for p, b in sorted(self.breakers.items())],
            "peers": sorted(self.peers),
            "in_flight": self.in_flight,
            "instances": [i.as_dict() for i in self.instances],
        }


@dataclass
class Edge:
    """Calls from ``caller`` to ``callee``'s skill ``skill`` (None: declared, never called)."""

    caller: str
    callee: str
    skill: str | None
    window: Window = field(default_factory=Window)

    @property
    def used(self) -> bool:
        return self.window.calls_total > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "caller": self.caller,
            "callee": self.callee,
            "skill": self.skill,
            "used": self.used,
            **self.window.as_dict(),
        }


def _cents(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _add(total: float | None, value: float | None) -> float | None:
    return total if value is None else (total or 0.0) + value


#: Callees drawn that are not registered (names the callers' stats give); edges to more are
#: left out and counted (``hidden_edges``), so no node can flood the page with made-up peers.
MAX_UNREGISTERED = 32


@dataclass
class Topology:
    agents: dict[str, AgentLive]
    edges: list[Edge]
    hidden_edges: int = 0

    @classmethod
    def build(cls, views: Sequence[AgentView], traffic: Traffic) -> Topology:
        agents = {v.agent.name: AgentLive(v.agent.name, registered=True) for v in views}
        edges: dict[tuple[str, str, str], Edge] = {}
        for view in views:
            live = agents[view.agent.name]
            live.total, live.up = len(view.instances), view.passing
            for inst in view.instances:
                heard = traffic.get(inst.instance_id)
                stats = heard.stats if heard is not None else None
                live.instances.append(
                    InstanceLive(
                        inst.instance_id,
                        inst.url,
                        inst.status,
                        heard.pid if heard else None,
                        heard.uptime_s if heard else None,
                        heard.restarts if heard else 0,
                        stats.in_flight if stats else None,
                        stats is not None,
                    )
                )
                if stats is None or inst.status == "critical":
                    continue
                w, le = stats.window_s, stats.le
                live.tasks.add(stats.tasks, w, le)
                for s in stats.skills:
                    live.skills.setdefault(s.skill, Window()).add(s, w, le)
                for t in stats.tokens:
                    sums = live.tokens.setdefault(
                        t.model, {"input": 0, "output": 0, "input_total": 0, "output_total": 0}
                    )
                    for key in sums:
                        sums[key] += getattr(t, key)
                live.cost = _add(live.cost, stats.cost)
                live.cost_total = _add(live.cost_total, stats.cost_total)
                for b in stats.breakers:
                    counts = live.breakers.setdefault(
                        b.peer, {"closed": 0, "half_open": 0, "open": 0}
                    )
                    for key in counts:
                        counts[key] += getattr(b, key)
                live.peers.update(stats.peers)
                live.in_flight += stats.in_flight
                for e in stats.edges:
                    labels = (live.name, e.peer, e.skill)
                    edges.setdefault(labels, Edge(*labels)).window.add(e, w, le)
        used = {(e.caller, e.callee) for e in edges.values()}
        for live in list(agents.values()):
            for peer in live.peers:
                # Declared peers are names a node chose: only registered ones are drawn.
                if (live.name, peer) not in used and peer in agents:
                    edges[(live.name, peer, "")] = Edge(live.name, peer, None)
        ordered = sorted(edges.values(), key=lambda e: (e.caller, e.callee, e.skill or ""))
        kept, hidden, unregistered = [], 0, 0
        for edge in ordered:
            if edge.callee not in agents:  # called, but not registered (now)
                if unregistered >= MAX_UNREGISTERED:
                    hidden += 1
                    continue
                agents[edge.callee] = AgentLive(edge.callee, registered=False)
                unregistered += 1
            kept.append(edge)
        return cls(dict(sorted(agents.items())), kept, hidden)

    def as_dict(self) -> dict[str, Any]:
        return {
            "agents": [a.as_dict() for a in self.agents.values()],
            "edges": [e.as_dict() for e in self.edges],
            "hidden_edges": self.hidden_edges,
        }

    def edges_of(self, name: str) -> tuple[list[Edge], list[Edge]]:
        """(calls ``name`` makes, calls ``name`` gets)."""
        return (
            [e for e in self.edges if e.caller == name],
            [e for e in self.edges if e.callee == name],
        )


# -- layout -------------------------------------------------------------------------------------
BOX_W, BOX_H = 200, 66
COL_GAP, ROW_GAP, MARGIN = 220, 34, 16


@dataclass
class Box:
    agent: AgentLive
    x: int
    y: int


@dataclass
class Arrow:
    caller: str
    callee: str
    path: str
    label_x: int
    label_y: int
    edges: list[Edge]

    @property
    def used(self) -> bool:
        return any(e.used for e in self.edges)

    @property
    def health(self) -> str:
        errors = sum(e.window.errors for e in self.edges)
        return "idle" if not self.used else "bad" if errors else "ok"


@dataclass
class Graph:
    width: int
    height: int
    boxes: list[Box]
    arrows: list[Arrow]


def _layers(topology: Topology) -> dict[str, int]:
    """Each agent's column: one right of the furthest agent calling it; a cycle is cut after
    as many passes as there are agents (every column stays below that count)."""
    names = list(topology.agents)
    layer = dict.fromkeys(names, 0)
    pairs = {(e.caller, e.callee) for e in topology.edges if e.caller != e.callee}
    for _ in range(len(names)):
        changed = False
        for caller, callee in sorted(pairs):
            want = min(layer[caller] + 1, len(names) - 1)
            if layer[callee] < want:
                layer[callee], changed = want, True
        if not changed:
            break
    return layer


def layout(topology: Topology) -> Graph:
    """Where each agent's box and each (caller, callee) arrow go; the same input, the same
    picture."""
    layer = _layers(topology)
    columns: dict[int, list[str]] = {}
    linked = {e.caller for e in topology.edges} | {e.callee for e in topology.edges}
    # By name, agents without any edge last: rows are stable and the arrows short.
    for name in sorted(topology.agents, key=lambda n: (n not in linked, n)):
        columns.setdefault(layer[name], []).append(name)
    at: dict[str, tuple[int, int]] = {}
    boxes = []
    for col, names in sorted(columns.items()):
        for row, name in enumerate(names):
            x = MARGIN + col * (BOX_W + COL_GAP)
            y = MARGIN + row * (BOX_H + ROW_GAP)
            at[name] = (x, y)
            boxes.append(Box(topology.agents[name], x, y))
    grouped: dict[tuple[str, str], list[Edge]] = {}
    for e in topology.edges:
        grouped.setdefault((e.caller, e.callee), []).append(e)
    arrows = []
    for (caller, callee), group in grouped.items():
        (x1, y1), (x2, y2) = at[caller], at[callee]
        if caller == callee:  # a loop on the box's right side
            sx, sy = x1 + BOX_W, y1 + BOX_H // 3
            path = f"M{sx},{sy} C{sx + 60},{sy - 40} {sx + 60},{sy + 60} {sx},{sy + BOX_H // 3}"
            lx, ly = sx + 48, sy + BOX_H // 2
        elif layer[callee] > layer[caller]:
            sx, sy, ex, ey = x1 + BOX_W, y1 + BOX_H // 2, x2, y2 + BOX_H // 2
            bend = (ex - sx) // 2
            path = f"M{sx},{sy} C{sx + bend},{sy} {ex - bend},{ey} {ex},{ey}"
            lx, ly = (sx + ex) // 2, (sy + ey) // 2
        else:  # a call back to an earlier column: under the boxes
            sx, sy, ex, ey = x1 + BOX_W // 2, y1 + BOX_H, x2 + BOX_W // 2, y2 + BOX_H
            low = max(sy, ey) + ROW_GAP
            path = f"M{sx},{sy} C{sx},{low} {ex},{low} {ex},{ey}"
            lx, ly = (sx + ex) // 2, low
        arrows.append(Arrow(caller, callee, path, lx, ly, group))
    rows = max((len(n) for n in columns.values()), default=1)
    width = MARGIN * 2 + len(columns) * BOX_W + max(len(columns) - 1, 0) * COL_GAP + 80
    height = MARGIN * 2 + rows * (BOX_H + ROW_GAP) + 40
    return Graph(width, height, boxes, arrows)
