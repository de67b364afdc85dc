"""A turn that waits: the calls of one model response while some of them wait for answers.

A tool that returns ``mesh.Ask`` does not answer its call; the runner lets the response's other
calls finish and then stops the turn with ``TurnSuspended``, which carries a ``PendingTurn``:
every call of that response in call order, with the response of each finished one (and the
session state it wrote, not applied yet) and the question of each waiting one. Nothing of it
lives only in a coroutine: ``PendingTurn.to_json`` is what a node keeps in its resume point
(``mesh_waits.turn``), and ``Runner.resume`` takes it back with the answers.

The session meanwhile holds the user's message and the model event with the calls, and a
content-less event (author ``mesh``) setting ``WAITING_KEY`` to the waiting task: no event
with an unanswered call is ever appended, so the history a model is sent stays well-formed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mesh._asks import ChildRef, Question
from mesh._errors import SchemaViolation

__all__ = ["WAITING_KEY", "PendingCall", "PendingTurn", "TurnSuspended", "question_id"]

#: The session state key naming the task whose turn waits in this session (None: none).
WAITING_KEY = "_mesh.waiting"


def question_id(invocation_id: str, call_id: str) -> str:
    """The id of the question a call asks: unique within its task, the same on every run."""
    return "q-" + hashlib.sha256(f"{invocation_id}/{call_id}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class PendingCall:
    """One call of the suspended model response: answered (``response``) or waiting on
    ``question``."""

    id: str
    name: str
    #: ``{"result": ...}`` or ``{"error": ...}``; None while the call waits.
    response: dict[str, Any] | None = None
    #: What the tool wrote to session state; applied with the one tool event.
    state_delta: dict[str, Any] = field(default_factory=dict)
    question: Question | None = None
    #: A remote call whose child task waits: the child, and its questions as relayed here.
    child: ChildRef | None = None
    relayed: tuple[Question, ...] = ()
    #: Answers forwarded to the child so far that did not settle the call (each next forward
    #: gets a new message id; a re-run of the same forward, the same one).
    forwards: int = 0

    @property
    def open_questions(self) -> list[Question]:
        """What this call waits on (none once answered)."""
        if self.response is not None:
            return []
        if self.question is not None:
            return [self.question]
        return list(self.relayed)

    def not_asked(self, limit: int) -> PendingCall:
        """This call answered with an error: the turn reached ``max_model_calls``, so no
        answer could be used (nobody is asked in vain)."""
        message = f"not asked: the turn reached max_model_calls={limit}, so no answer could be used"
        return replace(self, response={"error": {"type": "not_asked", "message": message}})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "state_delta": self.state_delta}
        if self.response is not None:
            out["response"] = self.response
        if self.question is not None:
            out["question"] = self.question.entry()
            out["schema"] = self.question.schema
        if self.child is not None:
            out["child"] = self.child.to_dict()
            out["relayed"] = [{"entry": q.entry(), "schema": q.schema} for q in self.relayed]
            out["forwards"] = self.forwards
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingCall:
        entry = data.get("question")
        question = None
        if isinstance(entry, Mapping):
            schema = data.get("schema")
            question = Question.from_entry(
                entry, dict(schema) if isinstance(schema, dict) else None
            )
        response = data.get("response")
        child = data.get("child")
        relayed = tuple(
            Question.from_entry(r["entry"], r.get("schema"))
            for r in data.get("relayed") or ()
            if isinstance(r, Mapping) and isinstance(r.get("entry"), Mapping)
        )
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            response=dict(response) if isinstance(response, dict) else None,
            state_delta=dict(data.get("state_delta") or {}),
            question=question,
            child=ChildRef.from_dict(child) if isinstance(child, Mapping) else None,
            relayed=relayed,
            forwards=int(data.get("forwards") or 0),
        )


@dataclass(frozen=True)
class PendingTurn:
    """The suspended turn: its task (the session's ``WAITING_KEY``), its invocation, and the
    calls of the model response it stopped at, in call order."""

    task_id: str
    invocation_id: str
    calls: tuple[PendingCall, ...]

    @property
    def questions(self) -> list[Question]:
        """The open questions, in call order (the oldest first)."""
        return [q for c in self.calls for q in c.open_questions]

    @property
    def children(self) -> list[ChildRef]:
        """The child tasks still waiting (a cancel or a deadline of this turn reaches them)."""
        return [c.child for c in self.calls if c.response is None and c.child is not None]

    @property
    def waiting(self) -> bool:
        return any(c.response is None for c in self.calls)

    def checked(self, answers: Mapping[str, Any]) -> dict[str, Any]:
        """The answers to this turn's open questions (by question id), each checked against
        its question: the JSON Schema, or text without one (``SchemaViolation`` naming the
        field). Answers to other questions are left out."""
        out: dict[str, Any] = {}
        for question in self.questions:
            if question.id not in answers:
                continue
            value = answers[question.id]
            if question.schema is not None:
                # Loaded on the first answer: jsonschema costs a node ~3 MB and 50 ms at start.
                from mesh._schema_check import check

                value = check(value, question.schema)
            elif not isinstance(value, str):
                raise SchemaViolation(
                    [
                        {
                            "field": "(answer)",
                            "message": f"question {question.id} takes a text answer",
                        }
                    ]
                )
            out[question.id] = value
        return out

    def answered(self, answers: Mapping[str, Any]) -> PendingTurn:
        """This turn with each waiting call whose own question ``answers`` has (by question id)
        answered ``{"result": answer}`` (``checked`` checks them first). A call waiting on a
        child is not answered here: its answer is forwarded (``Runner.resume``)."""
        calls = tuple(
            replace(c, response={"result": answers[c.question.id]})
            if c.response is None and c.question is not None and c.question.id in answers
            else c
            for c in self.calls
        )
        return replace(self, calls=calls)

    def replaced(self, call: PendingCall) -> PendingTurn:
        """This turn with the call of the same id replaced by ``call``."""
        return replace(self, calls=tuple(call if c.id == call.id else c for c in self.calls))

    def to_json(self) -> str:
        """The turn as JSON text (what a node stores in ``mesh_waits.turn``)."""
        return json.dumps(
            {
                "task_id": self.task_id,
                "invocation_id": self.invocation_id,
                "calls": [c.to_dict() for c in self.calls],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> PendingTurn:
        """The turn ``to_json`` wrote (``ValueError`` when it is not one)."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("calls"), list):
            raise ValueError("not a pending turn: expected an object with 'calls'")
        try:
            return cls(
                task_id=str(data["task_id"]),
                invocation_id=str(data["invocation_id"]),
                calls=tuple(PendingCall.from_dict(c) for c in data["calls"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a pending turn: {exc!r}") from exc


class TurnSuspended(BaseException):
    """Raised by ``Runner.run``/``run_stream``/``resume`` when a tool asked (``mesh.Ask``) and
    the turn waits for the answers to ``questions``; ``turn`` is what ``Runner.resume`` needs.

    A ``BaseException``, like ``mesh._asks.Suspend``: a turn that waits did not fail, and code
    between the runner and its caller that catches ``Exception`` must not take it for an
    error."""

    def __init__(self, turn: PendingTurn) -> None:
        questions = turn.questions
        super().__init__("; ".join(q.text for q in questions) or "waiting")
        self.turn = turn
        self.questions = questions
