"""What a peer's answers mean to the caller: ``TaskResult``, ``TaskUpdate``, ``TaskPage``.

One parser, of the JSON form: what the JSON-RPC wire carries, so the lean ``SendMessage`` of
``A2APeer.send`` reads its answer without protobuf. Answers the a2a-sdk's client returns as
protobuf (``GetTask``, ``CancelTask``, ``ListTasks``, stream events) are turned into that same
JSON form first (``MessageToDict``: the proto3 JSON mapping the wire uses), so a task reads the
same whichever way it arrived.

    TaskResult.from_json({"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_COMPLETED"},
                          "artifacts": [{"parts": [{"data": {"score": 712.0}}]}]})
    # TaskResult(task_id="t-1", context_id="c-1", state="completed", data={"score": 712}, ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

from mesh._asks import SCHEMA_MEDIA_TYPE, TASKS_EXTENSION, AskKind, Question
from mesh._schema_order import restore

__all__ = ["FAILED_STATES", "WAITING_STATES", "TaskPage", "TaskResult", "TaskUpdate", "as_json"]

#: States of a task that ended without completing.
FAILED_STATES = frozenset({"failed", "rejected", "canceled"})
#: The states of a task that waits for its caller (as ``TaskResult.state`` spells them).
WAITING_STATES = frozenset({"input-required", "auth-required"})


def as_json(message: ProtoMessage) -> dict[str, Any]:
    """A protobuf answer of the SDK's client in its JSON form (what the wire carried)."""
    return dict(MessageToDict(message))


def _state(value: Any) -> str:
    """``"TASK_STATE_INPUT_REQUIRED"`` -> ``"input-required"`` (missing: ``"unspecified"``)."""
    name = value if isinstance(value, str) and value else "TASK_STATE_UNSPECIFIED"
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")


