"""Retries, failover and circuit breakers for calls to peers: ONE policy, built on tenacity.

    policy = RetryPolicy(attempts=4, sleep=fake_sleep)     # sleep is injectable for tests
    breakers = BreakerBoard(failure_threshold=3, cool_down=10.0)
    result = await call_with_failover(
        ["http://127.0.0.1:8411", "http://127.0.0.1:8412"],
        lambda url: send_to(url),                          # one attempt against one instance
        policy=policy, breakers=breakers, deadline=time.time() + 20,
    )

What is retried: exactly the failures whose reason (``mesh._failures.reason_of``) is
``"unavailable"``: ``RemoteError(reason="unavailable")`` (how the A2A client reports a refused or
dropped connection, HTTP 404/405/502/503/504, an answer that is not an A2A answer), the same
errors raw from httpx, a builtin ``ConnectionError``, and one attempt's own timeout. Answers
from a healthy peer (a rejected or failed task) are never retried: they would fail the same way
again. Each retry goes to the next instance whose breaker lets it through, after an exponential
backoff with jitter; the attempt function re-sends the SAME message id, so a peer that did get
the first copy runs the skill once.

A breaker per instance opens after ``failure_threshold`` consecutive transport failures; after
``cool_down`` seconds one probe is let through (half-open): success closes it, failure opens it
again. Only transport failures count; a rejected task says nothing about the instance's health.
A board's ``on_change`` belongs to whoever built it; others watch it with ``add_listener``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from mesh import _timeouts
from mesh._errors import CircuitOpen, DeadlineExceeded
from mesh._failures import reason_of

__all__ = [
    "BreakerBoard",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "DeadlineExceeded",
    "RetryPolicy",
    "call_with_failover",
    "is_retryable",
]

T = TypeVar("T")


class BreakerState(enum.IntEnum):
    """Values of the ``mesh_circuit_breaker_state`` gauge."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


# The states as module names: an enum member read through its class costs three times a
# plain attribute (the breaker's closed-state checks on every call).
_CLOSED = BreakerState.CLOSED


@dataclass
class CircuitBreaker:
    """The breaker of one instance. ``clock`` is injectable (monotonic seconds)."""

    failure_threshold: int = 3
    cool_down: float = 10.0
    clock: Callable[[], float] = time.monotonic
    on_change: Callable[[BreakerState], None] | None = None
    failures: int = 0
    _state: BreakerState = BreakerState.CLOSED
    _opened_at: float = 0.0
    _probe_in_flight: bool = False

    @property
    def state(self) -> BreakerState:
        """The state now: an open breaker whose cool-down has passed reads as half-open."""
        if self._state is BreakerState.OPEN and self.clock() - self._opened_at >= self.cool_down:
            return BreakerState.HALF_OPEN
        return self._state

    def allow(self) -> bool:
        """Whether a call may go to this instance now (claims the probe when half-open)."""
        if self._state is _CLOSED:  # what ``state`` reads then (the enum's lookups spared)
            return True
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._probe_in_flight:
            return False
        # Half-open: exactly one probe at a time.
        self._set(BreakerState.HALF_OPEN)
        self._probe_in_flight = True
        return True

    def record_success(self) -> None:
        if self._state is _CLOSED:  # closed already: nothing changes, nobody is told
            self.failures = 0
            self._probe_in_flight = False
            return
        self.failures = 0
        self._probe_in_flight = False
        self._set(BreakerState.CLOSED)

    def record_failure(self) -> None:
        self.failures += 1
        was_probe = self._probe_in_flight
        self._probe_in_flight = False
        if was_probe or self.failures >= self.failure_threshold:
            self._opened_at = self.clock()
            self._set(BreakerState.OPEN)

    def release(self) -> None:
        """The call ended without a verdict (cancelled): free the half-open probe slot."""
        self._probe_in_flight = False

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self._state = state
            if self.on_change is not None:
                self.on_change(state)


