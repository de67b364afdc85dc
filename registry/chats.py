"""``Chats``: the console's chat turns between their post and their stream, the streams open,
and which instance holds each conversation (``registry.chat`` has the routes)."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["Chats", "Turn"]

#: Posted turns kept, and contexts remembered (which instance had them), at most.
_MAX_PENDING = 64
_MAX_CONTEXTS = 1024


@dataclass(frozen=True)
class Turn:
    """A message posted and not streamed yet."""

    agent: str
    text: str
    context_id: str | None
    task_id: str | None  # the waiting task this message answers
    csrf: str  # the session that posted it (its CSRF token names it)
    expires_at: float


class Chats:
    """The posted turns, the streams open, and which instance holds each context."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, Turn] = OrderedDict()
        self._where: OrderedDict[str, str] = OrderedDict()  # contextId -> instance URL
        self.open = 0

    def post(self, turn: Turn) -> str:
        turn_id = secrets.token_urlsafe(24)
        self._pending[turn_id] = turn
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)
        return turn_id

    def take(self, turn_id: str, csrf: str) -> Turn | None:
        """The turn, once, for the session that posted it, while it is fresh."""
        turn = self._pending.get(turn_id)
        if turn is None or turn.csrf != csrf:
            return None
        del self._pending[turn_id]
        return turn if turn.expires_at > time.monotonic() else None

    def remember(self, context_id: str, url: str) -> None:
        self._where[context_id] = url
        self._where.move_to_end(context_id)
        while len(self._where) > _MAX_CONTEXTS:
            self._where.popitem(last=False)

    def where(self, context_id: str | None) -> str | None:
        return self._where.get(context_id) if context_id else None
