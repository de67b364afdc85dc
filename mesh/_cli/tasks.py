"""``mesh tasks``: the tasks of the mesh's agents (``--waiting``: those that wait for an answer,
which ``mesh reply`` gives: mesh._cli.reply), found through the registry like ``mesh ls``.

mesh tasks --waiting                      # every task that waits for an answer, across the mesh
mesh tasks loan-officer --state working   # one agent's running tasks

Any A2A agent's tasks are listed (``ListTasks`` on every passing instance); a mesh node's task
metadata adds the skill, the calling agent and ``callerTask``, the task of its caller: a task
whose caller's task is listed too is a hop of a chain and is folded under the topmost one unless
``--all`` (answer at the top: the answer goes down the chain).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from mesh._a2a.metadata_keys import CALLER_TASK, read
from mesh._asks import Question
from mesh._cli.question import WAITING_STATES, asker_of, first_line, questions_of
from mesh._cli.serve import Lookup, lookup_location
from mesh._cli.table import format_table
from mesh._errors import MeshError
from mesh._settings import DEFAULT_REGISTRY_URL

if TYPE_CHECKING:
    import httpx

    from mesh._a2a.client import A2APeer
    from mesh._a2a.results import TaskResult

__all__ = [
    "PARALLEL",
    "Listed",
    "Listing",
    "Unreachable",
    "add_parsers",
    "chains",
    "failure",
    "instances",
    "list_tasks",
    "list_tasks_at",
    "registry_flag",
    "task_client",
]

#: Every state a task can be listed in, as ``mesh tasks --state`` takes it.
STATES = (
    "submitted",
    "working",
    "input-required",
    "auth-required",
    "completed",
    "failed",
    "canceled",
    "rejected",
)
#: What ``mesh tasks`` lists without ``--state``/``--waiting``: the tasks that have not ended.
ACTIVE_STATES = ("submitted", "working", "input-required", "auth-required")
#: ``--waiting``.
WAITING = ("input-required", "auth-required")
_PAGE = 100
#: Instances asked at once: a mesh of many agents is not asked all at the same moment.
PARALLEL = 8
_QUESTION_WIDTH = 60


@dataclass(frozen=True)
class Listed:
    """A task as ``mesh tasks`` found it: at which agent (and instance URL)."""

    agent: str
    url: str
    task: TaskResult

    @property
    def caller(self) -> str:
        return str(self.task.metadata.get("caller") or "")

    @property
    def caller_task(self) -> str:
        return str(read(self.task.metadata, CALLER_TASK) or "")

    @property
    def questions(self) -> list[Question]:
        return questions_of(self.task)

    def as_json(self, now: float) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "url": self.url,
            "task_id": self.task.task_id,
            "context_id": self.task.context_id,
            "state": self.task.state,
            "updated_at": self.task.updated_at,
            "age_s": _age_s(self.task.updated_at, now),
            "skill": str(self.task.metadata.get("skill") or ""),
            "caller": self.caller,
            "caller_task": self.caller_task,
            "questions": [
                {
                    "id": q.id,
                    "kind": q.kind,
                    "text": q.text,
                    "schema": q.schema,
                    "asker": asker_of(q),
                    "asker_task": (q.asker or {}).get("task", ""),
                    "invalid": list(q.invalid),
                }
                for q in self.questions
            ],
        }


@dataclass(frozen=True)
class Unreachable:
    """An instance that did not answer, and why."""

    agent: str
    url: str
    error: str

    def __str__(self) -> str:
        return f"{self.agent} at {self.url}: {self.error}"


@dataclass(frozen=True)
class Listing:
    """What ``list_tasks`` found: the tasks, newest first; the instances that did not answer;
    how many instances were asked."""

    tasks: list[Listed]
    unreachable: list[Unreachable]
    asked: int


# -- finding agents -----------------------------------------------------------------------
async def instances(location: Lookup | str, agents: Sequence[str]) -> list[tuple[str, str]]:
    """(agent, URL) of every passing instance of ``agents`` (all agents when empty), asked of
    the registry (or Consul) that ``location`` names."""
    from mesh._discovery.client import DiscoveryClient

    where = location if isinstance(location, Lookup) else Lookup(location)
    client = DiscoveryClient(where.backend())
    try:
        if not agents:
            found = await client.find()
        else:
            found = [i for name in dict.fromkeys(agents) for i in await client.require(agent=name)]
    finally:
        await client.aclose()
    return list(dict.fromkeys((i.agent, i.url.rstrip("/")) for i in found))


def task_client(token: str | None, read_timeout_s: float) -> httpx.AsyncClient:
    import httpx

    from mesh._a2a.client import auth_headers
    from mesh._tls import client_context

    return httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=read_timeout_s),
        headers=auth_headers(token),
        trust_env=False,
        verify=client_context(),
    )


def failure(exc: BaseException, url: str) -> str:
    """Why an instance at ``url`` gave no listing, without naming it again."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    _, at, rest = text.partition(f" at {url} ")
    return rest if at else text