@dataclass
class BreakerBoard:
    """One ``CircuitBreaker`` per target (instance URL), created on first use.

    ``on_change(target, state)`` is the builder's own hook; whoever else watches the board (a
    ``remote()`` toolset exports the states as a gauge) adds a listener instead, so a board
    passed to ``remote(breakers=...)`` keeps the ``on_change`` it was given."""

    failure_threshold: int = 3
    cool_down: float = 10.0
    clock: Callable[[], float] = time.monotonic
    on_change: Callable[[str, BreakerState], None] | None = None
    _breakers: dict[str, CircuitBreaker] = field(default_factory=dict)
    _listeners: list[Callable[[str, BreakerState], None]] = field(default_factory=list)
    _calls: int = 0

    def get(self, target: str) -> CircuitBreaker:
        breaker = self._breakers.get(target)
        if breaker is None:
            breaker = CircuitBreaker(
                failure_threshold=self.failure_threshold,
                cool_down=self.cool_down,
                clock=self.clock,
                on_change=lambda state: self._changed(target, state),
            )
            self._breakers[target] = breaker
        return breaker

    def add_listener(self, listener: Callable[[str, BreakerState], None]) -> None:
        """Call ``listener(target, state)`` on every change too (once, however often added)."""
        if listener not in self._listeners:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str, BreakerState], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed(self, target: str, state: BreakerState) -> None:
        if self.on_change is not None:
            self.on_change(target, state)
        for listener in list(self._listeners):
            listener(target, state)

    def next_offset(self) -> int:
        """A counter that spreads the first try of successive calls over the instances."""
        self._calls += 1
        return self._calls

    def states(self) -> dict[str, str]:
        """``{target: "closed"|"half_open"|"open"}`` for /introspect."""
        return {t: b.state.name.lower() for t, b in self._breakers.items()}

    def state(self, target: str) -> BreakerState:
        """The state of ``target``'s breaker (closed if it has none yet; none is made)."""
        breaker = self._breakers.get(target)
        return BreakerState.CLOSED if breaker is None else breaker.state

    def retain(self, targets: Iterable[str]) -> None:
        """Forget the breakers of every target but ``targets`` (instances no longer resolved:
        the targets are URLs whoever registers chooses, so the board must not only grow)."""
        keep = set(targets)
        for target in [t for t in self._breakers if t not in keep]:
            del self._breakers[target]


