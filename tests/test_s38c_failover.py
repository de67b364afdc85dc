"""``call_with_failover``'s first try in line and the breaker's closed-state checks (session
38): the same decisions as before, call after call.

The reference below is the code as it was at d67a51c (``RetryPolicy.run`` and ``_bounded``,
``call_with_failover`` with its ``one`` closure, ``CircuitBreaker``), kept here on purpose: the
two run the same random sequences of calls (instances, each try's outcome: an answer, a
retryable or a final failure, a raw TimeoutError, a cancellation; breakers opened, half-open,
cooled down; deadlines none, passed, ahead; a target list re-read per try) on boards of their
own, and must give the same results and errors (type, text, reason, cause), try the same
instances in the same order, sleep the same backoffs, report the same retries and leave every
breaker in the same state after the same changes."""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from mesh import _timeouts
from mesh._errors import CircuitOpen, DeadlineExceeded, RemoteError
from mesh._failures import reason_of
from mesh._resilience import (
    BreakerBoard,
    BreakerState,
    CircuitBreaker,
    RetryPolicy,
    _failover_policy,
    call_with_failover,
)

T = TypeVar("T")


# -- the reference: d67a51c's code ---------------------------------------------------------------
@dataclass
class OldBreaker:
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
        if self._state is BreakerState.OPEN and self.clock() - self._opened_at >= self.cool_down:
            return BreakerState.HALF_OPEN
        return self._state

    def allow(self) -> bool:
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._probe_in_flight:
            return False
        self._set(BreakerState.HALF_OPEN)
        self._probe_in_flight = True
        return True

    def record_success(self) -> None:
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
        self._probe_in_flight = False

    def _set(self, state: BreakerState) -> None:
        if state is not self._state:
            self._state = state
            if self.on_change is not None:
                self.on_change(state)


@dataclass
class OldBoard(BreakerBoard):
    """A board of the reference's breakers (the rest of the board did not change)."""

    _breakers: dict[str, Any] = field(default_factory=dict)

    def get(self, target: str) -> Any:
        breaker = self._breakers.get(target)
        if breaker is None:
            breaker = OldBreaker(
                failure_threshold=self.failure_threshold,
                cool_down=self.cool_down,
                clock=self.clock,
                on_change=lambda state: self._changed(target, state),
            )
            self._breakers[target] = breaker
        return breaker


async def old_bounded(
    policy: RetryPolicy, work: Awaitable[T], deadline: float | None, clock: Callable[[], float]
) -> T:
    limit = policy.attempt_timeout
    remaining = None if deadline is None else deadline - clock()
    if remaining is not None and remaining <= 0:
        if asyncio.iscoroutine(work):
            work.close()
        raise DeadlineExceeded("the deadline passed before the attempt started")
    if remaining is not None and (limit is None or remaining <= limit):
        try:
            with _timeouts.timeout(remaining):
                return await work
        except TimeoutError as exc:
            raise DeadlineExceeded("the deadline passed during the attempt") from exc
    if limit is None:
        return await work
    async with asyncio.timeout(limit):
        return await work


