"""``InMemorySessionStore``: sessions in a dict, gone when the process ends (tests, scripts)."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

from mesh._errors import StoreError
from mesh._events import Event
from mesh._sessions.base import Session, SessionInfo, merge_state

__all__ = ["InMemorySessionStore"]


class InMemorySessionStore:
    """A ``SessionStore`` in memory. Callers get copies, so they cannot corrupt the store."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, str], Session] = {}

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

    async def get(self, user_id: str, session_id: str) -> Session | None:
        stored = self._sessions.get((user_id, session_id))
        return self._copy(stored) if stored else None

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
        if key in self._sessions:
            raise StoreError(f"session {session.id!r} of user {user_id!r} already exists")
        self._sessions[key] = session
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
        stored = self._sessions.get((session.user_id, session.id))
        if stored is None:
            raise StoreError(f"no session {session.id!r} of user {session.user_id!r} to append to")
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
        infos = [
            SessionInfo(s.id, s.user_id, s.created_at, s.updated_at, len(s.events))
            for (uid, _), s in self._sessions.items()
            if uid == user_id
        ]
        return sorted(infos, key=lambda i: i.updated_at, reverse=True)

    async def delete(self, user_id: str, session_id: str) -> bool:
        return self._sessions.pop((user_id, session_id), None) is not None

    async def count(self) -> int:
        return len(self._sessions)

    async def aclose(self) -> None:
        self._sessions.clear()
