"""``DiscoveryClient``: find instances of an agent (or of whoever offers a skill).

Answers are cached for ``ttl_s`` (a few seconds), so a coordinator calling a peer in a loop does
not ask the registry every time. An empty answer is not: the next lookup asks again, so a peer
that registers a moment later (a restart) is found at once rather than a TTL later. When the registry cannot be reached, the last known answer is
served (however old), logged once, so a registry outage does not stop delegation to peers that
are still up. With no answer ever seen, the ``DiscoveryError`` propagates.

    client = DiscoveryClient(create_backend("http://127.0.0.1:8400"))
    instances = await client.require(agent="credit-bureau")   # AgentNotFound if none passing
    client.invalidate(agent="credit-bureau")                  # after a failed call: ask again
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from mesh._discovery.base import DiscoveryBackend, Instance
from mesh._errors import AgentNotFound, DiscoveryError

__all__ = ["DiscoveryClient"]

_Key = tuple[str | None, str | None, bool]


@dataclass(frozen=True)
class _Entry:
    instances: tuple[Instance, ...]
    at: float
    answer: int = 0  # which backend answer this is (``invalidate`` keeps it)


class DiscoveryClient:
    """Cached lookups over a ``DiscoveryBackend`` (which it owns: ``aclose()`` closes it)."""

    def __init__(
        self,
        backend: DiscoveryBackend,
        *,
        ttl_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        self.backend = backend
        self.ttl_s = ttl_s
        self._clock = clock
        self._log = logger or logging.getLogger("mesh._discovery")
        self._cache: dict[_Key, _Entry] = {}
        self._locks: dict[_Key, asyncio.Lock] = {}
        self._stale = False
        self._answers = 0

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        """Instances of ``agent`` and/or offering ``skill`` (may be empty)."""
        key = (agent, skill, passing_only)
        entry = self._cache.get(key)
        if entry is not None and self._clock() - entry.at < self.ttl_s:
            return list(entry.instances)
        seen = entry.answer if entry is not None else None
        # One backend call per key at a time: concurrent misses share its answer (an empty
        # one too, though it is already expired for the next lookup).
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._cache.get(key)
            if entry is not None and (
                entry.answer != seen or self._clock() - entry.at < self.ttl_s
            ):
                return list(entry.instances)
            try:
                found = await self.backend.find(agent=agent, skill=skill, passing_only=passing_only)
            except AgentNotFound:
                raise
            except DiscoveryError as exc:
                if entry is None:
                    raise
                if not self._stale:
                    self._log.warning("discovery unavailable, serving last known answers: %s", exc)
                    self._stale = True
                return list(entry.instances)
            if self._stale:
                self._log.info("discovery answering again")
                self._stale = False
            # Kept as the last known answer (served if the backend goes down) but already
            # expired when empty: "nobody" is worth asking again next time.
            at = self._clock() if found else float("-inf")
            self._answers += 1
            self._cache[key] = _Entry(tuple(found), at, self._answers)
            return list(found)

    async def require(
        self, *, agent: str | None = None, skill: str | None = None
    ) -> list[Instance]:
        """Like ``find`` (passing only) but raises ``AgentNotFound`` when nothing matches."""
        found = await self.find(agent=agent, skill=skill)
        if not found:
            what = f"agent named {agent!r}" if agent else f"agent offering skill {skill!r}"
            if agent and skill:
                what = f"agent named {agent!r} with skill {skill!r}"
            where = getattr(self.backend, "url", None)
            place = f" in the registry at {where}" if where else ""
            raise AgentNotFound(f"no passing {what}{place}; is it running? try: mesh ls")
        return found

    def invalidate(self, *, agent: str | None = None) -> None:
        """Expire cached answers (about ``agent``, or all): the next lookup asks the backend.

        Expired answers are kept as the last known ones, served if the backend cannot answer.
        """
        for key, entry in list(self._cache.items()):
            if agent is None or key[0] == agent or any(i.agent == agent for i in entry.instances):
                self._cache[key] = _Entry(entry.instances, float("-inf"), entry.answer)

    async def aclose(self) -> None:
        await self.backend.aclose()
