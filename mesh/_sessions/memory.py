"""``InMemorySessionStore``: sessions in a dict, gone when the process ends (tests, scripts).

Bounded: a process that runs turns for ever (a coordinator script) must not keep every session
it ever saw. The least recently used sessions go past ``max_sessions``, and any session unused
for ``idle_ttl_s``; a session with a turn running or waiting (``in_use``) is never evicted.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from mesh._errors import ConfigError, StoreError
from mesh._events import Event
from mesh._sessions.base import Session, SessionInfo, merge_state

__all__ = ["DEFAULT_IDLE_TTL_S", "DEFAULT_MAX_SESSIONS", "InMemorySessionStore"]

DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_IDLE_TTL_S = 3600.0

_Key = tuple[str, str]


class InMemorySessionStore:
    """A ``SessionStore`` in memory. Callers get copies, so they cannot corrupt the store.

    ``max_sessions`` (default 10,000) bounds how many sessions it keeps: creating one more
    evicts the least recently used (read or written). ``idle_ttl_s`` (default one hour) evicts a
    session nobody has read or written for that long. ``None`` turns either bound off.
    ``in_use(user_id, session_id)`` says a session has a turn running or waiting: such a session
    is never evicted (a ``Runner`` wires its own session locks in when it creates this store or
    is given one without ``in_use``). ``clock`` (seconds, monotonic) is for tests.
    """

    def __init__(
        self,
        *,
        max_sessions: int | None = DEFAULT_MAX_SESSIONS,
        idle_ttl_s: float | None = DEFAULT_IDLE_TTL_S,
        in_use: Callable[[str, str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions is not None and max_sessions < 1:
            raise ConfigError(
                f"max_sessions must be at least 1 (or None: no bound), not {max_sessions}"
            )
        if idle_ttl_s is not None and idle_ttl_s <= 0:
            raise ConfigError(f"idle_ttl_s must be positive (or None: no expiry), not {idle_ttl_s}")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.in_use = in_use
        self._clock = clock
        self._sessions: dict[_Key, Session] = {}
        # Least recently used first; the value is when it was last used (self._clock).
        self._used: OrderedDict[_Key, float] = OrderedDict()

    @staticmethod
    def _copy(session: Session) -> Session:
        return Session(
            id=session.id,
            user_id=session.user_id,
            state=copy.deepcopy(session.state),
            # Events are frozen; a new list is enough.
            events=list(session.events),
            created_at=session.created_at,
            updated_at=session.updated_at,
        )

    def _touch(self, key: _Key) -> None:
        self._used[key] = self._clock()
        self._used.move_to_end(key)

    def _evict(self, room: int = 0) -> None:
        """Drop expired sessions, then the least recently used until ``room`` more fit.

        Walks from the least recently used and stops at the first one neither expired nor over
        the bound, so the cost is what it drops (plus any busy sessions it steps over)."""
        limit = None if self.max_sessions is None else self.max_sessions - room
        deadline = None if self.idle_ttl_s is None else self._clock() - self.idle_ttl_s
        busy: list[_Key] = []
        while self._used:
            key, used = next(iter(self._used.items()))
            if busy and key == busy[0]:
                break  # around once: every session left at the front has a turn in it
            over = limit is not None and len(self._used) > limit
            expired = deadline is not None and used <= deadline
            if not (over or expired):
                break
            if self.in_use is not None and self.in_use(*key):
                # A turn is in it: keep it and look past it (it goes back in order below).
                busy.append(key)
                self._used.move_to_end(key)
                continue
            del self._used[key]
            del self._sessions[key]
        for key in reversed(busy):
            # Back to the front: still the least recently used, judged again next time.
            self._used.move_to_end(key, last=False)

    async def get(self, user_id: str, session_id: str) -> Session | None:
        self._evict()
        key = (user_id, session_id)
        stored = self._sessions.get(key)
        if stored is None:
            return None
        self._touch(key)
        return self._copy(stored)

    async def create(
        self,
        user_id: str,
        session_id: str | None = None,
        state: Mapping[str, Any] | None = None,
        *,
        durable: bool = True,
    ) -> Session:
        session = Session.new(user_id, session_id, copy.deepcopy(dict(state or {})))
        key = (user_id, session.id)
        self._evict(room=1)
        if key in self._sessions:
            raise StoreError(f"session {session.id!r} of user {user_id!r} already exists")
        self._sessions[key] = session
        self._touch(key)
        return self._copy(session)

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
        return await self.create(user_id, session_id, state)

    async def append_event(
        self, session: Session, event: Event, *, durable: bool = True
    ) -> Session:
        if event.partial:
            return session
        key = (session.user_id, session.id)
        stored = self._sessions.get(key)
        if stored is None:
            raise StoreError(f"no session {session.id!r} of user {session.user_id!r} to append to")
        self._touch(key)
        now = time.time()
        stored.events.append(event)
        merge_state(stored.state, copy.deepcopy(event.state_delta))
        stored.updated_at = now
        session.events.append(event)
        merge_state(session.state, copy.deepcopy(event.state_delta))
        session.updated_at = now
        return session

    async def sync(self, session: Session) -> None:
        """Nothing to wait for: every write is done when its call returns."""

    async def list_sessions(self, user_id: str) -> list[SessionInfo]:
        self._evict()
        infos = [
            SessionInfo(s.id, s.user_id, s.created_at, s.updated_at, len(s.events))
            for (uid, _), s in self._sessions.items()
            if uid == user_id
        ]
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    async def delete(self, user_id: str, session_id: str) -> bool:
        self._used.pop((user_id, session_id), None)
        return self._sessions.pop((user_id, session_id), None) is not None

    async def count(self) -> int:
        self._evict()
        return len(self._sessions)

    async def aclose(self) -> None:
        self._sessions.clear()
        self._used.clear()
