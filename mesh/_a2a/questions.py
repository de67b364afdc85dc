"""The status message of a waiting task, to and from ``mesh._asks.Question`` objects.

One text part and, for a structured answer, one data part (``application/schema+json``, the
JSON Schema, tagged with the question id) per open question; the message's and the task's
``metadata["urn:mesh:tasks:v1"]["questions"]`` list the questions' entries, so a reader of
``ListTasks`` sees them without parsing parts::

    {"role": "ROLE_AGENT", "parts": [
        {"text": "Approve APP-738 for 600,000?"},
        {"data": {...JSON Schema...}, "mediaType": "application/schema+json",
         "metadata": {"urn:mesh:tasks:v1": {"question": "q-0"}}}],
     "metadata": {"urn:mesh:tasks:v1": {"questions": [
        {"id": "q-0", "kind": "input", "text": "Approve ...", "schema": true, "path": []}]}}}

An invalid answer adds one text part first (``invalid answer to q-0: field 'decision': ...``)
and ``invalid`` to the question's entry. Everything goes through protobuf ``Struct``s, where
numbers are doubles: schemas come back through ``mesh._schema_order.restore``.
"""

from __future__ import annotations

import uuid
from typing import Any

from a2a.helpers import new_data_part, new_text_part
from a2a.types import Message, Part, Role, Task, TaskState
from google.protobuf.json_format import MessageToDict

from mesh._asks import SCHEMA_MEDIA_TYPE, TASKS_EXTENSION, Question
from mesh._schema_order import restore

__all__ = ["question_message", "question_metadata", "questions_of", "waiting_state"]


def question_metadata(questions: list[Question]) -> dict[str, Any]:
    """``{"urn:mesh:tasks:v1": {"questions": [...]}}``: the message's and the task's metadata."""
    return {TASKS_EXTENSION: {"questions": [q.entry() for q in questions]}}


def question_message(task_id: str, context_id: str, questions: list[Question]) -> Message:
    """The status message of a task waiting on ``questions`` (oldest first: a client that shows
    only the first text part still asks something answerable)."""
    parts: list[Part] = []
    for q in questions:
        if q.invalid:
            parts.append(new_text_part(q.invalid_text()))
    for q in questions:
        parts.append(new_text_part(q.text))
        if q.schema is not None:
            part = new_data_part(q.schema, media_type=SCHEMA_MEDIA_TYPE)
            part.metadata.update({TASKS_EXTENSION: {"question": q.id}})
            parts.append(part)
    message = Message(
        role=Role.ROLE_AGENT,
        message_id=str(uuid.uuid4()),
        task_id=task_id,
        context_id=context_id,
        parts=parts,
    )
    message.metadata.update(question_metadata(questions))
    return message


def waiting_state(questions: list[Question]) -> TaskState:
    """AUTH_REQUIRED when any open question is for consent or credentials, else INPUT_REQUIRED."""
    if any(q.kind == "auth" for q in questions):
        return TaskState.TASK_STATE_AUTH_REQUIRED
    return TaskState.TASK_STATE_INPUT_REQUIRED


def questions_of(task: Task) -> list[Question]:
    """The open questions in a task's status message (``[]`` when it carries none, or when
    they are malformed: a task not waiting on mesh's terms)."""
    if not task.status.HasField("message"):
        return []
    return _questions(task.status.message)


def _questions(message: Message) -> list[Question]:
    meta = MessageToDict(message.metadata) if message.metadata else {}
    ext = meta.get(TASKS_EXTENSION)
    entries = ext.get("questions") if isinstance(ext, dict) else None
    if not isinstance(entries, list):
        return []
    schemas: dict[str, dict[str, Any]] = {}
    for part in message.parts:
        if part.media_type != SCHEMA_MEDIA_TYPE or not part.HasField("data"):
            continue
        tag = MessageToDict(part.metadata).get(TASKS_EXTENSION) if part.metadata else None
        data = MessageToDict(part.data)
        if isinstance(tag, dict) and isinstance(data, dict):
            schemas[str(tag.get("question"))] = restore(data, keep_hint=True)
    found = []
    for entry in entries:
        if not isinstance(entry, dict):
            return []
        try:
            qid = str(entry.get("id"))
            found.append(
                Question.from_entry(entry, schemas.get(qid) if entry.get("schema") else None)
            )
        except ValueError:
            return []
    return found
