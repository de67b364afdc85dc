"""``WaitStore``: the durable resume point of every task that waits for input, and ``WaitClock``:
the deadlines of waiting tasks.

Nothing of a waiting task lives only in a coroutine. When a skill asks (``mesh._asks``), the
executor writes, in one transaction and *before* the task's waiting state is saved:

* a ``mesh_waits`` row: the task's skill, its first message (protobuf bytes: a re-run needs
  the input), its deadline, and ``state`` (``waiting``: an open question; ``resuming``: the
  answers are recorded and the skill runs again);
* its ``mesh_questions``: the replay log, one row per ask of the skill in ``seq`` order, with
  the answer once it came (``state`` ``open`` or ``answered``).

A turn of an LLM agent whose tool asked (``mesh.Ask``, ``mesh._pending``) has a resume point
of kind ``turn``: its session (user and session id) and ``turn``, the ``PendingTurn`` as JSON
(the calls of the model response it stopped at, answered or waiting), with one question row
per waiting call (``suspend_turn``).

So a task stored as waiting always has its resume point, and the start-up pass
(``SqliteTaskStore.recover``) settles the reverse case. ``mesh_children`` (delegations that
outlive a request) is created here for the hop; nothing writes it: a turn following
long-running children keeps them in ``turn`` (state ``children``), like those that wait. The tables are version
2 of the ``tasks`` component (``Database.migrate``); their keys start with ``owner`` like
``a2a_tasks``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mesh._asks import Question, Recorded
from mesh._sqlite import Database

__all__ = ["CHILDREN", "TASKS_SCHEMA_V2", "Wait", "WaitClock", "WaitStore"]

log = logging.getLogger("mesh._a2a")

#: Version 2 of the ``tasks`` component: tasks that wait (version 1 is ``a2a_tasks``).
TASKS_SCHEMA_V2 = """
create table if not exists mesh_waits (
    owner text not null,
    task_id text not null,
    context_id text not null,
    skill text not null,
    kind text not null,                     -- 'function' (replay) | 'turn' (runner)
    user_id text not null default '',
    session_id text not null default '',
    state text not null,                    -- 'waiting' | 'children' | 'resuming'
    deadline real,                          -- epoch seconds; null = none
    request blob not null,                  -- the first message, protobuf bytes
    turn text not null default '{}',
    caller text not null default '',
    traceparent text not null default '',
    updated_at real not null,
    primary key (owner, task_id)
) without rowid;
create table if not exists mesh_questions (
    owner text not null,
    task_id text not null,
    question_id text not null,
    seq integer not null,
    kind text not null,
    text text not null,
    schema text,
    schema_hash text not null,
    path text not null default '[]',
    child_id text,
    answer text,                            -- JSON
    answered_at real,
    state text not null,                    -- 'open' | 'answered' | 'forwarded' | 'closed'
    primary key (owner, task_id, question_id)
) without rowid;
create table if not exists mesh_children (
    owner text not null,
    task_id text not null,
    child_id text not null,
    peer text not null,
    skill text not null,
    url text not null,
    child_task text not null,
    child_context text not null,
    message_id text not null,
    deadline real,
    state text not null,                    -- 'running' | 'waiting' | 'done'
    result text,
    primary key (owner, task_id, child_id)
) without rowid;
create index if not exists mesh_waits_by_session on mesh_waits (owner, user_id, session_id);
"""

WAITING = "waiting"
RESUMING = "resuming"
#: A turn whose pending calls are long-running children only: it runs (rule 4 runs it again).
CHILDREN = "children"


@dataclass
class Wait:
    """A task's resume point, as ``WaitStore.load`` reads it."""

    owner: str
    task_id: str
    context_id: str
    skill: str
    state: str
    deadline: float | None
    request: bytes
    #: Every ask of the skill so far, in order (the last may be open).
    questions: list[tuple[Question, int, str, Any]] = field(default_factory=list)
    #: ``function`` (a typed skill, by replay) or ``turn`` (an LLM turn whose tool asked).
    kind: str = "function"
    #: A turn's ``PendingTurn`` as JSON (``"{}"`` for a function skill).
    turn: str = "{}"

    def answers(self) -> dict[str, Any]:
        """The recorded answers by question id (a turn's calls take theirs from here)."""
        return {q.id: answer for q, _, state, answer in self.questions if state == "answered"}

    def open_questions(self) -> list[Question]:
        return [q for q, _, state, _ in self.questions if state == "open"]

    def replay(self) -> list[Recorded]:
        """The answered asks, in order: what ``SkillContext.ask`` returns on a re-run."""
        out = []
        for q, seq, state, answer in self.questions:
            if state != "answered":
                break
            out.append(Recorded(seq, q.id, q.text, q.schema_hash, q.kind, answer))
        return out


