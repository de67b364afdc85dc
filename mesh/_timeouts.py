"""``timeout(delay)``, ``timeout_at(when)``: what ``asyncio.timeout(delay)`` and
``asyncio.timeout_at(when)`` do, without a loop timer each.

``asyncio.timeout`` makes a timer handle on entry and cancels it on exit: ~29 k instructions
under uvloop (the handle, its libuv timer started, stopped and closed, and the context
manager), twice per delegation (the call's deadline in ``RetryPolicy``, the exchange's in
``DirectPool.post``), and it almost never fires. Here every deadline of a loop waits in one
heap, and ONE loop timer stands for the earliest: a deadline later than the armed timer (the
usual case: deadlines of one length set one after another) costs a heap push, and only one
sooner than every other re-arms the timer.

The rest is ``asyncio.timeout``'s: at its time the task is cancelled; on exit, that
cancellation taken back (``Task.uncancel``) and no other left, a ``CancelledError`` becomes
``TimeoutError``; a delay of 0 or less (or NaN) expires at the loop's next iteration; ``None``
never expires; ``reschedule(when)`` moves an entered deadline (to now or before: due at the
loop's next iteration; None: never), ``expired()`` says whether it fired, as on
``asyncio.Timeout``. It is a plain context manager too (``with``, in a task): nothing in it awaits.
A deadline left while it is the soonest leaves the heap at once; others that are over wait in
it until their time or until they are most of it (then it is rebuilt without them), so a long
deadline left early is not kept for long.

``mesh._gate._BodyDeadlines`` does the same for the gate's body reads, whose deadlines all have
one length and so fall due in the order set: a deque there, ~1 k instructions a read against
~11.5 k here. Deadlines of any length (a call's remaining time) need this heap. An LLM
turn's deadline in ``mesh._a2a.executor`` is ``timeout_at`` too (~15 k instructions a turn with
``asyncio.timeout_at``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import weakref
from types import TracebackType
from typing import Any

__all__ = ["timeout", "timeout_at"]

# A deadline's states (timeout._state): made, entered, expiring (its task cancelled), left
# after it expired, left otherwise.
_CREATED, _ENTERED, _EXPIRING, _EXPIRED, _OVER = 0, 1, 2, 3, 4
# Their names in asyncio.Timeout's errors.
_NAMES = {_EXPIRING: "expiring", _EXPIRED: "expired", _OVER: "finished"}
# The heap is rebuilt without the deadlines that are over once they are more than this many
# and more than half of it.
_STALE_KEPT = 64


class timeout:
    """``with timeout(delay): ...`` (or ``async with``) in a task: ``asyncio.timeout(delay)``
    (see the module docstring). A plain context manager: entering and leaving it awaits
    nothing, so ``with`` spares the two coroutines ``async with`` makes."""

    __slots__ = ("_cancelling", "_delay", "_entry", "_soon", "_state", "_task", "_wheel", "when")

    # ``_delay`` is a loop time, not a delay (``timeout_at``).
    _ABSOLUTE = False

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._state = _CREATED

    def __enter__(self) -> timeout:
        if self._state != _CREATED:
            # As asyncio.timeout: one deadline, entered once (a second entry's slot in the heap
            # would be the first's, and its expiry would cancel whichever task entered last).
            raise RuntimeError("Timeout has already been entered")
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._task: asyncio.Task[Any] | None = task
        self._cancelling = task.cancelling()
        self._state = _ENTERED
        # This deadline's entry in its loop's heap (None: none); an entry that is not a
        # deadline's own (it was left or moved since) is over.
        self._entry: tuple[float, int, timeout] | None = None
        self._soon: asyncio.Handle | None = None
        delay = self._delay
        if delay is None:
            self.when = math.inf
            return self
        now = loop.time()
        when = self.when = delay if self._ABSOLUTE else now + delay
        if not when > now:
            self._soon = loop.call_soon(self._expire)  # as ``_set``
            return self
        # ``_set``'s and ``_Wheel.add``'s other way written out (every delegation enters two
        # deadlines: two Python calls fewer each).
        wheel = self._wheel = _wheel(loop)
        entry = self._entry = (when, next(wheel._order), self)
        heapq.heappush(wheel.heap, entry)
        if when < wheel.timer_at:
            wheel._arm(when)
        return self

    def _set(self, loop: asyncio.AbstractEventLoop, now: float, when: float) -> None:
        self.when = when
        if not when > now:  # now or before (or NaN): due now (a NaN in the heap would sit at
            # its root, never due, and keep every deadline after it from firing)
            self._soon = loop.call_soon(self._expire)
        else:
            self._wheel = _wheel(loop)
            self._wheel.add(self)

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to loop time ``when`` (None: none), as ``asyncio.Timeout``'s."""
        state = self._state
        if state != _ENTERED:
            if state == _CREATED:
                raise RuntimeError("Timeout has not been entered")
            raise RuntimeError(f"Cannot change state of {_NAMES[state]} Timeout")
        if self._entry is not None:
            self._entry = None
            self._wheel.over()
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if when is None:
            self.when = math.inf
        else:
            loop = asyncio.get_running_loop()
            self._set(loop, loop.time(), when)

    def expired(self) -> bool:
        """Whether the deadline fired (its task was cancelled for it)."""
        return self._state == _EXPIRING or self._state == _EXPIRED

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        state, task = self._state, self._task
        self._task = None
        entry = self._entry
        if entry is not None:
            self._entry = None
            heap = self._wheel.heap
            if heap[0] is entry:
                # The soonest deadline (the usual one to leave first: the innermost of nested
                # ones, set last, is the soonest): out of the heap at once, not kept as over.
                heapq.heappop(heap)
            else:
                self._wheel.over()
        if state == _EXPIRING:
            self._state = _EXPIRED
            if (
                task is not None
                and task.uncancel() <= self._cancelling
                and (exc_type is asyncio.CancelledError)
            ):
                # No other cancellation than this deadline's: it is the timeout.
                raise TimeoutError from exc_val
        else:
            self._state = _OVER

    async def __aenter__(self) -> timeout:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc_val, exc_tb)

    def _expire(self) -> None:
        if self._state == _ENTERED and self._task is not None:
            self._state = _EXPIRING
            self._soon = None
            self._task.cancel()


