"""Sessions: the durable record of a conversation (its events) and its state.

A session is identified by ``(user_id, session_id)``: two users never share a session even if
they pick the same id. ``append_event`` stores an event and merges its ``state_delta`` into the
session state in one step (``dict.update`` semantics: a key in the delta always wins, ``None``
included; nothing is ever deleted by a delta). Partial (streamed) events are never stored.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mesh._events import Event, new_id

__all__ = ["Session", "SessionInfo", "SessionStore", "merge_state"]


@dataclass
class Session:
    """A conversation: its events in order, and the state its events built up."""

    id: str
    user_id: str
    state: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)

    @classmethod
    def new(
        cls, user_id: str, session_id: str | None = None, state: Mapping[str, Any] | None = None
    ) -> Session:
        now = time.time()
        return cls(
            id=session_id or new_id(),
            user_id=user_id,
            state=dict(state or {}),
            created_at=now,
            updated_at=now,
        )


@dataclass(frozen=True)
class SessionInfo:
    """A session without its events, for listings."""

    id: str
    user_id: str
    created_at: float
    updated_at: float
    event_count: int


def merge_state(state: dict[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    """Apply ``delta`` to ``state`` in place (``dict.update``: the delta wins, None too)."""
    state.update(delta)
    return state


class SessionStore(Protocol):
    """Where sessions live. Implementations: ``InMemorySessionStore``, ``SqliteSessionStore``.

    Every method is safe to call from concurrent turns of *different* sessions; the runner
    serialises turns of the same session.
    """

    async def get(self, user_id: str, session_id: str) -> Session | None:
        """The session with its events and state, or None."""
        ...

    async def create(
        self,
        user_id: str,
        session_id: str | None = None,
        state: Mapping[str, Any] | None = None,
        *,
        durable: bool = True,
    ) -> Session:
        """A new, empty session (a fresh id when none is given).

        Raises ``StoreError`` when ``(user_id, session_id)`` already exists. With
        ``durable=False`` (a caller that read it absent under the session's lock) the store may
        return before the session is stored and skip that check; ``sync`` reports the outcome.
        """
        ...

    async def get_or_create(
        self,
        user_id: str,
        session_id: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> Session:
        """The existing session, or a new one (``state`` only seeds a new session)."""
        ...

    async def append_event(
        self, session: Session, event: Event, *, durable: bool = True
    ) -> Session:
        """Store ``event`` and merge its ``state_delta``, atomically; update ``session`` in place.

        Partial events are not stored (``session`` is returned unchanged). Raises ``StoreError``
        when the session does not exist in this store. With ``durable=False`` the store may
        return before the event is stored (the runner appends a turn's events so and waits
        once, at the turn's end); a later durable append or ``sync`` of the session returns
        only once it is, and raises its error.
        """
        ...

    async def sync(self, session: Session) -> None:
        """Return once every ``durable=False`` write of ``session`` is stored; raise
        ``StoreError`` when one failed."""
        ...

    async def list_sessions(self, user_id: str) -> list[SessionInfo]:
        """The user's sessions, most recently updated first."""
        ...

    async def delete(self, user_id: str, session_id: str) -> bool:
        """Remove a session and its events; False when there was none."""
        ...

    async def count(self) -> int:
        """How many sessions the store holds (all users)."""
        ...

    async def aclose(self) -> None:
        """Release what the store holds (not a shared ``Database``: its owner closes it)."""
        ...
