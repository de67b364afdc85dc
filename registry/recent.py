"""An agent's recent tasks, for its page: state, skill, caller, duration, and its trace.

Asked only while the agent's page is open (the page asks; nothing is gathered in the
background): ``ListTasks`` on each instance ``registry.reach`` lets the registry ask
(``mesh._cli.tasks.list_tasks_at``, newest first, ``LIMIT`` per instance, no artifacts), each
within ``DEADLINE_S`` and ``MAX_ANSWER_BYTES``. A2A's task carries no start time, so a task's
duration comes from its node's row of its trace (``GET /v1/traces/{id}/tasks``, the path view's
source): one request per trace not seen before, kept once the task has ended (``_Durations``,
bounded), so an open page that refreshes every few seconds asks again only for tasks still
running. The whole answer is kept ``CACHE_S`` per agent: several open pages cost one listing.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from mesh._cli.tasks import Listed, Unreachable, list_tasks_at
from mesh._outbound import FetchFailed
from mesh._tracing import trace_id_of
from registry.paths import DEADLINE_S, MAX_NODE_BYTES, fetch_rows
from registry.reach import PARALLEL, VIEW_DEADLINE_S, Refusal
from registry.store import InstanceRecord

if TYPE_CHECKING:
    from registry.state import RegistryState

__all__ = ["CACHE_S", "LIMIT", "Recent", "RecentTask", "RecentTasks"]

LIMIT = 10
CACHE_S = 2.0
MAX_ANSWER_BYTES = MAX_NODE_BYTES
# Ended tasks' (start, end) kept at most.
_KEEP = 2048
# Agents whose last listing is kept at most.
_AGENTS = 256
_ENDED = frozenset({"completed", "failed", "canceled", "rejected"})


@dataclass(frozen=True)
class RecentTask:
    listed: Listed
    trace_id: str
    instance_id: str
    started_at: float | None
    ended_at: float | None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0.0, self.ended_at - self.started_at)

    @property
    def skill(self) -> str:
        return str(self.listed.task.metadata.get("skill") or "")

    def as_dict(self) -> dict[str, Any]:
        t = self.listed.task
        return {
            "task_id": t.task_id,
            "state": t.state,
            "skill": self.skill,
            "caller": self.listed.caller,
            "trace_id": self.trace_id,
            "instance_id": self.instance_id,
            "updated_at": t.updated_at,
            "duration_s": self.duration_s,
        }


@dataclass
class Recent:
    tasks: list[RecentTask] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    unreachable: list[Unreachable] = field(default_factory=list)
    asked: int = 0
    at: float = 0.0


class _Durations:
    """(start, end) of ended tasks by (url, task id), the oldest forgotten past ``_KEEP``."""

    def __init__(self) -> None:
        self._known: OrderedDict[tuple[str, str], tuple[float | None, float | None]] = OrderedDict()

    def get(self, key: tuple[str, str]) -> tuple[float | None, float | None] | None:
        return self._known.get(key)

    def keep(self, key: tuple[str, str], value: tuple[float | None, float | None]) -> None:
        self._known[key] = value
        while len(self._known) > _KEEP:
            self._known.popitem(last=False)


class RecentTasks:
    """The agents' recent tasks as last asked, and the durations of ended tasks (see the module
    docstring); one per registry (``RegistryState.recent``)."""

    def __init__(self) -> None:
        self._durations = _Durations()
        self._cache: OrderedDict[str, Recent] = OrderedDict()

    async def of(self, state: RegistryState, agent: str) -> Recent:
        """The agent's latest tasks across the instances the registry may ask, newest first."""
        now = time.time()
        cached = self._cache.get(agent)
        if cached is not None and now - cached.at < CACHE_S:
            return cached
        recent = await self._ask(state, agent, now)
        self._cache[agent] = recent
        self._cache.move_to_end(agent)
        while len(self._cache) > _AGENTS:
            self._cache.popitem(last=False)
        return recent

    async def _ask(self, state: RegistryState, agent: str, now: float) -> Recent:
        reach = state.reach
        found = [inst for inst, _ in await state.catalog.instances(agent=agent, status="any")]
        asked, refused = reach.split(found)
        by_url = {i.url.rstrip("/"): i for i in asked}
        listing = await list_tasks_at(
            reach.http,
            [(agent, url) for url in by_url],
            states=("",),  # every state
            limit=LIMIT,
            timeout_s=DEADLINE_S,
            headers=reach.headers,
            max_answer_bytes=MAX_ANSWER_BYTES,
            parallel=PARALLEL,
            deadline_s=VIEW_DEADLINE_S,
        )
        gate = asyncio.Semaphore(PARALLEL)

        async def timed(item: Listed) -> RecentTask:
            inst = by_url[item.url]
            trace = trace_id_of(str(item.task.metadata.get("traceparent") or "")) or ""
            key = (item.url, item.task.task_id)
            times = self._durations.get(key)
            if times is None and trace:
                async with gate:
                    times = await _times(state, inst, trace, item.task.task_id)
                if times is not None and item.task.state in _ENDED:
                    self._durations.keep(key, times)
            start, end = times or (None, None)
            return RecentTask(item, trace, inst.instance_id, start, end)

        tasks = list(await asyncio.gather(*(timed(t) for t in listing.tasks[:LIMIT])))
        return Recent(tasks, refused, listing.unreachable, len(asked), now)


async def _times(
    state: RegistryState, inst: InstanceRecord, trace_id: str, task_id: str
) -> tuple[float | None, float | None] | None:
    try:
        answer = await fetch_rows(state.reach, inst, trace_id)
    except (FetchFailed, ValidationError):  # a detail: a node that cannot say shows none
        return None
    for row in answer.tasks:
        if row.task_id == task_id:
            return row.started_at, row.ended_at
    return None
