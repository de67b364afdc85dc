"""``SqliteSessionStore``: sessions in the node's SQLite file; they survive restarts.

Two tables: ``mesh_sessions`` (one row per session, state as JSON) and ``mesh_session_events``
(one row per event, the whole ``Event`` as JSON, ordered by ``seq``). Appending an event and
merging its state delta happen in one ``Database.write`` transaction, so a crash never leaves
an event without its state change or the reverse.

A turn's writes share a commit: ``create(durable=False)`` and ``append_event(durable=False)``
queue their write (``Database.write_soon``) and return at once; the turn's last append
(durable) or ``sync`` returns once they are all committed, with the error of any that failed.
The writes commit in queue order, so what a turn acknowledges is on disk as before. Queued
writes of a session that are still waiting for the database thread run as one operation
(``_Group``: one savepoint, and they fail together); events that change no state are one
update of the session's ``updated_at`` and their inserts, without reading the state (one update
for those queued one after the other, ``_Appends``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import Session, SessionInfo, merge_state
from mesh._sqlite import Database

__all__ = ["SqliteSessionStore"]

log = logging.getLogger("mesh.sessions")

_Key = tuple[str, str]
#: Users whose sessions one ``delete_idle`` write looks at, at most (an index seek each).
MAX_USERS_PER_WRITE = 200
#: Where a ``delete_idle`` walk over the users goes on: (user id, (updated_at, session id) of
#: the last session it looked at there; None: that user is done).
UserCursor = tuple[str, tuple[float, str] | None]

_SCHEMA = """
create table if not exists mesh_sessions (
    user_id    text not null,
    id         text not null,
    state      text not null default '{}',
    created_at real not null,
    updated_at real not null,
    primary key (user_id, id)
);
create table if not exists mesh_session_events (
    seq        integer primary key autoincrement,
    user_id    text not null,
    session_id text not null,
    event_id   text not null,
    author     text not null,
    timestamp  real not null,
    data       text not null,
    foreign key (user_id, session_id) references mesh_sessions (user_id, id) on delete cascade
);
create index if not exists mesh_session_events_by_session
    on mesh_session_events (user_id, session_id, seq);