def delete_waits(conn: sqlite3.Connection, owner: str, task_id: str) -> None:
    """Forget a task's resume point (it ended)."""
    for table in ("mesh_waits", "mesh_questions", "mesh_children"):
        conn.execute(f"delete from {table} where owner = ? and task_id = ?", (owner, task_id))


class WaitStore:
    """Resume points in the node's database (the tables come with ``SqliteTaskStore``'s
    migration)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def suspend(
        self,
        *,
        owner: str,
        task_id: str,
        context_id: str,
        skill: str,
        request: bytes,
        deadline: float | None,
        question: Question,
        seq: int,
        caller: str = "",
        traceparent: str = "",
    ) -> None:
        """Record that the task waits on ``question`` (step ``seq`` of its replay log): the
        resume point, committed before the caller learns that the task waits."""
        now = time.time()
        wait = (owner, task_id, context_id, skill, "function", WAITING, deadline, request)
        q = (
            owner,
            task_id,
            question.id,
            seq,
            question.kind,
            question.text,
            None if question.schema is None else json.dumps(question.schema),
            question.schema_hash,
            json.dumps([dict(hop) for hop in question.path]),
        )

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "insert into mesh_waits (owner, task_id, context_id, skill, kind, state, "
                "deadline, request, caller, traceparent, updated_at) "
                "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) on conflict (owner, task_id) do update "
                "set state = excluded.state, updated_at = excluded.updated_at",
                (*wait, caller, traceparent, now),
            )
            # Asked again (an invalid answer): the step is open again, its answer dropped.
            conn.execute(
                "insert into mesh_questions (owner, task_id, question_id, seq, kind, text, "
                "schema, schema_hash, path, state) values (?, ?, ?, ?, ?, ?, ?, ?, ?, 'open') "
                "on conflict (owner, task_id, question_id) do update set state = 'open', "
                "answer = null, answered_at = null, text = excluded.text, "
                "schema = excluded.schema, schema_hash = excluded.schema_hash",
                q,
            )

        await self._db.write(write)

    async def suspend_turn(
        self,
        *,
        owner: str,
        task_id: str,
        context_id: str,
        skill: str,
        request: bytes,
        deadline: float | None,
        user_id: str,
        session_id: str,
        turn: str,
        questions: list[Question],
        caller: str = "",
        traceparent: str = "",
        state: str = WAITING,
    ) -> None:
        """Record that an LLM turn waits on ``questions`` (its waiting calls'), with ``turn``
        (the ``PendingTurn`` JSON) to go on from: one transaction, before the task's waiting
        state is saved. A turn that stops again (an answer to one of two questions, or a new
        ask after a resume) replaces its point; its earlier answered questions stay. ``state``
        ``children``: no question, the turn follows its long-running children (``turn``
        names them)."""
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "insert into mesh_waits (owner, task_id, context_id, skill, kind, user_id, "
                "session_id, state, deadline, request, turn, caller, traceparent, updated_at) "
                "values (?, ?, ?, ?, 'turn', ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "on conflict (owner, task_id) do update set state = excluded.state, "
                "turn = excluded.turn, updated_at = excluded.updated_at",
                (
                    owner,
                    task_id,
                    context_id,
                    skill,
                    user_id,
                    session_id,
                    state,
                    deadline,
                    request,
                    turn,
                    caller,
                    traceparent,
                    now,
                ),
            )
            seq = conn.execute(
                "select coalesce(max(seq) + 1, 0) from mesh_questions "
                "where owner = ? and task_id = ?",
                (owner, task_id),
            ).fetchone()[0]
            for question in questions:
                # A question still open keeps its row (and seq); a new one comes after the rest.
                conn.execute(
                    "insert into mesh_questions (owner, task_id, question_id, seq, kind, text, "
                    "schema, schema_hash, path, state) "
                    "values (?, ?, ?, ?, ?, ?, ?, ?, ?, 'open') "
                    # A question asked again (a child that refused the answer relays the same
                    # question id) is open again, without the answer it refused.
                    "on conflict (owner, task_id, question_id) do update set state = 'open', "
                    "answer = null, answered_at = null where mesh_questions.state != 'open'",
                    (
                        owner,
                        task_id,
                        question.id,
                        seq,
                        question.kind,
                        question.text,
                        None if question.schema is None else json.dumps(question.schema),
                        question.schema_hash,
                        json.dumps([dict(hop) for hop in question.path]),
                    ),
                )
                seq += 1

        await self._db.write(write)

    async def waiting(self, owner: str, task_id: str) -> bool:
        """Whether the task has a resume point (it waits, or is being resumed)."""
        row = await self._db.read(
            lambda conn: conn.execute(
                "select 1 from mesh_waits where owner = ? and task_id = ?", (owner, task_id)
            ).fetchone()
        )
        return row is not None

    async def load(self, owner: str, task_id: str) -> Wait | None:
        def read(conn: sqlite3.Connection) -> tuple[Any, list[Any]]:
            row = conn.execute(
                "select context_id, skill, state, deadline, request, kind, turn from mesh_waits "
                "where owner = ? and task_id = ?",
                (owner, task_id),
            ).fetchone()
            if row is None:
                return None, []
            questions = conn.execute(
                "select question_id, seq, kind, text, schema, state, answer from mesh_questions "
                "where owner = ? and task_id = ? order by seq",
                (owner, task_id),
            ).fetchall()
            return row, questions

        row, rows = await self._db.read(read)
        if row is None:
            return None
        wait = Wait(
            owner, task_id, row[0], row[1], row[2], row[3], bytes(row[4]), kind=row[5], turn=row[6]
        )
        for qid, seq, kind, text, schema, state, answer in rows:
            question = Question(
                id=qid, text=text, kind=kind, schema=None if schema is None else json.loads(schema)
            )
            value = None if answer is None else json.loads(answer)
            wait.questions.append((question, int(seq), state, value))
        return wait

    async def answer(self, owner: str, task_id: str, question_id: str, value: Any) -> None:
        """Record the answer to an open question; the task is resuming (a crash from here on
        runs it again with the answer: see ``SqliteTaskStore.recover``)."""
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "update mesh_questions set state = 'answered', answer = ?, answered_at = ? "
                "where owner = ? and task_id = ? and question_id = ?",
                (json.dumps(value), now, owner, task_id, question_id),
            )
            conn.execute(
                "update mesh_waits set state = ?, updated_at = ? where owner = ? and task_id = ?",
                (RESUMING, now, owner, task_id),
            )

        await self._db.write(write)

    def finish(self, owner: str, task_id: str) -> asyncio.Future[None]:
        """Forget the resume point of a task that ended. Not awaited on the task's path: a
        delete lost to a crash is redone by the start-up pass (the task is terminal)."""
        return self._db.write_soon(lambda conn: delete_waits(conn, owner, task_id))


#: What a ``WaitClock`` calls when a waiting task's deadline passes: (owner, task id, context id).
Expire = Callable[[str, str, str], Awaitable[None]]


class WaitClock:
    """One timer per waiting task with a deadline; at the deadline it calls ``expire`` (the
    handler ends the task FAILED ``deadline`` through the SDK, so subscribers see it).

    Armed when a task suspends and, at start-up, for every task still waiting."""

    def __init__(self) -> None:
        self.expire: Expire | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Task[None]] = set()

    def arm(self, owner: str, task_id: str, context_id: str, deadline: float | None) -> None:
        self.disarm(task_id)
        if deadline is None:
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, deadline - time.time())
        self._timers[task_id] = loop.call_at(when, self._fire, owner, task_id, context_id)

    def disarm(self, task_id: str) -> None:
        timer = self._timers.pop(task_id, None)
        if timer is not None:
            timer.cancel()

    def _fire(self, owner: str, task_id: str, context_id: str) -> None:
        self._timers.pop(task_id, None)
        if self.expire is None:
            return
        job = asyncio.get_running_loop().create_task(
            self._run(self.expire, owner, task_id, context_id), name=f"mesh-deadline-{task_id}"
        )
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    async def _run(self, expire: Expire, owner: str, task_id: str, context_id: str) -> None:
        try:
            await expire(owner, task_id, context_id)
        except Exception:
            log.exception("task %s: could not end it at its deadline", task_id)

    def spawn(self, job: Awaitable[None], name: str) -> None:
        """Run ``job`` in the background, owned here (cancelled by ``aclose``)."""

        async def run() -> None:
            try:
                await job
            except Exception:
                log.exception("%s failed", name)

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def aclose(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        jobs = list(self._running)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
