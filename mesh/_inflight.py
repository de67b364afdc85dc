"""``InFlight``: a count of work in progress, and a bounded wait until there is none.

    running = InFlight()
    with running:                      # one unit of work (or running.begin() ... running.end())
        ...
    await running.wait_idle(5.0)       # True once nothing runs (False after 5 s)

A node counts its running tasks with one (the executor) and its open A2A exchanges with
another (the request gate): a drain waits for the first, then for the answers to be sent.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["InFlight"]


class InFlight:
    # The count alone on the way in and out (each request begins and ends two of these); the
    # event only for a wait, made by the first and cleared by each while work is in flight.
    __slots__ = ("_idle", "count")

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def begin(self) -> None:
        self.count += 1

    def end(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    def __enter__(self) -> InFlight:
        self.begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end()

    async def wait_idle(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) until nothing is in flight. True when idle."""
        if self.count == 0:
            return True
        idle = self._idle
        if idle is None:
            idle = self._idle = asyncio.Event()
        idle.clear()  # set when the count last reached 0, before this work began
        try:
            async with asyncio.timeout(seconds):
                await idle.wait()
        except TimeoutError:
            return False
        return True