def _parts(holder: Any) -> list[Mapping[str, Any]]:
    parts = holder.get("parts") if isinstance(holder, Mapping) else None
    return [p for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []


def _texts(holder: Any) -> list[str]:
    return [str(p["text"]) for p in _parts(holder) if "text" in p]


def _first_data(holder: Any) -> dict[str, Any] | None:
    return next(
        (_whole(p["data"]) for p in _parts(holder) if isinstance(p.get("data"), dict)), None
    )


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _ext(holder: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = holder.get("metadata")
    found = meta.get(TASKS_EXTENSION) if isinstance(meta, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _is_schema(part: Mapping[str, Any]) -> bool:
    return part.get("mediaType") == SCHEMA_MEDIA_TYPE and isinstance(part.get("data"), Mapping)


def _schema(part: Mapping[str, Any]) -> dict[str, Any]:
    # Through a protobuf Struct: whole numbers back to integers, the declared order kept.
    return restore(part["data"], keep_hint=True)


def _question_entry(entry: Any, parts: list[Mapping[str, Any]]) -> Question:
    if not isinstance(entry, Mapping):
        raise ValueError("a question entry is not an object")
    schema = None
    if entry.get("schema"):
        # This question's schema part; the first one when the parts do not say whose.
        mine = [p for p in parts if _is_schema(p) and _ext(p).get("question") == entry.get("id")]
        schema = next((_schema(p) for p in mine or [p for p in parts if _is_schema(p)]), None)
    return Question.from_entry(entry, schema)


def _whole(value: Any) -> Any:
    """Undo protobuf's numbers-are-doubles for whole numbers (``712.0`` -> ``712``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


@dataclass(frozen=True)
class TaskResult:
    """A task as the caller sees it. ``data``: the first JSON artifact part; ``text``: the text
    artifact parts (or the status message when there is no artifact); ``error``: for a task
    that ended without completing, ``{"reason", "message"}`` (the node's ``metadata.error``);
    ``status_message``: the status message in its JSON form (a waiting task's question: its
    text and schema parts); ``updated_at``: the status timestamp as the wire spells it (RFC 3339,
    "" without one)."""

    task_id: str
    context_id: str
    state: str
    data: dict[str, Any] | None = None
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    status_message: Mapping[str, Any] | None = None
    updated_at: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "completed"

    @property
    def done(self) -> bool:
        return self.state == "completed" or self.state in FAILED_STATES

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def questions(self) -> list[Question]:
        """The open questions of a waiting task (none otherwise), the oldest first: a mesh
        node's question entries when its status message (or the task) has them, else one
        question without an id, the message's text, with the schema its
        ``application/schema+json`` part holds (any A2A agent)."""
        if not self.waiting:
            return []
        kind: AskKind = "auth" if self.state == "auth-required" else "input"
        message = self.status_message or {}
        parts = _parts(message)
        entries = _ext(message).get("questions") or _ext(self.metadata).get("questions")
        if isinstance(entries, list) and entries:
            try:
                return [_question_entry(e, parts) for e in entries]
            except ValueError:  # malformed: read it as any agent's question
                pass
        texts = [str(p["text"]) for p in parts if "text" in p]
        schema = next((_schema(p) for p in parts if _is_schema(p)), None)
        return [Question(id="", text="\n".join(texts) or self.text, kind=kind, schema=schema)]

    @classmethod
    def from_json(cls, task: Mapping[str, Any]) -> TaskResult:
        """The task in its JSON form (a JSON-RPC result's ``task``, or ``as_json(task)``)."""
        data: dict[str, Any] | None = None
        texts: list[str] = []
        for artifact in task.get("artifacts") or ():
            if data is None:
                data = _first_data(artifact)
            texts.extend(_texts(artifact))
        status = _mapping(task.get("status"))
        message = status.get("message")
        status_text = "\n".join(_texts(message))
        state = _state(status.get("state"))
        metadata = _mapping(task.get("metadata"))
        error: dict[str, Any] | None = None
        if state in FAILED_STATES:
            found = metadata.get("error")
            error = (
                dict(found)
                if isinstance(found, dict)
                else {"reason": state, "message": status_text or state}
            )
        return cls(
            task_id=str(task.get("id") or ""),
            context_id=str(task.get("contextId") or ""),
            state=state,
            data=data,
            text="".join(texts) if texts else ("" if data is not None else status_text),
            metadata=metadata,
            error=error,
            status_message=message if isinstance(message, Mapping) else None,
            updated_at=str(status.get("timestamp") or ""),
        )

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> TaskResult:
        """A direct message answer (no task): completed, with the message's text."""
        return cls(
            "", str(message.get("contextId") or ""), "completed", text="\n".join(_texts(message))
        )


@dataclass(frozen=True)
class TaskUpdate:
    """One streamed event: ``kind`` is "task", "status", "artifact" or "message".

    ``parts`` are the event's parts in their JSON form (the status message's, or the
    artifact's). ``relay`` is set on a WORKING status a mesh node relayed from a child task
    (``metadata["urn:mesh:tasks:v1"]["relay"]`` of its message: ``from``, the hops from the
    node's direct child down to the source, and ``kind``; see ``mesh._a2a.relay``), and
    ``data`` then holds its first JSON part, as for an artifact. An artifact event says
    ``artifact_id``, ``append`` and ``last_chunk``."""

    kind: str
    task_id: str
    context_id: str
    state: str = ""
    text: str = ""
    data: dict[str, Any] | None = None
    partial: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    parts: tuple[Mapping[str, Any], ...] = ()
    relay: Mapping[str, Any] | None = None
    artifact_id: str = ""
    append: bool = False
    last_chunk: bool = False

    @property
    def hops(self) -> list[Mapping[str, Any]]:
        """The relayed event's ``from`` path (empty for the node's own events): its length is
        how many hops below the node the event happened."""
        found = self.relay.get("from") if self.relay is not None else None
        return [h for h in found if isinstance(h, Mapping)] if isinstance(found, list) else []

    @classmethod
    def from_json(cls, event: Mapping[str, Any]) -> TaskUpdate | None:
        """A stream event in its JSON form (``{"task": ...}``, ``{"statusUpdate": ...}``,
        ``{"artifactUpdate": ...}`` or ``{"message": ...}``); None for anything else."""
        if isinstance(task := event.get("task"), Mapping):
            state = _state(_mapping(task.get("status")).get("state"))
            return cls("task", str(task.get("id") or ""), _context(task), state=state)
        if isinstance(update := event.get("statusUpdate"), Mapping):
            status = _mapping(update.get("status"))
            said = _mapping(status.get("message"))
            said_meta = _mapping(said.get("metadata"))
            relay = _mapping(said_meta.get(TASKS_EXTENSION)).get("relay")
            return cls(
                "status",
                str(update.get("taskId") or ""),
                _context(update),
                state=_state(status.get("state")),
                text="\n".join(_texts(said)),
                partial=bool(said_meta.get("partial")),
                metadata=_mapping(update.get("metadata")),
                parts=tuple(_parts(said)),
                relay=relay if isinstance(relay, Mapping) else None,
                # A relayed artifact chunk: its data, as the artifact event's.
                data=_first_data(said) if isinstance(relay, Mapping) else None,
            )
        if isinstance(update := event.get("artifactUpdate"), Mapping):
            artifact = _mapping(update.get("artifact"))
            return cls(
                "artifact",
                str(update.get("taskId") or ""),
                _context(update),
                text="".join(_texts(artifact)),
                data=_first_data(artifact),
                parts=tuple(_parts(artifact)),
                artifact_id=str(artifact.get("artifactId") or ""),
                append=bool(update.get("append")),
                last_chunk=bool(update.get("lastChunk")),
            )
        if isinstance(message := event.get("message"), Mapping):
            text = "\n".join(_texts(message))
            return cls("message", str(message.get("taskId") or ""), _context(message), text=text)
        return None


def _context(holder: Mapping[str, Any]) -> str:
    return str(holder.get("contextId") or "")


@dataclass(frozen=True)
class TaskPage:
    """One page of ``ListTasks``."""

    tasks: list[TaskResult]
    next_page_token: str
    total_size: int