async def old_run(
    policy: RetryPolicy,
    attempt: Callable[[int], Awaitable[T]],
    *,
    deadline: float | None = None,
    clock: Callable[[], float] = time.time,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    try:
        return await old_bounded(policy, attempt(1), deadline, clock)
    except Exception as exc:
        if not policy.retryable(exc) or policy.attempts <= 1:
            raise
        first: BaseException = exc

    def wait(state: RetryCallState) -> float:
        return policy.delay(state.attempt_number)

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= policy.attempts:
            return True
        return deadline is not None and clock() + (state.upcoming_sleep or 0.0) >= deadline

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            exc = state.outcome.exception()
            if exc is not None:
                on_retry(state.attempt_number, exc)

    retrying = AsyncRetrying(
        sleep=policy.sleep,
        stop=stop,
        wait=wait,
        retry=retry_if_exception(policy.retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    async for trial in retrying:
        with trial:
            number = trial.retry_state.attempt_number
            if number == 1:
                raise first
            return await old_bounded(policy, attempt(number), deadline, clock)
    raise AssertionError("unreachable")


async def old_call_with_failover(
    targets: Sequence[str] | Callable[[], Sequence[str]],
    attempt: Callable[[str], Awaitable[T]],
    *,
    policy: RetryPolicy,
    breakers: BreakerBoard,
    deadline: float | None = None,
    clock: Callable[[], float] = time.time,
    on_retry: Callable[[str, BaseException], None] | None = None,
) -> T:
    tried: list[str] = []
    offset = breakers.next_offset()

    async def one(number: int) -> T:
        current = list(targets() if callable(targets) else targets)
        if not current:
            raise CircuitOpen([])
        start = (number - 1 + offset) % len(current)
        ordered = current[start:] + current[:start]
        if tried:
            ordered.sort(key=lambda t: tried.count(t))
        for target in ordered:
            breaker = breakers.get(target)
            if breaker.allow():
                break
        else:
            raise CircuitOpen(current)
        tried.append(target)
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

    def retried(number: int, exc: BaseException) -> None:
        if on_retry is not None:
            on_retry(tried[-1] if tried else "", exc)

    effective = _failover_policy(policy)
    return await old_run(effective, one, deadline=deadline, clock=clock, on_retry=retried)


# -- the scenarios -------------------------------------------------------------------------------
class Outcome(enum.Enum):
    OK = "ok"
    UNAVAILABLE = "unavailable"  # RemoteError, retried
    REJECTED = "rejected"  # RemoteError, an answer: never retried
    CONNECTION = "connection"  # a builtin ConnectionError: retried
    TIMEOUT = "timeout"  # a raw TimeoutError from the attempt (retried; the deadline's form)
    VALUE = "value"  # any other error: never retried
    CANCEL = "cancel"  # the attempt cancelled (the breaker's probe released)
    SUSPEND = "suspend"  # an answer after the loop ran once (the try awaited for real)


URLS = ("http://a:1", "http://b:2", "http://c:3")


@dataclass
class Call:
    targets: list[str]
    dynamic: bool  # re-read per try: the list loses its first instance after each
    outcomes: list[Outcome]
    deadline: str  # "none", "past", "ahead", "soon" (passed by the fake clock's backoffs)
    advance: float  # the breakers' clock moved before the call


calls = st.lists(
    st.builds(
        Call,
        targets=st.lists(st.sampled_from(URLS), max_size=3),
        dynamic=st.booleans(),
        outcomes=st.lists(st.sampled_from(list(Outcome)), min_size=1, max_size=5),
        deadline=st.sampled_from(["none", "past", "ahead", "soon"]),
        advance=st.sampled_from([0.0, 0.0, 4.0, 11.0]),
    ),
    min_size=1,
    max_size=8,
)


def describe(exc: BaseException) -> tuple[Any, ...]:
    cause = exc.__cause__
    return (
        type(exc).__name__,
        str(exc),
        reason_of(exc),
        getattr(exc, "targets", None),
        None if cause is None else (type(cause).__name__, str(cause)),
    )


async def play(
    run: Callable[..., Awaitable[Any]], board: BreakerBoard, script: list[Call], attempts: int
) -> list[Any]:
    """``script``'s calls one after the other through ``run``; everything they did."""
    clock = {"now": 1000.0}
    changes: list[Any] = []
    board.clock = lambda: clock["now"]
    board.add_listener(lambda target, state: changes.append((target, state)))
    trace: list[Any] = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock["now"] += seconds

    policy = RetryPolicy(
        attempts=attempts,
        initial_delay=0.1,
        max_delay=1.0,
        sleep=sleep,
        rng=random.Random(7),
    )
    for call in script:
        clock["now"] += call.advance
        outcomes = iter(call.outcomes)
        tried: list[str] = []
        retries: list[Any] = []

        async def attempt(target: str, tried: list[str] = tried, outcomes: Any = outcomes) -> str:
            tried.append(target)
            outcome = next(outcomes, Outcome.OK)
            if outcome is Outcome.OK:
                return f"answer of {target}"
            if outcome is Outcome.SUSPEND:
                await asyncio.sleep(0)
                return f"later answer of {target}"
            if outcome is Outcome.UNAVAILABLE:
                raise RemoteError("down", peer="p", skill="s", reason="unavailable")
            if outcome is Outcome.REJECTED:
                raise RemoteError("no", peer="p", skill="s", reason="rejected")
            if outcome is Outcome.CONNECTION:
                raise ConnectionError("refused")
            if outcome is Outcome.TIMEOUT:
                raise TimeoutError("one attempt's own")
            if outcome is Outcome.CANCEL:
                raise asyncio.CancelledError()
            raise ValueError("a bug")

        current = list(call.targets)

        def targets(current: list[str] = current) -> list[str]:
            seen = list(current)
            if current:
                current.pop(0)
            return seen

        deadline = {
            "none": None,
            "past": clock["now"] - 1,
            "ahead": clock["now"] + 100,
            "soon": clock["now"] + 0.15,
        }[call.deadline]
        try:
            result: Any = await run(
                targets if call.dynamic else list(call.targets),
                attempt,
                policy=policy,
                breakers=board,
                deadline=deadline,
                clock=lambda: clock["now"],
                on_retry=lambda target, exc, seen=retries: seen.append((target, describe(exc))),
            )
        except asyncio.CancelledError:
            result = "cancelled"
        except Exception as exc:
            result = describe(exc)
        breakers = {
            target: (b.failures, b._state, b._probe_in_flight, b._opened_at, b.state)
            for target, b in sorted(board._breakers.items())
        }
        trace.append((result, tried, retries, list(sleeps), breakers, list(changes)))
    return trace


@settings(max_examples=300, deadline=None)
@given(script=calls, attempts=st.integers(min_value=1, max_value=4))
def test_call_with_failover_decides_as_before(script: list[Call], attempts: int) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        new = await play(call_with_failover, BreakerBoard(), script, attempts)
        old = await play(old_call_with_failover, OldBoard(), script, attempts)
        return new, old

    new, old = asyncio.run(both())
    assert new == old


@pytest.mark.parametrize("deadline", [None, 0.05])
async def test_the_deadline_ends_a_hung_first_try_as_before(deadline: float | None) -> None:
    """A first try still running at the deadline: DeadlineExceeded caused by the TimeoutError,
    its breaker released (not a failure); with no deadline, a per-attempt timeout's raw
    TimeoutError is retried at the next instance."""

    async def hang(target: str) -> str:
        if target == URLS[0]:
            await asyncio.Event().wait()
        return target

    seen = []
    for run, board in ((call_with_failover, BreakerBoard()), (old_call_with_failover, OldBoard())):
        policy = RetryPolicy(attempts=2, attempt_timeout=0.05, sleep=_no_sleep)
        started = time.time()
        try:
            result: Any = await run(
                list(URLS[:2]),
                hang,
                policy=policy,
                breakers=board,
                deadline=None if deadline is None else started + deadline,
            )
        except Exception as exc:
            result = describe(exc)
        seen.append((result, {t: (b.failures, b._state) for t, b in board._breakers.items()}))
    assert seen[0] == seen[1]


async def _no_sleep(seconds: float) -> None:
    return None


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


ops = st.lists(
    st.sampled_from(["allow", "success", "failure", "release", "tick", "state"]), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, threshold=st.integers(min_value=1, max_value=3))
def test_a_breaker_moves_as_before(ops: list[str], threshold: int) -> None:
    """Any sequence of a breaker's calls: the same answers, states and changes told."""
    runs = []
    for kind in (CircuitBreaker, OldBreaker):
        now = FakeClock()
        told: list[BreakerState] = []
        breaker: Any = kind(
            failure_threshold=threshold,
            cool_down=10.0,
            clock=now,
            on_change=told.append,
        )
        seen = []
        for op in ops:
            if op == "allow":
                seen.append(breaker.allow())
            elif op == "success":
                breaker.record_success()
            elif op == "failure":
                breaker.record_failure()
            elif op == "release":
                breaker.release()
            elif op == "tick":
                now.t += 6.0
            else:
                seen.append(breaker.state)
            seen.append((breaker.failures, breaker._state, breaker._probe_in_flight, list(told)))
        runs.append(seen)
    assert runs[0] == runs[1]
