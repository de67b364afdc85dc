"""``CardCache``: the agent card a ``remote()`` toolset declares its tools from.

The card comes from the first instance that passes the trust check (``PeerLink.admit`` reads it
while checking), and is kept ``ttl_s``. When no instance serves one, the last card read stays:
the peer may be back before the model calls the tool, and the call reports what is wrong then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mesh._errors import RemoteError
from mesh._peer_link import PeerLink

__all__ = ["CardCache"]


class CardCache:
    """The peer's card (its JSON form), read at most every ``ttl_s`` seconds."""

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        #: The last card read, or None before the first one.
        self.card: dict[str, Any] | None = None
        self._read_at = float("-inf")

    async def get(self, link: PeerLink, skill: str) -> dict[str, Any]:
        """The card, read again through ``link`` once ``ttl_s`` passed; the last one read when
        no instance serves it now, ``RemoteError`` "unavailable" when none ever did. A
        ``remote(url)`` toolset takes the peer's name from it."""
        if self.card is not None and self.clock() - self._read_at < self.ttl_s:
            return self.card
        problem = ""
        try:
            targets = await link.targets(skill)
        except RemoteError as exc:
            targets, problem = [], exc.detail
        for target in targets:
            try:
                _, admitted = await link.admit(target, skill)
            except RemoteError as exc:
                problem = exc.detail
                continue
            self.card, self._read_at = dict(admitted.card), self.clock()
            if not link.named:
                link.peer = str(self.card.get("name") or link.peer)
            return self.card
        if self.card is not None:
            return self.card
        detail = f"cannot read its agent card ({problem or 'no instance'})"
        raise RemoteError.unavailable(link.peer, skill, detail)
