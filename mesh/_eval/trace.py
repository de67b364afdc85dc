"""``fetch_trace``: what the mesh did for one case, from the mesh itself.

Every node answers ``GET /v1/traces/{trace_id}/tasks`` with its tasks of a trace
(``mesh._a2a.traces``); ``fetch_trace`` asks each instance it is given (every passing instance
the registry lists, and the case's own URL) and assembles ``Trace``: the tasks, linked through
``caller_task`` into a tree, and the steps (skills served, tools called) in time order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from mesh._a2a.metadata_keys import total_tokens, usage_counts
from mesh._a2a.traces import TraceAnswer, TraceTaskRow

if TYPE_CHECKING:
    import httpx

__all__ = ["PARALLEL", "Step", "Trace", "fetch_trace"]

#: Nodes asked at once.
PARALLEL = 8
_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Step:
    """One step of a trajectory: a ``skill`` served at ``agent`` (its request data as
    ``args``), or a ``tool`` called by a turn at ``agent``."""

    kind: Literal["skill", "tool"]
    agent: str
    name: str
    args: Any
    ok: bool | None
    at: float

    def describe(self) -> str:
        import json

        args = json.dumps(self.args, sort_keys=True, default=str)
        return f"{self.kind} {self.name} at {self.agent} with {args}"


@dataclass
class Trace:
    """The tasks of one trace across the mesh, and the nodes that could not be asked."""

    trace_id: str
    tasks: list[TraceTaskRow] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    truncated: bool = False

    @property
    def steps(self) -> list[Step]:
        """Skills served and tools called, in time order (a top task's skill included)."""
        steps: list[Step] = []
        for task in self.tasks:
            if task.skill:
                steps.append(
                    Step(
                        "skill",
                        task.agent,
                        task.skill,
                        task.input if isinstance(task.input, dict) else {"text": task.input},
                        task.state == "completed",
                        task.started_at or task.ended_at or 0.0,
                    )
                )
            for call in task.tool_calls:
                steps.append(Step("tool", task.agent, call.name, call.args, call.ok, call.at))
        return sorted(steps, key=lambda s: s.at)

    @property
    def delegations(self) -> int:
        """Tasks one agent of the mesh asked of another."""
        return sum(1 for t in self.tasks if t.caller_task)

    @property
    def total_tokens(self) -> int:
        """Model tokens over every hop (each task reports its own turn's)."""
        # A row of a node before the camelCase keys says total_tokens: usage_counts reads both.
        return sum(total_tokens(usage_counts(task.usage)) for task in self.tasks)

    def tree(self) -> list[tuple[int, TraceTaskRow]]:
        """(depth, task) in tree order: each task under the task of its caller."""
        ids = {t.task_id for t in self.tasks}
        children: dict[str, list[TraceTaskRow]] = {}
        roots: list[TraceTaskRow] = []
        for task in sorted(self.tasks, key=lambda t: t.started_at or 0.0):
            if task.caller_task and task.caller_task in ids:
                children.setdefault(task.caller_task, []).append(task)
            else:
                roots.append(task)
        out: list[tuple[int, TraceTaskRow]] = []

        def walk(task: TraceTaskRow, depth: int) -> None:
            out.append((depth, task))
            if depth < 32:  # a cycle cannot come from real tasks; bounded anyway
                for child in children.get(task.task_id, []):
                    walk(child, depth + 1)

        for root in roots:
            walk(root, 0)
        return out


async def _ask(http: httpx.AsyncClient, url: str, trace_id: str) -> TraceAnswer:
    response = await http.get(
        f"{url.rstrip('/')}/v1/traces/{trace_id}/tasks",
        params={"limit": "500"},
        timeout=_TIMEOUT_S,
    )
    if response.status_code != 200:
        detail = response.text[:200]
        raise ValueError(f"HTTP {response.status_code}: {detail}")
    return TraceAnswer.model_validate_json(response.content)


async def fetch_trace(http: httpx.AsyncClient, urls: Iterable[str], trace_id: str) -> Trace:
    """The trace's tasks on every node at ``urls`` (each URL once; the ``http`` client carries
    the mesh token). A node that does not answer is named in ``Trace.unreachable``."""
    trace = Trace(trace_id)
    gate = asyncio.Semaphore(PARALLEL)
    wanted = list(dict.fromkeys(u.rstrip("/") for u in urls))

    async def one(url: str) -> None:
        async with gate:
            try:
                answer = await _ask(http, url, trace_id)
            except (ValueError, ValidationError, OSError) as exc:
                trace.unreachable[url] = str(exc).splitlines()[0] if str(exc) else repr(exc)
                return
            except Exception as exc:  # httpx errors: the node is named, the case goes on
                trace.unreachable[url] = f"{type(exc).__name__}: {exc}"
                return
        trace.truncated = trace.truncated or answer.truncated
        trace.tasks.extend(answer.tasks)

    await asyncio.gather(*(one(u) for u in wanted))
    seen: set[tuple[str, str]] = set()
    unique = []
    for task in trace.tasks:
        if (task.agent, task.task_id) not in seen:
            seen.add((task.agent, task.task_id))
            unique.append(task)
    trace.tasks = sorted(unique, key=lambda t: t.started_at or t.ended_at or 0.0)
    return trace