def is_retryable(exc: BaseException) -> bool:
    """Whether another attempt (maybe at another instance) may succeed: the failure's reason
    is ``"unavailable"`` (see ``mesh._failures.reason_of``)."""
    return reason_of(exc) == "unavailable"


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts, and how long to wait between them.

    The wait before retry ``n`` (1-based) is ``min(max_delay, initial_delay * multiplier**(n-1))``
    plus a uniform jitter in ``[0, jitter]``. ``sleep`` and ``rng`` are injectable for tests.
    """

    attempts: int = 4
    initial_delay: float = 0.1
    max_delay: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.1
    # Upper bound of one attempt (None: only the call's deadline bounds it), so one hung
    # instance does not eat the whole deadline before failover.
    attempt_timeout: float | None = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    retryable: Callable[[BaseException], bool] = is_retryable

    def delay(self, retry_number: int) -> float:
        """Backoff before retry number ``retry_number`` (1 for the first retry)."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (retry_number - 1))
        return base + self.rng.uniform(0, self.jitter)

    async def run(
        self,
        attempt: Callable[[int], Awaitable[T]],
        *,
        deadline: float | None = None,
        clock: Callable[[], float] = time.time,
        on_retry: Callable[[int, BaseException], None] | None = None,
    ) -> T:
        """Call ``attempt(n)`` (n = 1, 2, ...) until it succeeds, fails for good, runs out of
        attempts, or the next try could not start before ``deadline`` (epoch seconds, per
        ``clock``). Raises the last error, or ``DeadlineExceeded``."""

        # The first attempt runs outside tenacity (its machinery is ~5 % of a delegation's
        # CPU); a retryable failure is handed to ``_retry``'s loop as its attempt 1, so waits,
        # stops and ``on_retry`` are tenacity's as before.
        try:
            return await self._bounded(attempt(1), deadline, clock)
        except Exception as exc:
            if not self.retryable(exc) or self.attempts <= 1:
                raise
            first: BaseException = exc
        return await self._retry(first, attempt, deadline, clock, on_retry)

    async def _retry(
        self,
        first: BaseException,
        attempt: Callable[[int], Awaitable[T]],
        deadline: float | None,
        clock: Callable[[], float],
        on_retry: Callable[[int, BaseException], None] | None,
    ) -> T:
        """``run`` from its attempt 1's retryable failure ``first`` on: tenacity's loop, that
        attempt raising ``first`` again, the next ones ``attempt(n)``."""

        # Tenacity's hooks, made only once a retry is due (three closures fewer per call).
        def wait(state: RetryCallState) -> float:
            return self.delay(state.attempt_number)

        def stop(state: RetryCallState) -> bool:
            if state.attempt_number >= self.attempts:
                return True
            return deadline is not None and clock() + (state.upcoming_sleep or 0.0) >= deadline

        def before_sleep(state: RetryCallState) -> None:
            if on_retry is not None and state.outcome is not None:
                exc = state.outcome.exception()
                if exc is not None:
                    on_retry(state.attempt_number, exc)

        retrying = AsyncRetrying(
            sleep=self.sleep,
            stop=stop,
            wait=wait,
            retry=retry_if_exception(self.retryable),
            before_sleep=before_sleep,
            reraise=True,
        )
        async for trial in retrying:
            with trial:
                number = trial.retry_state.attempt_number
                if number == 1:
                    raise first
                return await self._bounded(attempt(number), deadline, clock)
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    async def _bounded(
        self, work: Awaitable[T], deadline: float | None, clock: Callable[[], float]
    ) -> T:
        limit = self.attempt_timeout
        remaining = None if deadline is None else deadline - clock()
        if remaining is not None and remaining <= 0:
            if asyncio.iscoroutine(work):
                work.close()
            raise DeadlineExceeded("the deadline passed before the attempt started")
        if remaining is not None and (limit is None or remaining <= limit):
            try:
                # The call's deadline without a loop timer of its own (mesh._timeouts).
                with _timeouts.timeout(remaining):
                    return await work
            except TimeoutError as exc:
                raise DeadlineExceeded("the deadline passed during the attempt") from exc
        if limit is None:
            return await work
        # A per-attempt timeout is a retryable TimeoutError: maybe another instance answers.
        async with asyncio.timeout(limit):
            return await work


async def call_with_failover(
    targets: Sequence[str] | Callable[[], Sequence[str]],
    attempt: Callable[[str], Awaitable[T]],
    *,
    policy: RetryPolicy,
    breakers: BreakerBoard,
    deadline: float | None = None,
    clock: Callable[[], float] = time.time,
    on_retry: Callable[[str, BaseException], None] | None = None,
) -> T:
    """Run ``attempt(target)`` under ``policy``, each try on the next instance whose breaker
    allows it. ``targets`` may be a callable, re-read before every try (instances come and go).

    Raises ``CircuitOpen`` when no breaker lets a call through, ``DeadlineExceeded`` when the
    deadline passes, otherwise the last attempt's error.
    """
    tried: list[str] = []
    offset = breakers.next_offset()
    effective = _failover_policy(policy)

    # The first try in line: what ``effective.run`` does with its attempt 1 (the deadline
    # checked, then kept around the try; a TimeoutError under it is DeadlineExceeded), with
    # ``one``'s choice and breaker bookkeeping, but without ``run``'s, ``_bounded``'s and
    # ``one``'s coroutines and the two closures (~12 k instructions of a delegation's ~26 k
    # around its attempt). A retryable failure goes on in ``run``'s loop as its attempt 1.
    try:
        remaining = None if deadline is None else deadline - clock()
        if remaining is not None and remaining <= 0:
            raise DeadlineExceeded("the deadline passed before the attempt started")
        try:
            with _timeouts.timeout(remaining) if remaining is not None else _NO_DEADLINE:
                # The choice under the deadline, as ``run`` made it: a ``targets()`` raising
                # TimeoutError under a deadline is DeadlineExceeded (tests/test_attack_s38).
                target, breaker = _pick(targets, 1, offset, tried, breakers)
                # As ``one`` below (a change there is a change here).
                try:
                    if policy.attempt_timeout is None:
                        result = await attempt(target)
                    else:
                        async with asyncio.timeout(policy.attempt_timeout):
                            result = await attempt(target)
                except asyncio.CancelledError:
                    breaker.release()
                    raise
                except Exception as exc:
                    if policy.retryable(exc):
                        breaker.record_failure()
                    else:
                        breaker.record_success()
                    raise
                breaker.record_success()
                return result
        except TimeoutError as exc:
            if remaining is None:
                raise
            raise DeadlineExceeded("the deadline passed during the attempt") from exc
    except Exception as exc:
        if not effective.retryable(exc) or effective.attempts <= 1:
            raise
        first: BaseException = exc

    async def one(number: int) -> T:
        target, breaker = _pick(targets, number, offset, tried, breakers)
        try:
            if policy.attempt_timeout is None:
                result = await attempt(target)
            else:
                # A hung instance: a retryable TimeoutError, counted against its breaker.
                async with asyncio.timeout(policy.attempt_timeout):
                    result = await attempt(target)
        except asyncio.CancelledError:
            breaker.release()
            raise
        except Exception as exc:
            if policy.retryable(exc):
                breaker.record_failure()
            else:
                # The instance answered (e.g. a rejected task): it is healthy.
                breaker.record_success()
            raise
        breaker.record_success()
        return result

    def retried(number: int, exc: BaseException) -> None:
        if on_retry is not None:
            on_retry(tried[-1] if tried else "", exc)

    return await effective._retry(first, one, deadline, clock, retried)


