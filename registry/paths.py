"""One request's path: the tasks a request caused on every agent it touched, as a tree.

Assembled from the nodes' own records, not from a tracing system: every task keeps its
``traceparent``, and every mesh node answers ``GET /v1/traces/{trace_id}/tasks`` with its tasks
of a trace (``mesh._a2a.traces``). ``request_path`` asks every instance ``registry.reach`` lets it
ask (the mesh token only to those), at most ``PARALLEL`` at once, each answer within
``DEADLINE_S`` and ``MAX_NODE_BYTES`` (``bounded_get``), and links the rows into a tree through
``caller_task`` with the assembly ``mesh eval`` uses (``mesh._eval.trace.Trace.tree``).

A hop says which instance served it (the URL whose answer held the row: replicas sharing one
store all list the same tasks, so the first to answer is named), its duration, its tokens and
those of its subtree, and its attempt: a delegation retried at another instance is another task
of the same caller's task, agent and skill, so siblings of one (agent, skill) are attempts 1..n.

A task id resolves to its trace through the node that holds it: ``GetTask`` (the agent's
instances when it is named, else every instance the registry may ask), and the trace id of the
task's ``traceparent`` metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from mesh._a2a.client import A2APeer
from mesh._a2a.traces import TRACE_ID, TraceAnswer, TraceTaskRow
from mesh._errors import MeshError
from mesh._eval.trace import Trace
from mesh._outbound import FetchFailed, bounded_get
from mesh._tracing import trace_id_of
from registry.reach import PARALLEL, VIEW_DEADLINE_S, Reach, Refusal
from registry.store import InstanceRecord

if TYPE_CHECKING:
    from registry.state import RegistryState

__all__ = [
    "DEADLINE_S",
    "MAX_NODE_BYTES",
    "Hop",
    "RequestPath",
    "Tokens",
    "fetch_rows",
    "request_path",
    "trace_of_task",
]

#: One node's answer: the whole of it within this many seconds and bytes, else it is named as
#: not answering (the node's own cap is 1 MB too).
DEADLINE_S = 5.0
MAX_NODE_BYTES = 1_000_000
#: Tasks asked of each node (the route's maximum is 500).
_LIMIT = 200
# How an answer that did not come is said (FetchFailed's reason words).
_FAILED = {
    "unreachable": "unreachable",
    "timeout": f"no whole answer within {DEADLINE_S:g} s",
    "too_large": f"answer over {MAX_NODE_BYTES} bytes",
    "refused": "address outside the allowed networks",
    "tls": "TLS verification failed (its certificate is not from MESH_TLS_CA's CAs)",
}


def _count(usage: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


@dataclass(frozen=True)
class Tokens:
    """Model tokens, input and output."""

    input: int = 0
    output: int = 0

    @classmethod
    def of(cls, usage: Mapping[str, Any]) -> Tokens:
        # Both spellings: task metadata moves to camelCase (issue 14) while older nodes run.
        return cls(
            _count(usage, "inputTokens", "input_tokens"),
            _count(usage, "outputTokens", "output_tokens"),
        )

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.input + other.input, self.output + other.output)

    @property
    def total(self) -> int:
        return self.input + self.output


@dataclass
class Hop:
    """One task of the path, at ``depth`` under the task of its caller."""

    depth: int
    task: TraceTaskRow
    url: str
    instance_id: str
    attempt: int = 1
    attempts: int = 1
    tokens: Tokens = Tokens()
    #: This task's tokens and those of every task under it.
    rolled: Tokens = Tokens()

    @property
    def duration_s(self) -> float | None:
        t = self.task
        if t.started_at is None or t.ended_at is None:
            return None
        return max(0.0, t.ended_at - t.started_at)

    @property
    def error(self) -> str:
        """The error's message where the task failed ("" otherwise)."""
        if not self.task.error:
            return ""
        return str(self.task.error.get("message") or self.task.error.get("code") or "")

    def as_dict(self) -> dict[str, Any]:
        t = self.task
        return {
            "depth": self.depth,
            "agent": t.agent,
            "task_id": t.task_id,
            "caller": t.caller,
            "caller_task": t.caller_task,
            "skill": t.skill,
            "state": t.state,
            "started_at": t.started_at,
            "ended_at": t.ended_at,
            "duration_s": self.duration_s,
            "attempt": self.attempt,
            "attempts": self.attempts,
            "url": self.url,
            "instance_id": self.instance_id,
            "tokens": {"input": self.tokens.input, "output": self.tokens.output},
            "tokens_rolled": {"input": self.rolled.input, "output": self.rolled.output},
            "error": self.error,
            # Names only: their arguments are the node's (shown with its mesh token, not here).
            "tool_calls": [{"name": c.name, "ok": c.ok, "at": c.at} for c in t.tool_calls],
        }