create index if not exists mesh_sessions_by_user on mesh_sessions (user_id, updated_at);
"""


class _Group:
    """Writes of one session run as one ``Database`` write, in the order queued: they commit
    together or fail together (the first error rolls all of them back and is the group's).
    The database thread seals the group when it runs it; ``add`` then refuses."""

    __slots__ = ("_lock", "_sealed", "_writes")

    def __init__(self, write: Callable[[sqlite3.Connection], Any]) -> None:
        self._writes = [write]
        self._sealed = False
        self._lock = threading.Lock()

    def add(self, write: Callable[[sqlite3.Connection], Any]) -> bool:
        """Join the group (False: it runs or ran already). Events that change no state,
        queued one after the other, become one ``_Appends``."""
        with self._lock:
            if self._sealed:
                return False
            last = self._writes[-1]
            if isinstance(write, _Appends) and isinstance(last, _Appends | _StateAppend):
                last.extend(write)
            elif isinstance(write, _Appends) and isinstance(last, _Create):
                # The new row takes the events' time itself: no update of it after.
                write.created = last
                self._writes[-1] = write
            else:
                if isinstance(write, _StateAppend) and (
                    isinstance(last, _Create)
                    or (isinstance(last, _Appends) and last.created is not None)
                ):
                    # Right after this turn's own insert of the row, in the same transaction:
                    # the state it stored is known when it did insert it, not read back.
                    if isinstance(last, _Appends):
                        last.tells_state = True
                    write.after = last
                self._writes.append(write)
            return True

    def __call__(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            self._sealed = True
        for write in self._writes:
            write(conn)


class SqliteSessionStore:
    """A ``SessionStore`` on a shared ``Database`` (the node's file). Does not close ``db``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        # Writes queued by ``durable=False`` and not yet reported, by session.
        self._pending: dict[_Key, list[asyncio.Future[Any]]] = {}
        # The group of each session's queued writes that has not reached the database thread.
        self._open: dict[_Key, _Group] = {}
        self._schema_ready = False

    def _queue(self, key: _Key, write: Callable[[sqlite3.Connection], Any]) -> None:
        """Queue ``write`` for ``key``'s session without waiting for its commit. Writes queued
        while the session's last group still waits for the database thread join it: one
        operation (one savepoint, one future) for a turn's create and appends."""
        group = self._open.get(key)
        if group is not None and group.add(write):
            return
        group = _Group(write)
        self._open[key] = group
        self._pending.setdefault(key, []).append(self.db.write_soon(group))

    async def sync(self, session: Session) -> None:
        """Return once the session's queued writes are committed; raise the first one's
        error (a ``StoreError``) when some failed."""
        key = (session.user_id, session.id)
        self._open.pop(key, None)  # what is queued next is reported by the next sync
        pending = self._pending.pop(key, None)
        if not pending:
            return
        if len(pending) == 1:  # a turn's one group: no asyncio.wait (a waiter, callbacks, sets)
            if not pending[0].done():
                with contextlib.suppress(Exception):  # raised below, as for several
                    await pending[0]
        elif not all(future.done() for future in pending):
            await asyncio.wait(pending)
        for future in pending:
            exc = future.exception()
            if exc is not None:
                for other in pending:
                    if other is not future and other.exception() is not None:
                        log.error("session %s: a queued write failed: %s", session.id, other)
                raise exc

    async def _ready(self) -> None:
        if not self._schema_ready:  # every append asks: no coroutine of the Database's then
            await self.db.ensure_schema("mesh_sessions", _SCHEMA)
            self._schema_ready = True

    async def get(self, user_id: str, session_id: str) -> Session | None:
        await self._ready()

        def load(conn: sqlite3.Connection) -> tuple[sqlite3.Row | None, list[str]]:
            row = conn.execute(
                "select state, created_at, updated_at from mesh_sessions where user_id=? and id=?",
                (user_id, session_id),
            ).fetchone()
            if row is None:
                return None, []
            events = conn.execute(
                "select data from mesh_session_events where user_id=? and session_id=? "
                "order by seq",
                (user_id, session_id),
            ).fetchall()
            return row, [e["data"] for e in events]

        # One read on the database thread: the session row and its events agree.
        row, events = await self.db.read(load)
        if row is None:
            return None
        try:
            return Session(
                id=session_id,
                user_id=user_id,
                state=json.loads(row["state"]),
                events=[Event.model_validate_json(data) for data in events],
                created_at=row["created_at"],
                updated_at=row["updated_at"],
            )
        except ValueError as exc:
            raise StoreError(f"session {session_id!r} in {self.db.path} is corrupt: {exc}") from exc

    async def create(
        self,
        user_id: str,
        session_id: str | None = None,
        state: Mapping[str, Any] | None = None,
        *,
        durable: bool = True,
    ) -> Session:
        await self._ready()
        session = Session.new(user_id, session_id, state)
        state_json = (
            _dumps(session.state, what=f"initial state of session {session.id!r}")
            if session.state
            else "{}"  # a turn's new session: no encoder for nothing
        )

        insert = _Create(user_id, session.id, state_json, session.created_at, session.updated_at)
        if not durable:
            # The caller read it absent under the session's lock: nobody else creates it
            # (another process that did meanwhile has its row kept; the appends go there).
            self._queue((user_id, session.id), insert)
            return session
        if not await self.db.write(insert):
            raise StoreError(f"session {session.id!r} of user {user_id!r} already exists")
        return session

    async def get_or_create(
        self,
        user_id: str,
        session_id: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> Session:
        if session_id is not None:
            existing = await self.get(user_id, session_id)
            if existing is not None:
                return existing
        try:
            return await self.create(user_id, session_id, state)
        except StoreError:
            # Lost a race with a concurrent create of the same id: that one is ours too.
            if session_id is not None and (found := await self.get(user_id, session_id)):
                return found
            raise

    async def append_event(
        self, session: Session, event: Event, *, durable: bool = True
    ) -> Session:
        if event.partial:
            return session
        await self._ready()
        data = event.model_dump_json()
        now = time.time()
        key = (session.user_id, session.id)
        if not event.state_delta:
            # Most events change no state: the row's updated_at (and that the session exists)
            # is all there is to write besides the event, no state read and written again.
            write = _Appends(session, event, data, now)
            if durable:
                group = self._open.get(key)
                if group is not None and group.add(write):
                    # It rides with the session's queued writes (one savepoint, one update of
                    # the row): their commit is its commit, and sync waits for it.
                    self.db.flush()
                else:
                    await self.db.write(write)
                await self.sync(session)  # committed before this one: reports their errors
            else:
                self._queue(key, write)
            session.events.append(event)
            session.updated_at = now
            return session
        delta_json = _dumps(event.state_delta, what=f"state_delta of event {event.id}")
        flat = _flat_copy(event.state_delta)
        append = _StateAppend(session, event, data, delta_json, now, flat)
        if durable:
            state = await self.db.write(append)
            await self.sync(session)  # committed before this one: reports their errors
        else:
            self._queue(key, append)
            # The merge the transaction makes (the turns of a session are serialised, so the
            # caller's state is the stored one).
            read = flat if flat is not None else json.loads(delta_json)
            state = merge_state(dict(session.state), read)
        session.events.append(event)
        session.state.clear()
        session.state.update(state)
        session.updated_at = now
        return session

    async def list_sessions(self, user_id: str) -> list[SessionInfo]:
        await self._ready()
        rows = await self.db.read(
            lambda conn: conn.execute(
                "select s.id, s.created_at, s.updated_at, "
                "(select count(*) from mesh_session_events e "
                " where e.user_id=s.user_id and e.session_id=s.id) as n "
                "from mesh_sessions s where s.user_id=? order by s.updated_at desc",
                (user_id,),
            ).fetchall()
        )
        return [
            SessionInfo(r["id"], user_id, r["created_at"], r["updated_at"], r["n"]) for r in rows
        ]

    async def delete(self, user_id: str, session_id: str) -> bool:
        await self._ready()

        def remove(conn: sqlite3.Connection) -> bool:
            # Explicit, so it holds even if a connection runs with foreign_keys off.
            conn.execute(
                "delete from mesh_session_events where user_id=? and session_id=?",
                (user_id, session_id),
            )
            cur = conn.execute(
                "delete from mesh_sessions where user_id=? and id=?", (user_id, session_id)
            )
            return cur.rowcount == 1

        return await self.db.write(remove)

    async def delete_idle(
        self,
        before: float,
        limit: int,
        keep: Callable[[sqlite3.Connection, list[_Key]], set[_Key]] | None = None,
        start: UserCursor | None = None,
    ) -> tuple[int, UserCursor | None]:
        """Delete up to ``limit`` sessions not updated since ``before`` (epoch seconds) with
        their events, in one short write (retention, ``mesh._retention``); ``keep(conn,
        candidates)``, asked in that write, names the ones in use, which stay. Found through
        ``mesh_sessions_by_user``, one user after another from ``start`` (an index seek each,
        at most ``MAX_USERS_PER_WRITE``), so the write stays short on a big table. Returns how
        many went and where the next write goes on (None: past the last user)."""
        await self._ready()

        def write(conn: sqlite3.Connection) -> tuple[int, UserCursor | None]:
            found: list[_Key] = []
            cursor: UserCursor | None = start
            for _ in range(MAX_USERS_PER_WRITE):
                if cursor is None:
                    row = conn.execute("select min(user_id) from mesh_sessions").fetchone()
                elif cursor[1] is None:
                    row = conn.execute(
                        "select min(user_id) from mesh_sessions where user_id > ?", (cursor[0],)
                    ).fetchone()
                else:
                    row = (cursor[0],)  # on with this user, past what was looked at
                if row is None or row[0] is None:
                    cursor = None
                    break
                user = str(row[0])
                # Past the last session looked at, not from the user's first again: sessions
                # kept (in use) would otherwise fill every batch and stop the walk for good.
                since = cursor[1] if cursor is not None and cursor[0] == user else None
                rows = conn.execute(
                    "select id, updated_at from mesh_sessions where user_id = ? "
                    "and updated_at < ?"
                    + ("" if since is None else " and (updated_at > ? or (updated_at = ? and id > ?))")
                    + " order by updated_at, id limit ?",
                    (user, before, *(() if since is None else (since[0], since[0], since[1])),
                     limit - len(found)),
                ).fetchall()  # fmt: skip
                found.extend((user, str(r[0])) for r in rows)
                if len(found) >= limit:
                    # This user may have more: the next write goes on after the last one.
                    cursor = (user, (float(rows[-1][1]), str(rows[-1][0])))
                    break
                cursor = (user, None)
            kept = keep(conn, found) if keep is not None and found else set()
            gone = [k for k in found if k not in kept]
            # ``updated_at`` again in the deletes: a turn may have appended since.
            deleted = 0
            for user_id, session_id in gone:
                cur = conn.execute(
                    "delete from mesh_sessions where user_id = ? and id = ? and updated_at < ?",
                    (user_id, session_id, before),
                )
                if cur.rowcount == 1:
                    deleted += 1
                    # Explicit, like ``delete``: it holds even with foreign_keys off.
                    conn.execute(
                        "delete from mesh_session_events where user_id = ? and session_id = ?",
                        (user_id, session_id),
                    )
            return deleted, cursor

        return await self.db.write(write)

    async def count(self) -> int:
        await self._ready()
        row = await self.db.read(
            lambda conn: conn.execute("select count(*) from mesh_sessions").fetchone()
        )
        return int(row[0])

    async def aclose(self) -> None:
        """Nothing to release: the ``Database`` belongs to whoever opened it."""


class _Create:
    """A new session's row (``create(durable=False)``): inserted unless it exists. Joined by
    the appends queued after it (``_Group.add``), it becomes their ``created``."""

    __slots__ = ("left_state", "row")

    def __init__(
        self, user_id: str, session_id: str, state: str, created_at: float, updated_at: float
    ) -> None:
        self.row = (user_id, session_id, state, created_at, updated_at)
        #: The row's state as this write left it, when it inserted the row (else None).
        self.left_state: str | None = None

    def __call__(self, conn: sqlite3.Connection) -> bool:
        cur = conn.execute(
            "insert or ignore into mesh_sessions (user_id, id, state, created_at, updated_at) "
            "values (?, ?, ?, ?, ?)",
            self.row,
        )
        inserted = cur.rowcount == 1
        self.left_state = self.row[2] if inserted else None
        return inserted


class _StateAppend:
    """An event that changes its session's state: merged into the stored state, not the
    caller's copy (the row is the truth), written with the row's ``updated_at``, then the
    event's row. Events that change no state queued right after it (``_Group.add``) are
    stored after it, the update taking the last one's time: one update of the row, not one
    more for them; what is stored is what one write per event stored."""

    __slots__ = ("_delta_json", "_flat", "_key", "_now", "_rows", "after")

    def __init__(
        self,
        session: Session,
        event: Event,
        data: str,
        delta_json: str,
        now: float,
        flat: dict[str, Any] | None = None,
    ) -> None:
        self._key = (session.user_id, session.id)
        self._delta_json = delta_json
        #: The delta as its text reads back (``_flat_copy``), or None: read from the text.
        self._flat = flat
        self._now = now
        self._rows = [(session.user_id, session.id, event.id, event.author, event.timestamp, data)]
        #: The write of its group right before it that inserts the session's row (the turn's
        #: own create, ``_Group.add``): when it did, the row's state is the one it stored.
        self.after: _Create | _Appends | None = None

    def extend(self, later: _Appends) -> None:
        """Store ``later``'s events after this one (the same session's)."""
        self._rows += later._rows
        self._now = later._now

    def __call__(self, conn: sqlite3.Connection) -> dict[str, Any]:
        user_id, session_id = self._key
        stored = self.after.left_state if self.after is not None else None
        if stored is None:  # a row this transaction did not insert: the row says
            row = conn.execute(
                "select state from mesh_sessions where user_id=? and id=?", (user_id, session_id)
            ).fetchone()
            if row is None:
                raise StoreError(f"no session {session_id!r} of user {user_id!r} to append to")
            stored = row["state"]
        flat = self._flat
        if flat is None:
            state = merge_state(json.loads(stored), json.loads(self._delta_json))
            text = json.dumps(state)
        elif stored == "{}":
            # An empty state and a flat delta: the merge is the delta, and its text the
            # delta's own (json.dumps of the same keys and values in the same order).
            state, text = dict(flat), self._delta_json
        else:
            state = merge_state(json.loads(stored), flat)
            text = json.dumps(state)
        rows = self._rows
        conn.execute(
            "insert into mesh_session_events "
            "(user_id, session_id, event_id, author, timestamp, data) values (?,?,?,?,?,?)",
            rows[0],
        )
        conn.execute(
            "update mesh_sessions set state=?, updated_at=? where user_id=? and id=?",
            (text, self._now, user_id, session_id),
        )
        for later in rows[1:]:
            conn.execute(
                "insert into mesh_session_events "
                "(user_id, session_id, event_id, author, timestamp, data) values (?,?,?,?,?,?)",
                later,
            )
        return state


class _Appends:
    """Events of one session that change no state, stored in order: the session row's
    ``updated_at`` (which also says the session exists) once, to the last one's time, then
    the events' rows. Several queued in a row (``_Group.add``) are one update and their
    inserts; what is stored is what one write per event stored. After a new session's
    ``created`` row, that row is written with the events' time (or, when it exists, only its
    ``updated_at`` moves: ``insert or ignore`` and the update did the same), no update."""

    __slots__ = ("_key", "_now", "_rows", "created", "left_state", "tells_state")

    def __init__(self, session: Session, event: Event, data: str, now: float) -> None:
        self._key = (session.user_id, session.id)
        self._now = now
        self._rows = [(session.user_id, session.id, event.id, event.author, event.timestamp, data)]
        self.created: _Create | None = None
        #: An event with a delta follows in the group (``_Group.add``): tell it the state the
        #: row was inserted with (``left_state``), when this write inserted it.
        self.tells_state = False
        self.left_state: str | None = None

    def extend(self, later: _Appends) -> None:
        """Store ``later``'s events after these (the same session's)."""
        self._rows += later._rows
        self._now = later._now

    def __call__(self, conn: sqlite3.Connection) -> None:
        user_id, session_id = self._key
        self.left_state = None
        if self.created is not None and self.tells_state:
            # Its row count read (on PostgreSQL the round trip the state's read would take):
            # inserted, the state is the one it was inserted with; there, it is only touched.
            values = (*self.created.row[:4], self._now)
            cur = conn.execute(
                "insert or ignore into mesh_sessions (user_id, id, state, created_at, updated_at) "
                "values (?, ?, ?, ?, ?)",
                values,
            )
            if cur.rowcount == 1:
                self.left_state = values[2]
            else:
                conn.execute(
                    "update mesh_sessions set updated_at=? where user_id=? and id=?",
                    (self._now, user_id, session_id),
                )
        elif self.created is not None:
            # No row count to read (a round trip on PostgreSQL): the row exists after it.
            conn.execute(
                "insert into mesh_sessions (user_id, id, state, created_at, updated_at) "
                "values (?, ?, ?, ?, ?) on conflict (user_id, id) "
                "do update set updated_at = excluded.updated_at",
                (*self.created.row[:4], self._now),
            )
        else:
            touched = conn.execute(
                "update mesh_sessions set updated_at=? where user_id=? and id=?",
                (self._now, user_id, session_id),
            )
            if touched.rowcount != 1:
                raise StoreError(f"no session {session_id!r} of user {user_id!r} to append to")
        # One execute a row, not executemany: on PostgreSQL that waits for its row count (a
        # round trip), where a plain insert rides in the batch's pipeline.
        for row in self._rows:
            conn.execute(
                "insert into mesh_session_events "
                "(user_id, session_id, event_id, author, timestamp, data) values (?,?,?,?,?,?)",
                row,
            )


#: Values whose JSON text reads back to an equal value of the same type.
_FLAT_VALUES = frozenset({str, int, float, bool, type(None)})


def _flat_copy(delta: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of ``delta`` equal to what its JSON text reads back to (``json.loads`` of
    ``json.dumps``), when its keys are exactly str and its values exactly str, int, float, bool
    or None (a remote turn's: the peer's context id); None otherwise (nested values, other
    types or keys: a non-str key's text may even repeat another's). A state delta is read
    back from its text so the session holds none of the caller's objects; such a delta holds
    only values that cannot change, so its copy does the same without the parse."""
    if type(delta) is not dict:
        return None
    for key, value in delta.items():
        if type(key) is not str or type(value) not in _FLAT_VALUES:
            return None
    return dict(delta)


def _dumps(value: Mapping[str, Any], *, what: str) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serialisable: {exc}") from exc
