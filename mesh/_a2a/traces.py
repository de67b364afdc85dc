"""The tasks of one trace on this node: what ``GET /v1/traces/{trace_id}/tasks`` answers.

Every delegation carries one ``traceparent`` (``mesh._tracing``) and every task keeps it in its
metadata, so "what did the mesh do for this request" is, on each node, the tasks whose trace id
is T (indexed: ``SqliteTaskStore.trace``). ``mesh eval`` asks every node for them and assembles
the tree through ``caller_task``; the registry console's "one request's path" reads the same
rows. A row is short: the task, its skill, caller and caller's task, the input it got, its
answer, its timings and token usage, and the tool calls its turn made (name, arguments, whether
the tool failed), read from the session events of the task's context between its first save
and its last one (a context runs one turn at a time: ``SessionLocks``).

The rows show arguments, so the route asks for the mesh token like A2A calls do, and returns
tasks of every owner: the one who asks is the mesh itself. Bounded: ``limit`` tasks at most,
each text or JSON value cut at ``MAX_VALUE_BYTES``, and the whole answer within ``max_bytes``
(``truncated`` says when rows were left out).
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import datetime
from typing import Any

from a2a.types import Role, Task
from pydantic import BaseModel, Field

from mesh._a2a.metadata_keys import CALLER_TASK, USAGE, read, usage_counts
from mesh._a2a.results import TaskResult, as_json
from mesh._a2a.store import MAX_TRACE_TASKS, SqliteTaskStore
from mesh._sqlite import Database

__all__ = [
    "MAX_TRACE_BYTES",
    "MAX_VALUE_BYTES",
    "TRACE_ID",
    "ToolCallRow",
    "TraceAnswer",
    "TraceTaskRow",
    "tasks_of_trace",
]

#: A trace id as ``traceparent`` spells it: 32 lowercase hex digits.
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
#: An input, answer or argument value longer than this (as JSON) is cut.
MAX_VALUE_BYTES = 4096
#: Default bound of one answer.
MAX_TRACE_BYTES = 1_000_000
# Event timestamps are floats of seconds, a status's time has nanoseconds: rounding apart.
_EPSILON_S = 0.001
# How far before its first save a task's turn may have begun (its first events may be written
# before the task is): events older than that are not read.
_LOOKBACK_S = 600.0


class ToolCallRow(BaseModel):
    """One tool the task's turn called (a local function or a remote skill's tool)."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    #: None when its response was not found (the turn stopped before it came back).
    ok: bool | None = None
    at: float


class TraceTaskRow(BaseModel):
    """One task of the trace on this node."""

    agent: str
    task_id: str
    context_id: str
    skill: str = ""
    state: str
    caller: str = ""
    #: The task of the caller this one was delegated by (absent for the top of a request).
    caller_task: str = ""
    traceparent: str = ""
    #: The JSON data of the request message, or its text.
    input: Any = None
    answer_text: str = ""
    answer_data: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    #: Seconds since the epoch: first save (None for tasks stored before it was recorded) and
    #: the latest status.
    started_at: float | None = None
    ended_at: float | None = None
    #: This task's own model usage by kind, camelCase as in task metadata (``inputTokens``,
    #: also for a task an older node stored with ``input_tokens``); its children report theirs.
    usage: dict[str, int] = Field(default_factory=dict)
    tool_calls: list[ToolCallRow] = Field(default_factory=list)


class TraceAnswer(BaseModel):
    """The answer of the route: this node's tasks of the trace, oldest first."""

    trace_id: str
    agent: str
    tasks: list[TraceTaskRow]
    truncated: bool = False


def _cut(value: Any) -> Any:
    """``value`` unless its JSON passes ``MAX_VALUE_BYTES``: then its JSON text, cut."""
    text = json.dumps(value, default=str)
    if len(text) <= MAX_VALUE_BYTES:
        return value
    return text[:MAX_VALUE_BYTES] + "...[cut]"


def _input_of(task: Task) -> Any:
    for message in task.history:
        if message.role != Role.ROLE_USER:
            continue
        body = as_json(message)
        for part in body.get("parts") or ():
            if isinstance(part.get("data"), dict):
                return _cut(part["data"])
        texts = [str(p["text"]) for p in body.get("parts") or () if "text" in p]
        return _cut("".join(texts))
    return None


