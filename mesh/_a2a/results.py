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

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

from mesh._artifacts import Artifact, File
from mesh._asks import SCHEMA_MEDIA_TYPE, TASKS_EXTENSION, AskKind, Question
from mesh._frozen import made
from mesh._schema_order import restore

__all__ = [
    "FAILED_STATES",
    "WAITING_STATES",
    "TaskPage",
    "TaskResult",
    "TaskUpdate",
    "artifact_from_json",
    "as_json",
]

#: States of a task that ended without completing.
FAILED_STATES = frozenset({"failed", "rejected", "canceled"})
#: The states of a task that waits for its caller (as ``TaskResult.state`` spells them).
WAITING_STATES = frozenset({"input-required", "auth-required"})


def as_json(message: ProtoMessage) -> dict[str, Any]:
    """A protobuf answer of the SDK's client in its JSON form (what the wire carried)."""
    return dict(MessageToDict(message))


def _state(value: Any) -> str:
    """``"TASK_STATE_INPUT_REQUIRED"`` -> ``"input-required"`` (missing: ``"unspecified"``)."""
    if type(value) is str:
        known = _STATES.get(value)
        if known is not None:
            return known
    name = value if isinstance(value, str) and value else "TASK_STATE_UNSPECIFIED"
    return name.removeprefix("TASK_STATE_").lower().replace("_", "-")


# The spec's states as ``_state`` spells them, worked out once (every answer names one).
_STATES: dict[str, str] = {}
_STATES.update(
    (name, _state(name))
    for name in (
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
        "TASK_STATE_FAILED",
        "TASK_STATE_CANCELED",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_REJECTED",
        "TASK_STATE_AUTH_REQUIRED",
        "TASK_STATE_UNSPECIFIED",
    )
)


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    # A parsed answer's objects are dicts: that check first (the ABC's costs ~10x more), and
    # a missing one (None) is no mapping without asking the ABC.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def _parts(holder: Any) -> list[Mapping[str, Any]]:
    parts = holder.get("parts") if _is_map(holder) else None
    # A parsed part is a dict: checked in line, ``_is_map`` called only for anything else.
    return [p for p in parts if type(p) is dict or _is_map(p)] if isinstance(parts, list) else []


def _texts(holder: Any, parts: list[Mapping[str, Any]] | None = None) -> list[str]:
    return [str(p["text"]) for p in (_parts(holder) if parts is None else parts) if "text" in p]