@dataclass
class RequestPath:
    """What the mesh did for one trace, and which instances could not say."""

    trace_id: str
    hops: list[Hop] = field(default_factory=list)
    asked: int = 0
    refused: list[Refusal] = field(default_factory=list)
    #: url -> why it gave no answer.
    unreachable: dict[str, str] = field(default_factory=dict)
    truncated: bool = False

    @property
    def tokens(self) -> Tokens:
        total = Tokens()
        for hop in self.hops:
            total += hop.tokens
        return total

    @property
    def started_at(self) -> float | None:
        starts = [h.task.started_at for h in self.hops if h.task.started_at is not None]
        return min(starts) if starts else None

    @property
    def ended_at(self) -> float | None:
        ends = [h.task.ended_at for h in self.hops if h.task.ended_at is not None]
        return max(ends) if ends else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "hops": [h.as_dict() for h in self.hops],
            "tokens": {"input": self.tokens.input, "output": self.tokens.output},
            "asked": self.asked,
            "not_asked": [r.__dict__ for r in self.refused],
            "unreachable": self.unreachable,
            "truncated": self.truncated,
        }


def assemble(trace_id: str, answers: Iterable[tuple[InstanceRecord, TraceAnswer]]) -> RequestPath:
    """The tree of the rows the instances answered (each row once, named after the first
    instance that had it), with attempts and tokens (see the module docstring)."""
    served: dict[tuple[str, str], InstanceRecord] = {}
    rows: list[TraceTaskRow] = []
    path = RequestPath(trace_id)
    for inst, answer in answers:
        path.truncated = path.truncated or answer.truncated
        for row in answer.tasks:
            key = (row.agent, row.task_id)
            if key not in served:
                served[key] = inst
                rows.append(row)
    tree = Trace(trace_id, tasks=rows).tree()
    hops = []
    for depth, row in tree:
        inst = served[(row.agent, row.task_id)]
        hops.append(Hop(depth, row, inst.url, inst.instance_id, tokens=Tokens.of(row.usage or {})))
    # Attempts: the siblings of one caller's task at one agent and skill, in time order.
    groups: dict[tuple[str, str, str], list[Hop]] = {}
    for hop in hops:
        t = hop.task
        if t.caller_task:
            groups.setdefault((t.caller_task, t.agent, t.skill), []).append(hop)
    for group in groups.values():
        for n, hop in enumerate(group, start=1):
            hop.attempt, hop.attempts = n, len(group)
    # Rolled up: a hop's subtree is the hops after it until one at its depth or above.
    for i, hop in enumerate(hops):
        rolled = hop.tokens
        for below in hops[i + 1 :]:
            if below.depth <= hop.depth:
                break
            rolled += below.tokens
        hop.rolled = rolled
    path.hops = hops
    return path