# -- mesh tasks ---------------------------------------------------------------------------
async def list_tasks(
    location: Lookup | str,
    *,
    agents: Sequence[str] = (),
    states: Sequence[str] = ACTIVE_STATES,
    token: str | None = None,
    limit: int = 100,
    timeout_s: float = 10.0,
) -> Listing:
    """The tasks in ``states`` of every passing instance of ``agents`` (every agent when empty)
    in the registry at ``location``, newest first, at most ``limit`` per agent and state; and
    the instances that did not answer within ``timeout_s``."""
    where = await instances(location, agents)
    async with task_client(token, timeout_s) as http:
        return await list_tasks_at(http, where, states=states, limit=limit, timeout_s=timeout_s)


async def list_tasks_at(
    http: httpx.AsyncClient,
    where: Sequence[tuple[str, str]],
    *,
    states: Sequence[str] = ACTIVE_STATES,
    limit: int = 100,
    timeout_s: float = 10.0,
    headers: Mapping[str, str] | None = None,
    max_answer_bytes: int | None = None,
    parallel: int = PARALLEL,
    deadline_s: float | None = None,
) -> Listing:
    """``list_tasks`` of the (agent, URL) instances ``where``, through ``http`` (``headers``
    with every call: the registry's console sends the mesh token only to those it trusts),
    ``parallel`` at once; an instance not done within ``deadline_s`` of the start (all of them
    together) is named unreachable, the others' tasks listed."""
    from mesh._a2a.client import MAX_ANSWER_BYTES, A2APeer

    gate = asyncio.Semaphore(parallel)
    found: list[Listed] = []
    failed: list[Unreachable] = []
    cap = max_answer_bytes or MAX_ANSWER_BYTES

    async def one(agent: str, url: str) -> None:
        peer = A2APeer(http, url, headers=headers, max_answer_bytes=cap)
        try:
            async with gate, asyncio.timeout(timeout_s):
                for state in states:
                    found.extend(Listed(agent, url, t) for t in await _pages(peer, state, limit))
        except (MeshError, TimeoutError) as exc:
            failed.append(Unreachable(agent, url, failure(exc, url)))
        except ValueError as exc:  # the SDK: a card with no interface it can talk to
            failed.append(Unreachable(agent, url, f"not an A2A agent this client can call: {exc}"))
        finally:
            await peer.aclose()

    jobs = {asyncio.ensure_future(one(agent, url)): (agent, url) for agent, url in where}
    if jobs:
        _, late = await asyncio.wait(jobs, timeout=deadline_s)
        for job in late:
            job.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        failed.extend(
            Unreachable(*jobs[job], f"not done within the listing's {deadline_s:g} s")
            for job in late
        )
    # Replicas sharing a store list the same tasks.
    unique = {(t.agent, t.task.task_id): t for t in found}
    tasks = sorted(unique.values(), key=lambda t: (t.task.updated_at, t.task.task_id), reverse=True)
    return Listing(tasks, sorted(failed, key=lambda u: (u.agent, u.url)), len(where))


async def _pages(peer: A2APeer, state: str, limit: int) -> list[TaskResult]:
    tasks: list[TaskResult] = []
    token = ""
    while len(tasks) < limit:  # bounded: every page holds at least one task, or it is the last
        page = await peer.list_tasks(
            state=state,
            page_size=min(_PAGE, limit - len(tasks)),
            page_token=token,
            include_artifacts=False,
        )
        tasks.extend(page.tasks)
        token = page.next_page_token
        if not token or not page.tasks:
            break
    return tasks[:limit]


def chains(tasks: list[Listed]) -> list[tuple[int, Listed, bool]]:
    """``tasks`` as (depth, task, folded), each listed task under the task of its caller when
    that is listed too (``caller_task``, or a hop of a relayed question's path); ``folded``
    when that caller's task waits (for the answer this one waits for: answer at the top)."""
    by_id = {t.task.task_id: t for t in tasks}
    parent: dict[str, str] = {}
    for t in tasks:
        if t.caller_task in by_id and t.caller_task != t.task.task_id:
            parent[t.task.task_id] = t.caller_task
        for q in t.questions:
            above = t.task.task_id
            for below in (hop.get("task", "") for hop in q.path):
                if below in by_id and below != above:
                    parent.setdefault(below, above)
                above = below
    children: dict[str, list[Listed]] = {}
    for t in tasks:
        if t.task.task_id in parent:
            children.setdefault(parent[t.task.task_id], []).append(t)
    out: list[tuple[int, Listed, bool]] = []
    seen: set[str] = set()

    def walk(t: Listed, depth: int) -> None:
        if t.task.task_id in seen:  # a cycle in what agents claim is shown once
            return
        seen.add(t.task.task_id)
        above = by_id.get(parent.get(t.task.task_id, ""))
        out.append((depth, t, above is not None and above.task.state in WAITING_STATES))
        for child in children.get(t.task.task_id, ()):
            walk(child, depth + 1)

    for t in tasks:
        if t.task.task_id not in parent:
            walk(t, 0)
    for t in tasks:  # only cycles are left: show them flat
        walk(t, 0)
    return out


