"""Asking for input: the vocabulary of tasks that wait (A2A extension ``urn:mesh:tasks:v1``).

A typed skill declared ``@skill(asks=True)`` may stop and ask its caller something::

    class Approval(BaseModel):
        decision: Literal["approve", "decline"]
        note: str = ""

    @skill(asks=True)
    async def review(req: Review, ctx: SkillContext) -> Decision:
        ok = await ctx.ask(f"Approve {req.applicant_id}?", schema=Approval)
        return Decision(decision=ok.decision)

The task then ends its run in ``TASK_STATE_INPUT_REQUIRED`` (``kind="auth"``:
``TASK_STATE_AUTH_REQUIRED``) with the question as its status message, and a message naming the
task (``taskId``) answers it. The skill runs again from the top and every ``ask`` it reaches
returns its recorded answer (replay), so nothing lives only in a coroutine.

This module holds what every layer shares and nothing of the wire's types (``mesh._a2a.questions``
turns questions into A2A parts and back): ``Question`` and its JSON entry, ``Recorded`` (one
step of a task's replay log), ``Suspend`` (what ``ask`` raises the first time), the answer's
checks, and the extension's constants.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from pydantic import ValidationError

from mesh._errors import SchemaViolation

__all__ = [
    "ASK_KINDS",
    "SCHEMA_MEDIA_TYPE",
    "TASKS_EXTENSION",
    "AskKind",
    "ChildRef",
    "ChildWaiting",
    "Question",
    "Recorded",
    "Suspend",
    "TextObject",
    "answer_of",
    "relay_id",
    "relayed",
    "schema_hash",
    "validation_errors",
]

#: The extension's URI: the card declares it, and its data sits under this key of the
#: ``metadata`` of messages, parts and tasks.
TASKS_EXTENSION = "urn:mesh:tasks:v1"
#: The media type of the data part that carries a question's JSON Schema.
SCHEMA_MEDIA_TYPE = "application/schema+json"

AskKind = Literal["input", "auth"]
ASK_KINDS: tuple[str, ...] = get_args(AskKind)


def schema_hash(schema: Mapping[str, Any] | None) -> str:
    """A short, stable digest of a JSON Schema (``""`` without one): the replay's check that a
    re-run asks for the same kind of answer."""
    if schema is None:
        return ""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Question:
    """One open question of a waiting task.

    ``id`` is unique within its task (``q-0``, ``q-1``... for a skill's own asks). ``schema``
    is the JSON Schema of a structured answer (``None``: the answer is text). ``asker`` and
    ``path`` say who asks when the question was relayed from a child task (empty when this
    node asks itself). ``invalid`` lists what was wrong with the last answer
    (``[{"field": ..., "message": ...}]``)."""

    id: str
    text: str
    kind: AskKind = "input"
    schema: dict[str, Any] | None = None
    asker: dict[str, str] | None = None
    path: tuple[dict[str, str], ...] = ()
    invalid: tuple[dict[str, str], ...] = ()

    def entry(self) -> dict[str, Any]:
        """The question's entry in ``metadata["urn:mesh:tasks:v1"]["questions"]``: strings,
        bools and lists only, so it survives a protobuf ``Struct`` unchanged (the schema
        itself travels in its own data part)."""
        entry: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "text": self.text,
            "schema": self.schema is not None,
        }
        if self.asker:
            entry["asker"] = dict(self.asker)
        entry["path"] = [dict(hop) for hop in self.path]
        if self.invalid:
            entry["invalid"] = [dict(e) for e in self.invalid]
        return entry

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any], schema: dict[str, Any] | None = None) -> Question:
        """The question of an ``entry`` (``ValueError`` naming what is malformed)."""
        qid, text, kind = entry.get("id"), entry.get("text"), entry.get("kind", "input")
        if not isinstance(qid, str) or not qid:
            raise ValueError("question entry without an 'id'")
        if not isinstance(text, str):
            raise ValueError(f"question {qid}: 'text' must be a string")
        if kind not in ASK_KINDS:
            raise ValueError(f"question {qid}: 'kind' must be one of {', '.join(ASK_KINDS)}")
        asker = entry.get("asker")
        return cls(
            id=qid,
            text=text,
            kind=kind,
            schema=schema,
            asker={str(k): str(v) for k, v in asker.items()} if isinstance(asker, dict) else None,
            path=tuple(_str_maps(entry.get("path"))),
            invalid=tuple(_str_maps(entry.get("invalid"))),
        )

    @property
    def schema_hash(self) -> str:
        return schema_hash(self.schema)

    def invalid_text(self) -> str:
        """``invalid answer to q-0: field 'decision': ...`` (empty when the answer was fine)."""
        if not self.invalid:
            return ""
        problems = "; ".join(f"field '{e['field']}': {e['message']}" for e in self.invalid)
        return f"invalid answer to {self.id}: {problems}"


def _str_maps(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        return []
    return [{str(k): str(v) for k, v in item.items()} for item in value if isinstance(item, dict)]


@dataclass(frozen=True)
class Recorded:
    """One ``ask`` of an earlier run of a task, and the answer it got: a step of the task's
    replay log (``seq`` 0, 1, ... in the order the skill asked)."""

    seq: int
    question_id: str
    text: str
    schema_hash: str
    kind: AskKind
    #: The answer as JSON (an object for a question with a schema, a string otherwise).
    answer: Any


class Suspend(BaseException):
    """Raised by ``SkillContext.ask`` when the task has no answer yet for this step: the node
    ends the run waiting, with ``question`` as its status message.

    A ``BaseException`` (like ``asyncio.CancelledError``), so that skill code's
    ``except Exception`` does not swallow it. ``seq`` is the step (the number of asks before
    this one in the run)."""

    def __init__(self, question: Question, seq: int) -> None:
        super().__init__(question.text)
        self.question = question
        self.seq = seq


class TextObject(Protocol):
    """What a message's text holds when it may be a JSON object (``mesh._a2a.json_text``'s
    ``JsonText``): the object, or why the text is none."""

    @property
    def value(self) -> dict[str, Any] | None: ...

    @property
    def problem(self) -> str: ...


def answer_of(
    question: Question,
    data: Sequence[Any],
    texts: Sequence[str],
    text_object: TextObject | None = None,
) -> Any:
    """The answer a message's parts give ``question``. With a schema: the one data part (an
    object), else the JSON object the text holds (``text_object``: what a text-only client
    such as Google ADK sends, read by the rules of a typed skill's input); without one: the
    text. Raises ``SchemaViolation`` naming what is wrong (the caller checks the value
    against the schema itself: ``mesh._schema_check``)."""
    if question.schema is not None:
        if len(data) == 1:
            return data[0]
        if not data and text_object is not None:
            if text_object.value is not None:
                return text_object.value
            raise SchemaViolation([{"field": "(answer)", "message": text_object.problem}])
        raise SchemaViolation(
            [
                {
                    "field": "(answer)",
                    "message": f"question {question.id} takes exactly one data part "
                    "(application/json), or one text part holding a JSON object, matching "
                    f"its schema, got {len(data)} data parts",
                }
            ]
        )
    text = "\n".join(texts).strip()
    if not text:
        raise SchemaViolation(
            [{"field": "(answer)", "message": f"question {question.id} takes a text answer"}]
        )
    return text


def validation_errors(exc: ValidationError, *, limit: int = 5) -> tuple[dict[str, str], ...]:
    """``[{"field": "a.b", "message": ...}]`` of a pydantic error (what an invalid answer
    reports back to whoever answered)."""
    out = []
    for err in exc.errors(include_url=False)[:limit]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "(answer)"
        message = "required field is missing" if err.get("type") == "missing" else err["msg"]
        out.append({"field": where, "message": str(message)})
    return tuple(out)


@dataclass(frozen=True)
class ChildRef:
    """A child task a delegation left waiting: where it is and how it was started, so the
    answer can be forwarded to it (and a cancel reach it) after any restart."""

    peer: str
    skill: str
    url: str
    task: str
    context: str
    message_id: str
    #: A long-running child's first message data (JSON): sent again, with ``message_id``,
    #: when the instance that ran it is gone or ended it ``interrupted``. '' otherwise.
    payload: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {
            "peer": self.peer,
            "skill": self.skill,
            "url": self.url,
            "task": self.task,
            "context": self.context,
            "message_id": self.message_id,
        }
        if self.payload:
            out["payload"] = self.payload
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChildRef:
        return cls(**{name: str(data.get(name) or "") for name in cls.__dataclass_fields__})


class ChildWaiting(BaseException):
    """Raised by a delegation whose child task waits for input (or auth): not a failure (never
    retried, never counted against a breaker). The runner makes the call a pending one that
    relays ``questions`` (the child's, as the child words them) until an answer is forwarded.

    A ``BaseException`` like ``Suspend``: the tool layer's ``except Exception`` must not turn
    it into a tool error."""

    def __init__(
        self,
        child: ChildRef,
        questions: Sequence[Question],
        cancel: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(f"{child.peer} task {child.task} waits for input")
        self.child = child
        self.questions = tuple(questions)
        #: CancelTask for the child (bounded, never raises): for a caller that cannot relay.
        self.cancel = cancel


def relay_id(child_task: str, child_question: str) -> str:
    """The id a parent gives a question relayed from its child: the same on every run and
    every replica, unique within the parent's task."""
    digest = hashlib.sha256(f"{child_task}/{child_question}".encode()).hexdigest()
    return "q-" + digest[:8]


def relayed(child: ChildRef, questions: Sequence[Question]) -> tuple[Question, ...]:
    """The child's questions as the parent shows them: its own ids (``relay_id``), the text and
    schema unchanged, the asker (the agent that asked, however deep) and the path from the
    direct child down, each hop with its own question id."""
    hop = {"agent": child.peer, "task": child.task}
    return tuple(
        Question(
            id=relay_id(child.task, q.id),
            text=q.text,
            kind=q.kind,
            schema=q.schema,
            asker=dict(q.asker) if q.asker else dict(hop),
            path=({**hop, "question": q.id}, *q.path),
            invalid=q.invalid,
        )
        for q in questions
    )
