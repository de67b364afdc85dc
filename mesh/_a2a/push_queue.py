"""The queue of a node's push notifications: the rows of table ``a2a_push_outbox``.

What the outbox worker (``mesh._a2a.push``) does to the table, each a function of one
connection inside the worker's write transaction, so the worker itself holds no SQL:

* ``queue_settled``: one row per open config whose task reached a settled state not queued for it
  yet, the body built from the task's stored row (``a2a_tasks``); a newer state replaces a
  pending one (its ``version`` bumped). The config remembers the state queued.
* ``claim``: take the due rows for sending (their ``next_at`` pushed past the attempt, so a
  process killed mid-POST sends them again); drop those whose config is gone or whose retry time
  is over.

Replicas sharing one database (PostgreSQL) run these at once: a state is queued and a row
claimed by the one replica whose conditional update still finds what it read (the config's
``notified_*``, the row's ``version`` and ``attempts``); the other skips it. No ``for update``:
the statements stay in the subset SQLite shares.
* ``delete_sent`` / ``reschedule``: what became of one attempt, only if no newer state replaced
  its body meanwhile.

The tables are created by ``mesh._a2a.push_configs`` (component ``push``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from a2a.types import StreamResponse, Task, TaskPushNotificationConfig
from google.protobuf.json_format import MessageToDict

from mesh._a2a.push_configs import config_from_bytes
from mesh._a2a.states import SETTLED_STATES, TERMINAL_STATES

__all__ = ["Claimed", "Delivery", "claim", "delete_sent", "queue_settled", "reschedule"]

_SETTLED_SQL = ", ".join(str(int(s)) for s in sorted(SETTLED_STATES))
_ROW = "owner = ? and task_id = ? and config_id = ? and version = ?"


def _body(task_data: bytes) -> bytes:
    """The JSON POSTed for a stored task: ``{"task": {...}}`` without its history."""
    task = Task()
    task.ParseFromString(task_data)
    del task.history[:]
    return json.dumps(MessageToDict(StreamResponse(task=task)), separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Delivery:
    """One claimed row: a notification to POST now."""

    owner: str
    task_id: str
    config_id: str
    version: int
    attempts: int
    expires_at: float
    body: bytes
    config: TaskPushNotificationConfig


@dataclass(slots=True)
class Claimed:
    """What one ``claim`` took and dropped, and what is left in the queue."""

    deliveries: list[Delivery]
    dropped: int
    expired: int
    pending: int
    next_at: float | None


def queue_settled(
    conn: sqlite3.Connection, task_ids: Iterable[str] | None, now: float, expires_at: float
) -> tuple[set[str], set[str]]:
    """Queue the settled states not queued yet for each open config (of ``task_ids``, or
    all), each to be given up at ``expires_at``. Returns the tasks now finished, and (for a
    sweep, ``task_ids`` None) those still open."""
    where = (
        f"c.done = 0 and t.state in ({_SETTLED_SQL}) "
        "and (t.state != c.notified_state or t.updated_at != c.notified_at)"
    )
    args: list[Any] = []
    if task_ids is not None:
        ids = list(task_ids)
        where += f" and c.task_id in ({', '.join('?' * len(ids))})"
        args += ids
    rows = conn.execute(
        "select c.owner, c.task_id, c.config_id, t.state, t.updated_at, t.data, "
        "c.notified_state, c.notified_at "
        "from a2a_push_configs c join a2a_tasks t on t.owner = c.owner and t.id = c.task_id "
        f"where {where}",
        args,
    ).fetchall()
    bodies: dict[tuple[str, str], bytes] = {}
    finished: set[str] = set()
    for owner, task_id, config_id, state, updated_at, data, was, was_at in rows:
        terminal = state in TERMINAL_STATES
        # First the config, only if no other replica queued this state for it meanwhile
        # (PostgreSQL re-checks the condition once the other's commit releases the row).
        marked = conn.execute(
            "update a2a_push_configs set notified_state = ?, notified_at = ?, done = ? "
            "where owner = ? and task_id = ? and config_id = ? and done = 0 "
            "and notified_state = ? and notified_at = ?",
            (state, updated_at, int(terminal), owner, task_id, config_id, was, was_at),
        ).rowcount
        if marked != 1:
            continue
        body = bodies.get((owner, task_id))
        if body is None:
            body = bodies[(owner, task_id)] = _body(data)
        conn.execute(
            "insert into a2a_push_outbox (owner, task_id, config_id, version, state, body, "
            "next_at, expires_at) values (?, ?, ?, 1, ?, ?, ?, ?) "
            "on conflict (owner, task_id, config_id) do update set "
            "version = a2a_push_outbox.version + 1, state = excluded.state, "
            "body = excluded.body, "
            "attempts = 0, next_at = excluded.next_at, expires_at = excluded.expires_at, "
            "last_error = ''",
            (owner, task_id, config_id, state, body, now, expires_at),
        )
        if terminal:
            finished.add(task_id)
    still_open: set[str] = set()
    if task_ids is None:
        still_open = {
            row[0]
            for row in conn.execute(
                "select distinct task_id from a2a_push_configs where done = 0"
            ).fetchall()
        }
    return finished, still_open


def claim(conn: sqlite3.Connection, now: float, limit: int, claim_until: float) -> Claimed:
    """Take up to ``limit`` due rows for sending (their ``next_at`` moves to ``claim_until``);
    drop rows whose config is gone and rows past their retry time."""
    rows = conn.execute(
        "select o.owner, o.task_id, o.config_id, o.version, o.attempts, o.expires_at, "
        "o.body, c.data from a2a_push_outbox o left join a2a_push_configs c "
        "on c.owner = o.owner and c.task_id = o.task_id and c.config_id = o.config_id "
        "where o.next_at <= ? order by o.next_at limit ?",
        (now, limit),
    ).fetchall()
    claimed = Claimed([], 0, 0, 0, None)
    for owner, task_id, config_id, version, attempts, expires_at, body, data in rows:
        key = (owner, task_id, config_id)
        if data is None or now >= expires_at:
            conn.execute(
                "delete from a2a_push_outbox where owner = ? and task_id = ? and config_id = ?",
                key,
            )
            if data is None:
                claimed.dropped += 1
            else:
                claimed.expired += 1
            continue
        # Only if no other replica claimed it (or replaced it) since the select above.
        took = conn.execute(
            "update a2a_push_outbox set next_at = ?, attempts = attempts + 1 "
            "where owner = ? and task_id = ? and config_id = ? and version = ? and attempts = ?",
            (claim_until, *key, version, attempts),
        ).rowcount
        if took != 1:
            continue
        claimed.deliveries.append(
            Delivery(
                owner,
                task_id,
                config_id,
                version,
                attempts + 1,
                expires_at,
                body,
                config_from_bytes(data),
            )
        )
    pending, next_at = conn.execute("select count(*), min(next_at) from a2a_push_outbox").fetchone()
    claimed.pending = int(pending)
    claimed.next_at = None if next_at is None else float(next_at)
    return claimed


def delete_sent(conn: sqlite3.Connection, d: Delivery) -> None:
    """The row was sent (or refused for good): gone, unless a newer state replaced it."""
    conn.execute(
        f"delete from a2a_push_outbox where {_ROW}", (d.owner, d.task_id, d.config_id, d.version)
    )


def reschedule(conn: sqlite3.Connection, d: Delivery, next_at: float, error: str) -> None:
    """The attempt failed: try again at ``next_at``, unless a newer state replaced the row."""
    conn.execute(
        f"update a2a_push_outbox set next_at = ?, last_error = ? where {_ROW}",
        (next_at, error[:500], d.owner, d.task_id, d.config_id, d.version),
    )