# No deadline around the first try (``deadline=None``): ``_bounded`` awaits it bare.
_NO_DEADLINE = contextlib.nullcontext()


def _pick(
    targets: Sequence[str] | Callable[[], Sequence[str]],
    number: int,
    offset: int,
    tried: list[str],
    breakers: BreakerBoard,
) -> tuple[str, CircuitBreaker]:
    """The target of try ``number`` (1-based) and its breaker, which let it through; added to
    ``tried``. ``CircuitOpen`` when there is none or no breaker lets a call through."""
    current = list(targets() if callable(targets) else targets)
    if not current:
        raise CircuitOpen([])
    # Rotate so that a retry prefers an instance not tried yet (failover), and the first
    # try of every call does not always pick the same one (crude load spreading).
    start = (number - 1 + offset) % len(current)
    ordered = current[start:] + current[:start]
    if tried:  # none tried yet: every key would be 0, and the sort is stable
        ordered.sort(key=lambda t: tried.count(t))
    for target in ordered:
        breaker = breakers.get(target)
        if breaker.allow():
            break
    else:
        raise CircuitOpen(current)
    tried.append(target)
    return target, breaker


# ``_failover_policy``'s answers, by the caller's policy (one per toolset, the same call after
# call), each held so no other policy takes its id meanwhile.
_FAILOVER_POLICIES: dict[int, tuple[RetryPolicy, RetryPolicy]] = {}
_FAILOVER_KEPT = 64


def _failover_policy(policy: RetryPolicy) -> RetryPolicy:
    """What ``call_with_failover`` runs ``policy`` as: the attempt timeout applied per instance
    (not by ``run``), and a failure because every breaker is open retried too. Made once per
    policy (frozen: it cannot change)."""
    found = _FAILOVER_POLICIES.get(id(policy))
    if found is not None and found[0] is policy:
        return found[1]

    def retryable(exc: BaseException) -> bool:
        # All breakers open: retrying after the backoff may find a half-open probe slot.
        return isinstance(exc, CircuitOpen) or policy.retryable(exc)

    effective = RetryPolicy(
        attempts=policy.attempts,
        initial_delay=policy.initial_delay,
        max_delay=policy.max_delay,
        multiplier=policy.multiplier,
        jitter=policy.jitter,
        attempt_timeout=None,  # applied per instance (call_with_failover's ``one``)
        sleep=policy.sleep,
        rng=policy.rng,
        retryable=retryable,
    )
    if len(_FAILOVER_POLICIES) >= _FAILOVER_KEPT:
        _FAILOVER_POLICIES.clear()
    _FAILOVER_POLICIES[id(policy)] = (policy, effective)
    return effective
