"""The approval inbox: every task of the mesh that waits for an answer, and answering one.

The tasks are found as ``mesh tasks --waiting`` finds them (``mesh._cli.tasks.list_tasks_at``:
``ListTasks`` in input-required and auth-required on each instance), on the instances
``registry.reach`` lets the registry ask, each within ``DEADLINE_S`` and ``MAX_ANSWER_BYTES``, and
folded like it: a hop of a chain whose caller's task waits too is under that task, and the
answer goes to the top (the officer passes it down to the underwriter).

An answer is a form built from the question's schema (``form_fields``: a choice for an
``enum``, a checkbox for a boolean, a number field, a text field, a JSON text for anything
else), read back into JSON (``answer_of``) and checked against the schema before it is sent, as
``mesh reply`` does. It goes only to the instances of the agent the form names that the registry
trusts (a URL is never taken from the form), as A2A answers a waiting task: the task's id and
context, and the question's id in the mesh's task metadata.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mesh._a2a.client import A2APeer
from mesh._a2a.results import TaskResult
from mesh._asks import TASKS_EXTENSION, Question
from mesh._cli.question import asker_of, check_answer
from mesh._cli.tasks import WAITING, Listed, Unreachable, chains, list_tasks_at
from mesh._errors import ConfigError, MeshError
from registry.reach import PARALLEL, VIEW_DEADLINE_S, Refusal
from registry.store import InstanceRecord

if TYPE_CHECKING:
    from registry.state import RegistryState

__all__ = [
    "ANSWER_TIMEOUT_S",
    "DEADLINE_S",
    "FormField",
    "Inbox",
    "InboxItem",
    "answer_of",
    "form_fields",
    "send_answer",
    "waiting",
]

#: Each instance's listing, whole, within this many seconds and bytes.
DEADLINE_S = 5.0
MAX_ANSWER_BYTES = 1_000_000
#: Waiting tasks listed per instance.
_LIMIT = 50
#: How long answering waits for the task to go on (the officer passes the answer down the
#: chain and finishes its turn) before the page shows where it is.
ANSWER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FormField:
    """One input of an answer's form."""

    name: str
    kind: str  # "choice", "boolean", "number", "integer", "text", "json"
    required: bool
    description: str = ""
    choices: tuple[str, ...] = ()
    default: str = ""


@dataclass(frozen=True)
class InboxItem:
    """A waiting task at the top of its chain, with its open question."""

    listed: Listed
    question: Question | None
    waited_s: float | None
    #: Tasks down its chain waiting for the same answer (the asker's among them).
    below: int = 0

    @property
    def asker(self) -> str:
        return (asker_of(self.question) if self.question else "") or self.listed.agent

    @property
    def on_behalf_of(self) -> str:
        """Whom the asking agent works for: the caller of the task at the top (``""``: a user
        talking to it directly)."""
        return self.listed.caller


@dataclass
class Inbox:
    items: list[InboxItem] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    unreachable: list[Unreachable] = field(default_factory=list)
    asked: int = 0


def _waited_s(task: TaskResult, now: float) -> float | None:
    from datetime import datetime

    try:
        return max(0.0, now - datetime.fromisoformat(task.updated_at).timestamp())
    except ValueError:
        return None


async def _trusted(
    state: RegistryState, agent: str | None = None
) -> tuple[list[InstanceRecord], list[Refusal]]:
    found = [inst for inst, _ in await state.catalog.instances(agent=agent, status="any")]
    return state.reach.split(found)


async def waiting(state: RegistryState) -> Inbox:
    """Every waiting task the registry may see, the top of each chain only, oldest first."""
    asked, refused = await _trusted(state)
    reach = state.reach
    listing = await list_tasks_at(
        reach.http,
        [(i.agent, i.url.rstrip("/")) for i in asked],
        states=WAITING,
        limit=_LIMIT,
        timeout_s=DEADLINE_S,
        headers=reach.headers,
        max_answer_bytes=MAX_ANSWER_BYTES,
        parallel=PARALLEL,
        deadline_s=VIEW_DEADLINE_S,
    )
    now = time.time()
    rows = chains(listing.tasks)
    items: list[InboxItem] = []
    for n, (depth, listed, folded) in enumerate(rows):
        if folded:
            continue
        below = 0
        for d, _, f in rows[n + 1 :]:
            if d <= depth:
                break
            below += f
        questions = listed.questions
        items.append(
            InboxItem(
                listed,
                questions[0] if questions else None,
                _waited_s(listed.task, now),
                below,
            )
        )
    items.sort(key=lambda i: -(i.waited_s or 0.0))
    return Inbox(items, refused, listing.unreachable, len(asked))