async def fetch_rows(reach: Reach, inst: InstanceRecord, trace_id: str) -> TraceAnswer:
    """One instance's rows of ``trace_id`` (``FetchFailed`` or ``ValidationError`` else)."""
    answer = await bounded_get(
        reach.http,
        f"{inst.url.rstrip('/')}/v1/traces/{trace_id}/tasks?limit={_LIMIT}",
        max_bytes=MAX_NODE_BYTES,
        timeout_s=DEADLINE_S,
        headers=reach.headers,
    )
    if answer.status_code == 404:
        # Not a mesh node, or one that keeps no tasks: it has none of this trace.
        return TraceAnswer(trace_id=trace_id, agent=inst.agent, tasks=[])
    if answer.status_code != 200:
        why = " (the registry's MESH_TOKEN is not the node's)" if answer.status_code == 401 else ""
        raise FetchFailed("status", f"answered HTTP {answer.status_code}{why}")
    return TraceAnswer.model_validate_json(answer.content)


async def _live(state: RegistryState, agent: str | None = None) -> list[InstanceRecord]:
    return [inst for inst, _ in await state.catalog.instances(agent=agent, status="any")]


async def request_path(state: RegistryState, trace_id: str) -> RequestPath:
    """The path of ``trace_id`` (checked: ``TRACE_ID``) across every instance that may be
    asked (see the module docstring)."""
    if not TRACE_ID.match(trace_id):
        raise ValueError("a trace id is 32 lowercase hex digits (a traceparent's trace id)")
    reach = state.reach
    asked, refused = reach.split(await _live(state))
    gate = asyncio.Semaphore(PARALLEL)
    answers: list[tuple[InstanceRecord, TraceAnswer]] = []
    unreachable: dict[str, str] = {}

    async def one(inst: InstanceRecord) -> None:
        async with gate:
            try:
                answers.append((inst, await fetch_rows(reach, inst, trace_id)))
            except FetchFailed as exc:
                unreachable[inst.url] = _FAILED.get(exc.reason, exc.detail)
            except ValidationError as exc:
                unreachable[inst.url] = f"not a trace answer ({exc.error_count()} invalid fields)"

    jobs = {asyncio.ensure_future(one(i)): i for i in asked}
    if jobs:
        _, late = await asyncio.wait(jobs, timeout=VIEW_DEADLINE_S)
        for job in late:
            job.cancel()
            unreachable[jobs[job].url] = f"not asked within the view's {VIEW_DEADLINE_S:g} s"
        await asyncio.gather(*late, return_exceptions=True)
    # In the order the instances were listed, so a shared store's rows name the same one.
    order = {inst.instance_id: n for n, inst in enumerate(asked)}
    answers.sort(key=lambda a: order[a[0].instance_id])
    path = assemble(trace_id, answers)
    path.asked, path.refused, path.unreachable = len(asked), refused, unreachable
    return path


async def trace_of_task(
    state: RegistryState, task_id: str, *, agent: str | None = None
) -> tuple[str | None, list[Refusal]]:
    """The trace id of task ``task_id`` (None when no instance asked has it), found with
    ``GetTask`` at ``agent``'s instances (every agent's when None); and the instances refused."""
    reach = state.reach
    asked, refused = reach.split(await _live(state, agent))
    gate = asyncio.Semaphore(PARALLEL)

    async def one(inst: InstanceRecord) -> str | None:
        peer = A2APeer(reach.http, inst.url, headers=reach.headers, max_answer_bytes=MAX_NODE_BYTES)
        try:
            async with gate, asyncio.timeout(DEADLINE_S):
                task = await peer.find_task(task_id)
        except (MeshError, TimeoutError, ValueError):
            return None
        finally:
            await peer.aclose()
        if task is None:
            return None
        return trace_id_of(str(task.metadata.get("traceparent") or "")) or None

    try:
        async with asyncio.timeout(VIEW_DEADLINE_S):
            found = [t for t in await asyncio.gather(*(one(i) for i in asked)) if t]
    except TimeoutError:
        found = []
    return (found[0] if found else None), refused