def _age_s(stamp: str, now: float) -> float | None:
    try:
        return max(0.0, round(now - datetime.fromisoformat(stamp).timestamp(), 1))
    except ValueError:
        return None


def _age(stamp: str, now: float) -> str:
    age = _age_s(stamp, now)
    if age is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if age >= size:
            return f"{int(age // size)}{unit}"
    return f"{int(age)}s"


def _asks(t: Listed) -> str:
    questions = t.questions
    if not questions:
        return ""
    q = questions[0]
    asker, line = asker_of(q), first_line(q)
    text = f"{asker}: {line}" if asker and asker != t.agent else line
    if len(questions) > 1:
        text += f" (+{len(questions) - 1} more)"
    return text if len(text) <= _QUESTION_WIDTH else text[: _QUESTION_WIDTH - 1] + "…"


def format_tasks(rows: list[tuple[int, Listed]], now: float) -> str:
    """The ``mesh tasks`` table; a hop of a chain indented under its caller's task."""
    return format_table(
        ("AGENT", "TASK", "STATE", "AGE", "SKILL", "CALLER", "ASKS"),
        [
            (
                "  " * depth + t.agent,
                t.task.task_id,
                t.task.state,
                _age(t.task.updated_at, now),
                str(t.task.metadata.get("skill") or ""),
                t.caller,
                _asks(t),
            )
            for depth, t in rows
        ],
    )


def _tasks(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from mesh._settings import MeshSettings

    out = out or sys.stdout
    settings = MeshSettings.from_environment()
    states = list(dict.fromkeys([*(args.state or ()), *(WAITING if args.waiting else ())]))
    location = lookup_location(args.registry, settings)
    listing = asyncio.run(
        list_tasks(
            location,
            agents=args.agents,
            states=states or ACTIVE_STATES,
            token=settings.mesh_token,
            limit=args.limit,
            timeout_s=args.timeout,
        )
    )
    now = time.time()
    unreachable = listing.unreachable
    rows = chains(listing.tasks)
    shown = [(d, t) for d, t, folded in rows if args.all or not folded]
    folded = len(rows) - len(shown)
    if args.json:
        body = {
            "tasks": [t.as_json(now) for _, t in shown],
            "folded": folded,
            "unreachable": [u.__dict__ for u in unreachable],
        }
        print(json.dumps(body, indent=2), file=out)
    elif shown:
        print(format_tasks(shown, now), file=out)
        if folded:
            print(f"({folded} more down their chains; --all shows every hop)", file=out)
    else:
        which = ", ".join(states or ("active",))
        print(f"no tasks ({which}) at {listing.asked - len(unreachable)} instances", file=out)
    if unreachable:
        named = "; ".join(str(u) for u in unreachable)
        print(f"mesh: could not list the tasks of {named}", file=sys.stderr)
    # Nothing answered at all: the listing says nothing about the mesh.
    return 1 if unreachable and len(unreachable) == listing.asked else 0


# -- parsers ------------------------------------------------------------------------------
def registry_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        default=None,
        help="registry (or consul://host:port) that finds the agents (default $MESH_REGISTRY "
        f"or {DEFAULT_REGISTRY_URL})",
    )


def add_parsers(sub: Any) -> None:
    """Register ``tasks`` on the ``mesh`` sub-command parser."""
    t = sub.add_parser(
        "tasks",
        help="list the tasks of the mesh's agents (--waiting: those that wait for an answer)",
        description="List tasks across the agents found in the registry (every passing "
        "instance), newest first. Without --state or --waiting: the tasks that have not ended. "
        "A hop of a chain (a task whose caller's task is listed too) is folded under the "
        "topmost task unless --all.",
    )
    t.add_argument("agents", nargs="*", metavar="AGENT", help="only these agents (default: all)")
    registry_flag(t)
    t.add_argument(
        "--waiting",
        action="store_true",
        help="tasks waiting for an answer (input-required, auth-required)",
    )
    t.add_argument(
        "--state", action="append", choices=STATES, help="tasks in this state (repeatable)"
    )
    t.add_argument("--all", action="store_true", help="every hop of a chain, indented")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.add_argument(
        "--limit", type=int, default=100, help="at most this many tasks per agent and state (100)"
    )
    t.add_argument("--timeout", type=float, default=10.0, help="seconds per agent (10)")
    t.set_defaults(handler=_tasks)