def _kind(prop: Mapping[str, Any]) -> str:
    kind = prop.get("type")
    if "enum" in prop or "const" in prop:
        return "choice"
    if kind in ("boolean", "number", "integer", "string"):
        return "text" if kind == "string" else str(kind)
    return "json"


def form_fields(question: Question) -> list[FormField]:
    """The inputs of the question's answer form (one "text" field without a schema)."""
    schema = question.schema
    if schema is None:
        return [FormField("text", "text", True, "your answer")]
    props = schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return [FormField("json", "json", True, "the answer as a JSON object")]
    required = set(schema.get("required") or ())
    fields = []
    for name, prop in props.items():
        prop = prop if isinstance(prop, Mapping) else {}
        kind = _kind(prop)
        choices = tuple(
            str(c) for c in prop.get("enum") or ([prop["const"]] if "const" in prop else [])
        )
        default = prop.get("default")
        fields.append(
            FormField(
                str(name),
                kind,
                name in required,
                str(prop.get("description") or prop.get("title") or ""),
                choices,
                "" if default is None else str(default),
            )
        )
    return fields


def answer_of(form: Mapping[str, str], question: Question) -> dict[str, Any] | str:
    """The answer the form's fields (``f.<name>``) say, checked against the question's schema
    (``ConfigError`` naming the field otherwise)."""
    fields = form_fields(question)
    if question.schema is None:
        text = form.get("f.text", "").strip()
        if not text:
            raise ConfigError("text: the answer is empty")
        return text
    answer: dict[str, Any] = {}
    for f in fields:
        raw = form.get(f"f.{f.name}", "")
        if f.kind == "boolean":
            answer[f.name] = raw in ("on", "true", "1", "yes")
            continue
        if raw == "" and not f.required:
            continue
        try:
            if f.kind == "integer":
                answer[f.name] = int(raw)
            elif f.kind == "number":
                answer[f.name] = float(raw)
            elif f.kind == "json":
                parsed = json.loads(raw)
                if f.name == "json":  # the whole answer
                    if not isinstance(parsed, dict):
                        raise ConfigError("json: the answer must be a JSON object")
                    return check_answer(parsed, question)
                answer[f.name] = parsed
            else:
                answer[f.name] = raw
        except ValueError:
            raise ConfigError(f"{f.name}: not a valid {f.kind}") from None
    return check_answer(answer, question)


@dataclass(frozen=True)
class Answered:
    """What became of a task after the page answered it."""

    agent: str
    result: TaskResult


async def send_answer(
    state: RegistryState,
    agent: str,
    task_id: str,
    question_id: str,
    form: Mapping[str, str],
) -> Answered:
    """Answer the waiting task ``task_id`` held by ``agent`` (see the module docstring).
    ``ConfigError``: no trusted instance of ``agent`` has it, it asks no such question, or the
    answer is invalid; ``MeshError``: the node refused or failed."""
    reach = state.reach
    asked, _ = await _trusted(state, agent)
    if not asked:
        raise ConfigError(f"no instance of {agent!r} the registry may ask")
    gate = asyncio.Semaphore(PARALLEL)

    async def one(inst: InstanceRecord) -> tuple[A2APeer, TaskResult] | None:
        peer = A2APeer(
            reach.http, inst.url, headers=reach.headers, max_answer_bytes=MAX_ANSWER_BYTES
        )
        try:
            async with gate, asyncio.timeout(DEADLINE_S):
                task = await peer.find_task(task_id)
        except (MeshError, TimeoutError, ValueError):
            task = None
        if task is None:
            await peer.aclose()
            return None
        return peer, task

    hits = [h for h in await asyncio.gather(*(one(i) for i in asked)) if h is not None]
    for peer, _ in hits[1:]:  # replicas of one store: the first will do
        await peer.aclose()
    if not hits:
        raise ConfigError(f"no instance of {agent!r} has task {task_id}")
    peer, task = hits[0]
    try:
        question = next((q for q in task.questions if q.id == question_id), None)
        if question is None:
            raise ConfigError(
                f"task {task_id} is {task.state} and asks no question {question_id!r} now "
                "(answered already?)"
            )
        answer = answer_of(form, question)
        result = await peer.send(
            answer,
            task_id=task.task_id,
            context_id=task.context_id,
            metadata={TASKS_EXTENSION: {"answers": question.id}} if question.id else None,
            timeout=ANSWER_TIMEOUT_S,
        )
    finally:
        await peer.aclose()
    return Answered(agent, result)