def _first_data(holder: Any, parts: list[Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    for part in _parts(holder) if parts is None else parts:
        if isinstance(data := part.get("data"), dict):
            return cast("dict[str, Any]", _whole(data))
    return None


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if _is_map(value) else {}


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


def artifact_from_json(artifact: Mapping[str, Any]) -> Artifact:
    """An artifact in its JSON form (as the wire carries it) as ``mesh.Artifact``."""
    parts: list[Any] = []
    for part in artifact.get("parts") or ():
        if type(part) is not dict and not _is_map(part):
            continue
        kind = part.get("mediaType") or ""
        if "text" in part:
            parts.append(str(part["text"]))
        elif "data" in part:
            parts.append(part["data"])
        elif "raw" in part or "url" in part:
            try:
                data = base64.b64decode(str(part["raw"])) if "raw" in part else None
                parts.append(
                    File(
                        data=data,
                        url=str(part["url"]) if "url" in part else None,
                        media_type=kind if "/" in kind else "application/octet-stream",
                        name=str(part.get("filename") or ""),
                    )
                )
            except (binascii.Error, ValueError):
                continue  # not a file this side can read: left out
    return made(
        Artifact,
        {
            "name": str(artifact.get("name") or ""),
            "parts": tuple(parts),
            "description": str(artifact.get("description") or ""),
        },
    )


# Values ``_whole`` leaves as they are, by exact type (not float, dict or list, nor a subclass).
_PLAIN = frozenset({str, int, bool, type(None)})


def _whole(value: Any) -> Any:
    """Undo protobuf's numbers-are-doubles for whole numbers (``712.0`` -> ``712``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        # A plain member is kept without a call of its own (most of a typed answer's are).
        return {k: v if type(v) in _PLAIN else _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) in _PLAIN else _whole(v) for v in value]
    return value


@dataclass(frozen=True)
class TaskResult:
    """A task as the caller sees it. ``data``: the first JSON part of its answer; ``text``: the
    answer's text parts (or the status message when there is no artifact). A mesh node's answer
    is the artifact named after the skill (a typed result's text is its JSON); any other
    agent's is all its artifacts. ``artifacts``: every artifact (attachments too: files as
    ``mesh.File``, JSON data, text), in order; ``error``: for a task
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
    artifacts: tuple[Artifact, ...] = ()
    #: A direct ``Message`` answer (a ``reply="message"`` skill): no task, nothing to follow.
    replied: bool = False

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
        if type(task) is dict and (settled := _settled(task)) is not None:
            return settled
        data: dict[str, Any] | None = None
        texts: list[str] = []
        metadata = _mapping(task.get("metadata"))
        artifacts = [a for a in task.get("artifacts") or () if type(a) is dict or _is_map(a)]
        # A mesh node's answer is the artifact named after its skill; the rest are attachments.
        skill = metadata.get("skill")
        answer = (skill and [a for a in artifacts if a.get("name") == skill]) or artifacts
        for artifact in answer:
            parts = _parts(artifact)
            if data is None:
                data = _first_data(artifact, parts)
            texts.extend(_texts(artifact, parts))
        raw_status = task.get("status")
        status: Mapping[str, Any] = raw_status if _is_map(raw_status) else {}
        message = status.get("message")
        status_text = "\n".join(_texts(message)) if message is not None else ""
        state = _state(status.get("state"))
        error: dict[str, Any] | None = None
        if state in FAILED_STATES:
            found = metadata.get("error")
            error = (
                dict(found)
                if isinstance(found, dict)
                else {"reason": state, "message": status_text or state}
            )
        # Every delegation's answer is read here: made without the frozen __init__ (``mesh._frozen``).
        return made(
            cls,
            {
                "task_id": str(task.get("id") or ""),
                "context_id": str(task.get("contextId") or ""),
                "state": state,
                "data": data,
                "text": "".join(texts) if texts else ("" if data is not None else status_text),
                "metadata": metadata,
                "error": error,
                "status_message": message if _is_map(message) else None,
                "updated_at": str(status.get("timestamp") or ""),
                "artifacts": tuple([artifact_from_json(a) for a in artifacts]),
                "replied": False,
            },
        )

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> TaskResult:
        """A direct message answer (no task): completed, with the message's text and data,
        and its parts as one artifact (named after the skill it names, if any)."""
        metadata = _mapping(message.get("metadata"))
        named = {"name": metadata.get("skill") or "", "parts": message.get("parts") or []}
        return cls(
            "",
            str(message.get("contextId") or ""),
            "completed",
            data=_first_data(message),
            text="".join(_texts(message)),
            metadata=metadata,
            artifacts=(artifact_from_json(named),),
            replied=True,
        )


# A mesh node's settled answer to a typed call, as its fast route writes it: the task's five
# members, a completed status with its time, one artifact (named after the skill) of a JSON
# part and its text (``_settled``). With one artifact, its name does not change the reading.
_SETTLED_TASK = frozenset({"id", "contextId", "status", "artifacts", "metadata"})
_SETTLED_STATUS = frozenset({"state", "timestamp"})
_ARTIFACT_KEYS = frozenset({"artifactId", "name", "parts"})
_DATA_PART = frozenset({"data", "mediaType"})
_TEXT_PART = frozenset({"text", "mediaType"})


def _settled(task: dict[str, Any]) -> TaskResult | None:
    """``TaskResult.from_json(task)`` for the settled typed answer's exact shape (every
    delegation of a typed skill reads one), read member by member instead of through the
    general walk; None for any other shape (which the walk reads). The same values the walk
    gives (tests/test_results_made.py compares them)."""
    if task.keys() != _SETTLED_TASK:
        return None
    status, artifacts, metadata = task["status"], task["artifacts"], task["metadata"]
    if (
        type(status) is not dict
        or type(artifacts) is not list
        or type(metadata) is not dict
        or len(artifacts) != 1
        or status.get("state") != "TASK_STATE_COMPLETED"
        or status.keys() != _SETTLED_STATUS
    ):
        return None
    (artifact,) = artifacts
    if type(artifact) is not dict or artifact.keys() != _ARTIFACT_KEYS:
        return None
    name, parts = artifact["name"], artifact["parts"]
    if type(parts) is not list or len(parts) != 2 or type(name) is not str:
        return None
    data_part, text_part = parts
    if (
        type(data_part) is not dict
        or type(text_part) is not dict
        or data_part.keys() != _DATA_PART
        or text_part.keys() != _TEXT_PART
    ):
        return None
    data, text = data_part["data"], text_part["text"]
    if type(data) is not dict or type(text) is not str:
        return None
    return made(
        TaskResult,
        {
            "task_id": str(task["id"] or ""),
            "context_id": str(task["contextId"] or ""),
            "state": "completed",
            "data": _whole(data),
            "text": text,
            "metadata": dict(metadata),
            "error": None,
            "status_message": None,
            "updated_at": str(status["timestamp"] or ""),
            "artifacts": (
                made(Artifact, {"name": name, "parts": (data, text), "description": ""}),
            ),
            "replied": False,
        },
    )


@dataclass(frozen=True)
class TaskUpdate:
    """One streamed event: ``kind`` is "task", "status", "artifact" or "message".

    ``parts`` are the event's parts in their JSON form (the status message's, or the
    artifact's). ``relay`` is set on a WORKING status a mesh node relayed from a child task
    (``metadata["urn:mesh:tasks:v1"]["relay"]`` of its message: ``from``, the hops from the
    node's direct child down to the source, and ``kind``; see ``mesh._a2a.relay``), and
    ``data`` then holds its first JSON part, as for an artifact. An artifact event says
    ``artifact_id``, ``append`` and ``last_chunk``; a chunk that is not the last one is
    ``partial`` (a model's text as it is written: ``text`` is the new piece)."""

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

    def reply(self) -> TaskResult:
        """A ``message`` event (a direct reply, the whole answer) as ``TaskResult``."""
        return TaskResult.from_message(
            {"contextId": self.context_id, "parts": list(self.parts), "metadata": self.metadata}
        )

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
                partial=not update.get("lastChunk"),
            )
        if isinstance(message := event.get("message"), Mapping):
            # A direct reply (no task): the whole answer, its text and data.
            return cls(
                "message",
                str(message.get("taskId") or ""),
                _context(message),
                text="".join(_texts(message)),
                data=_first_data(message),
                metadata=_mapping(message.get("metadata")),
                parts=tuple(_parts(message)),
            )
        return None


def _context(holder: Mapping[str, Any]) -> str:
    return str(holder.get("contextId") or "")


@dataclass(frozen=True)
class TaskPage:
    """One page of ``ListTasks``."""

    tasks: list[TaskResult]
    next_page_token: str
    total_size: int