def _ended_at(updated_at: str) -> float | None:
    if not updated_at:
        return None
    try:
        return datetime.fromisoformat(updated_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _tool_calls(conn: sqlite3.Connection, user_id: str, row: TraceTaskRow) -> list[ToolCallRow]:
    """The tool calls (and whether each failed) of the turns the task ran: the invocations in
    the session of ``context_id`` whose last event falls between the task's first save and its
    final status (a turn's last event comes after the task was first saved when it called a
    tool, and the turn before it in the context ended before this task existed)."""
    start, end = row.started_at, row.ended_at
    if start is None or end is None:
        return []
    # (user_id, session_id) is the index's prefix: the session's events, not the table's.
    rows = conn.execute(
        "select data from mesh_session_events where user_id = ? and session_id = ? "
        "and timestamp >= ? and timestamp <= ? order by seq",
        (user_id, row.context_id, start - _LOOKBACK_S, end + _EPSILON_S),
    ).fetchall()
    turns: dict[str, list[dict[str, Any]]] = {}
    for (data,) in rows:
        event = json.loads(data)
        turns.setdefault(str(event.get("invocation_id") or ""), []).append(event)
    calls: dict[str, ToolCallRow] = {}
    for events in turns.values():
        if float(events[-1].get("timestamp") or 0.0) <= start:
            continue  # an earlier turn of the conversation
        for event in events:
            for part in (event.get("content") or {}).get("parts") or ():
                call = part.get("function_call")
                if call:
                    calls[str(call.get("id"))] = ToolCallRow(
                        name=str(call.get("name")),
                        args=_cut(call.get("args") or {}),
                        at=float(event.get("timestamp") or 0.0),
                    )
                response = part.get("function_response")
                if response and str(response.get("id")) in calls:
                    calls[str(response.get("id"))].ok = "error" not in (
                        response.get("response") or {}
                    )
    return list(calls.values())


def _row(agent: str, task: Task, created_ns: int | None) -> TraceTaskRow:
    result = TaskResult.from_json(as_json(task))
    meta = result.metadata
    return TraceTaskRow(
        agent=agent,
        task_id=result.task_id,
        context_id=result.context_id,
        skill=str(meta.get("skill") or ""),
        state=result.state,
        caller=str(meta.get("caller") or ""),
        caller_task=str(read(meta, CALLER_TASK) or ""),
        traceparent=str(meta.get("traceparent") or ""),
        input=_input_of(task),
        answer_text=result.text[:MAX_VALUE_BYTES],
        # Too long a JSON answer is not half shown: matchers read answers from the caller.
        answer_data=data if isinstance(data := _cut(result.data), dict) else None,
        error=result.error,
        started_at=None if created_ns is None else created_ns / 1e9,
        ended_at=_ended_at(result.updated_at),
        usage=usage_counts(meta.get(USAGE)),
    )


#: Whether the session store's events table is there (a node without sessions has none), in
#: each backend's catalogue: PostgreSQL has no ``sqlite_master``.
_HAS_EVENTS = {
    "sqlite": "select 1 from sqlite_master where type = 'table' and name = 'mesh_session_events'",
    "postgresql": (
        "select 1 from information_schema.tables "
        "where table_schema = current_schema() and table_name = 'mesh_session_events'"
    ),
}


async def tasks_of_trace(
    store: SqliteTaskStore,
    db: Database,
    agent: str,
    trace_id: str,
    *,
    limit: int = 100,
    max_bytes: int = MAX_TRACE_BYTES,
) -> TraceAnswer:
    """This node's tasks of ``trace_id`` (see the module docstring). ``trace_id`` is checked by
    the caller (``TRACE_ID``); ``limit`` is capped at ``MAX_TRACE_TASKS``."""
    found = await store.trace(trace_id, limit=min(limit, MAX_TRACE_TASKS))
    rows = [_row(agent, task, created) for _, task, created in found]
    # The session user of a task's turns, as the executor names it: the owner of the task,
    # else its calling agent, else "a2a".
    users = [owner or row.caller or "a2a" for (owner, _, _), row in zip(found, rows, strict=True)]

    def read(conn: sqlite3.Connection) -> list[list[ToolCallRow]]:
        has_events = conn.execute(_HAS_EVENTS[db.dialect]).fetchone()
        if has_events is None:
            return [[] for _ in rows]
        return [_tool_calls(conn, user, r) for user, r in zip(users, rows, strict=True)]

    for row, calls in zip(rows, await db.read(read), strict=True):
        row.tool_calls = calls
    answer = TraceAnswer(trace_id=trace_id, agent=agent, tasks=[])
    size = len(answer.model_dump_json())
    for row in rows:
        size += len(row.model_dump_json()) + 1
        if size > max_bytes:
            answer.truncated = True
            break
        answer.tasks.append(row)
    return answer