class timeout_at(timeout):
    """``with timeout_at(when): ...`` in a task: ``asyncio.timeout_at(when)``, ``when`` a loop
    time (None: no deadline); see ``timeout``."""

    __slots__ = ()

    _ABSOLUTE = True


class _Wheel:
    """The deadlines of one loop, in a heap by time, and the one timer of the earliest."""

    __slots__ = ("__weakref__", "_order", "heap", "loop", "stale", "timer", "timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Not the loop itself: _WHEELS would then keep every loop that ever had a deadline.
        self.loop = weakref.ref(loop)
        self.heap: list[tuple[float, int, timeout]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.stale = 0  # deadlines in the heap that are over
        self._order = itertools.count()

    def add(self, deadline: timeout) -> None:
        when = deadline.when
        entry = deadline._entry = (when, next(self._order), deadline)
        heapq.heappush(self.heap, entry)
        if when < self.timer_at:
            self._arm(when)

    def over(self) -> None:
        """A deadline's entry in the heap is over (the deadline was left or moved): kept there
        until its time, unless most of the heap is over."""
        self.stale += 1
        heap = self.heap
        if self.stale > _STALE_KEPT and self.stale * 2 > len(heap):
            heap[:] = [entry for entry in heap if entry is entry[2]._entry]
            heapq.heapify(heap)
            self.stale = 0

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        loop = self.loop()
        assert loop is not None  # a deadline of it is being set
        self.timer = loop.call_at(when, self._fall_due)
        self.timer_at = when

    def _fall_due(self) -> None:
        loop = self.loop()
        assert loop is not None  # it runs this
        # Every deadline up to the one the timer was armed for is due (a loop may run a timer
        # a little before its time by its own clock: asyncio.timeout's expire then too).
        due = max(self.timer_at, loop.time())
        self.timer, self.timer_at = None, math.inf
        heap = self.heap
        try:
            while heap and heap[0][0] <= due:
                entry = heapq.heappop(heap)
                deadline = entry[2]
                if entry is deadline._entry:
                    deadline._entry = None
                    deadline._expire()
                else:
                    self.stale -= 1
        finally:
            # Re-armed even when a cancel raised (a future's own cancel() may): the deadlines
            # after it keep their timer, as each of asyncio.timeout's has its own handle.
            if heap:
                self._arm(heap[0][0])


# The wheel of each loop, and the last one asked for (a process runs one loop, mostly). Both
# weak: the armed timer's handle holds its loop, so a wheel held here would keep the key of
# _WHEELS, every loop that ever had a deadline and its tasks, alive. A wheel lives while its
# loop holds its timer or a deadline in its heap is referenced, and a new one is made after.
_WHEELS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[_Wheel]]
_WHEELS = weakref.WeakKeyDictionary()
_last: weakref.ref[_Wheel] | None = None


def _wheel(loop: asyncio.AbstractEventLoop) -> _Wheel:
    global _last
    last = _last() if _last is not None else None
    if last is not None and last.loop() is loop:
        return last
    ref = _WHEELS.get(loop)
    found = ref() if ref is not None else None
    if found is None:
        found = _Wheel(loop)
        _WHEELS[loop] = weakref.ref(found)
    _last = weakref.ref(found)
    return found
