"""Retry policy (injected sleep), failover and the circuit breaker; which failures are retried,
decided by their reason, for errors httpx itself raised (real requests on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from mesh._a2a.bounded import AnswerTooLarge
from mesh._errors import RemoteError, RemoteReason
from mesh._failures import reason_of
from mesh._resilience import (
    BreakerBoard,
    BreakerState,
    CircuitBreaker,
    CircuitOpen,
    DeadlineExceeded,
    RetryPolicy,
    call_with_failover,
    is_retryable,
)
from tests.raw_http import answer, raw_server
from tests.support import free_port


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """An injected sleep that records the delays and advances a fake clock."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.delays: list[float] = []
        self.clock = clock

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.clock is not None:
            self.clock.now += seconds


def status_error(status: int) -> httpx.HTTPStatusError:
    """The error httpx raises for an answer with ``status``."""
    response = httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1:9/"))
    with pytest.raises(httpx.HTTPStatusError) as info:
        response.raise_for_status()
    return info.value


def unavailable() -> RemoteError:
    return RemoteError("down", peer="p", skill="s", reason="unavailable")


# --- classification ----------------------------------------------------------------------


async def _hang(target: str, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


async def _hang_up(target: str, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _raised(url: str, *, read_s: float = 5.0) -> httpx.HTTPError:
    """What httpx raises for a POST to ``url`` (an answer's status included)."""
    async with httpx.AsyncClient(timeout=read_s, trust_env=False) as http:
        with pytest.raises(httpx.HTTPError) as info:
            (await http.post(url, content=b"{}")).raise_for_status()
    return info.value


@pytest.mark.integration
async def test_real_httpx_errors_are_retried_by_their_reason() -> None:
    """What httpx raises on real connections: an outage is retried (maybe at another
    instance), an answer never is, and a read timeout is the call's deadline."""
    caught: dict[str, BaseException] = {
        "refused": await _raised(f"http://127.0.0.1:{free_port()}/"),
        "connect timeout": httpx.ConnectTimeout("timed out"),  # loopback always connects
        "too large": AnswerTooLarge(1024),
    }
    async with raw_server(_hang) as slow, raw_server(_hang_up) as rude:
        caught["read timeout"] = await _raised(slow.url, read_s=0.2)
        caught["hung up"] = await _raised(rude.url)
    for status in (401, 403, 404, 405, 429, 500, 502, 503, 504):
        async with raw_server(answer(status, b"{}")) as server:
            caught[str(status)] = await _raised(server.url)
    assert type(caught["refused"]) is httpx.ConnectError
    assert type(caught["read timeout"]) is httpx.ReadTimeout
    assert type(caught["hung up"]) is httpx.RemoteProtocolError
    expected: dict[str, RemoteReason] = {
        "refused": "unavailable",
        "connect timeout": "unavailable",
        "too large": "unavailable",
        "read timeout": "deadline",
        "hung up": "unavailable",
        "401": "rejected",
        "403": "rejected",
        "404": "unavailable",
        "405": "unavailable",
        "429": "failed",
        "500": "failed",
        "502": "unavailable",
        "503": "unavailable",
        "504": "unavailable",
    }
    assert {name: reason_of(exc) for name, exc in caught.items()} == expected
    assert {name: is_retryable(exc) for name, exc in caught.items()} == {
        name: reason == "unavailable" for name, reason in expected.items()
    }


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),  # one attempt's own timeout: another instance may answer
        (unavailable(), True),
        (RemoteError("no", peer="p", skill="s", reason="rejected"), False),
        (RemoteError("no", peer="p", skill="s", reason="failed"), False),
        (RemoteError("slow", peer="p", skill="s", reason="deadline"), False),
        (DeadlineExceeded("late"), False),
        (CircuitOpen(["http://a"]), True),
        (ValueError("bug"), False),
    ],
)
def test_is_retryable(exc: BaseException, expected: bool) -> None:
    assert is_retryable(exc) is expected


# --- retry policy ------------------------------------------------------------------------


def test_backoff_is_exponential_capped_and_jittered() -> None:
    policy = RetryPolicy(initial_delay=0.1, multiplier=2, max_delay=0.5, jitter=0.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    jittered = RetryPolicy(initial_delay=0.1, jitter=0.05, rng=random.Random(7))
    values = [jittered.delay(1) for _ in range(50)]
    assert all(0.1 <= v <= 0.15 for v in values)
    assert len(set(values)) > 1


async def test_retries_transient_errors_with_backoff_then_succeeds() -> None:
    sleeps = Sleeps()
    policy = RetryPolicy(attempts=4, initial_delay=0.1, jitter=0.0, sleep=sleeps)
    calls: list[int] = []
    retries: list[tuple[int, int]] = []

    async def attempt(n: int) -> str:
        calls.append(n)
        if n < 3:
            raise status_error(503)
        return "ok"

    def retried(n: int, exc: BaseException) -> None:
        assert isinstance(exc, httpx.HTTPStatusError)
        retries.append((n, exc.response.status_code))

    result = await policy.run(attempt, on_retry=retried)
    assert result == "ok"
    assert calls == [1, 2, 3]
    assert sleeps.delays == pytest.approx([0.1, 0.2])
    assert retries == [(1, 503), (2, 503)]


async def test_gives_up_after_attempts_and_reraises_last_error() -> None:
    sleeps = Sleeps()
    policy = RetryPolicy(attempts=3, sleep=sleeps)
    calls = 0

    async def attempt(n: int) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError(f"try {n}")

    with pytest.raises(ConnectionRefusedError, match="try 3"):
        await policy.run(attempt)
    assert calls == 3
    assert len(sleeps.delays) == 2


async def test_does_not_retry_answers_from_a_healthy_peer() -> None:
    sleeps = Sleeps()
    calls = 0

    async def attempt(n: int) -> None:
        nonlocal calls
        calls += 1
        raise RemoteError("bad input", peer="p", skill="s", reason="rejected")

    with pytest.raises(RemoteError, match="bad input"):
        await RetryPolicy(sleep=sleeps).run(attempt)
    assert calls == 1
    assert sleeps.delays == []


async def test_stops_when_the_next_try_would_miss_the_deadline() -> None:
    clock = FakeClock()
    sleeps = Sleeps(clock)
    policy = RetryPolicy(attempts=10, initial_delay=1.0, jitter=0.0, sleep=sleeps)
    calls = 0

    async def attempt(n: int) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError()

    with pytest.raises(ConnectionRefusedError):
        await policy.run(attempt, deadline=clock.now + 3.5, clock=clock)
    # Tries at t=0, 1, 3; the next would start at t=7, past the deadline.
    assert calls == 3
    assert sleeps.delays == [1.0, 2.0]


async def test_an_attempt_running_past_the_deadline_is_cut() -> None:
    import time

    async def attempt(n: int) -> None:
        await asyncio.sleep(10)

    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await RetryPolicy().run(attempt, deadline=time.time() + 0.2)
    assert time.monotonic() - start < 2


# --- circuit breaker ---------------------------------------------------------------------


def test_breaker_opens_after_threshold_and_probes_after_cool_down() -> None:
    clock = FakeClock()
    changes: list[BreakerState] = []
    breaker = CircuitBreaker(
        failure_threshold=3, cool_down=5.0, clock=clock, on_change=changes.append
    )
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()

    clock.now += 5.0
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the one probe
    assert not breaker.allow()  # a second caller waits for the probe's verdict
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN  # a failed probe re-opens at once

    clock.now += 5.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.failures == 0
    assert changes == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]


def test_success_resets_the_consecutive_failure_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2)
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED


def test_cancelled_probe_frees_the_slot() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=1, cool_down=1.0, clock=clock)
    breaker.record_failure()
    clock.now += 1.0
    assert breaker.allow()
    breaker.release()
    assert breaker.allow()


# --- failover ----------------------------------------------------------------------------


async def test_failover_moves_to_another_instance() -> None:
    sleeps = Sleeps()
    board = BreakerBoard(failure_threshold=1, cool_down=60)
    seen: list[str] = []
    retried: list[str] = []

    async def attempt(url: str) -> str:
        seen.append(url)
        if url == "http://a":
            raise ConnectionRefusedError("a is down")
        return f"answer from {url}"

    for _ in range(3):
        result = await call_with_failover(
            ["http://a", "http://b"],
            attempt,
            policy=RetryPolicy(sleep=sleeps),
            breakers=board,
            on_retry=lambda target, exc: retried.append(target),
        )
        assert result == "answer from http://b"
    # "a" was tried at most once: its breaker opened after that failure.
    assert seen.count("http://a") == 1
    assert retried == ["http://a"]
    assert board.states() == {"http://a": "open", "http://b": "closed"}


async def test_all_breakers_open_raises_circuit_open_without_calling() -> None:
    board = BreakerBoard(failure_threshold=1, cool_down=60)
    board.get("http://a").record_failure()
    board.get("http://b").record_failure()
    called = False

    async def attempt(url: str) -> str:
        nonlocal called
        called = True
        return "x"

    with pytest.raises(CircuitOpen):
        await call_with_failover(
            ["http://a", "http://b"],
            attempt,
            policy=RetryPolicy(attempts=2, sleep=Sleeps()),
            breakers=board,
        )
    assert not called


async def test_rejection_does_not_trip_the_breaker() -> None:
    board = BreakerBoard(failure_threshold=1)

    async def attempt(url: str) -> str:
        raise RemoteError("bad", peer="p", skill="s", reason="rejected")

    for _ in range(3):
        with pytest.raises(RemoteError):
            await call_with_failover(
                ["http://a"], attempt, policy=RetryPolicy(sleep=Sleeps()), breakers=board
            )
    assert board.states() == {"http://a": "closed"}


async def test_hung_instance_times_out_and_fails_over() -> None:
    board = BreakerBoard(failure_threshold=1)

    async def attempt(url: str) -> str:
        if url == "http://slow":
            await asyncio.sleep(30)
        return url

    results = set()
    for _ in range(2):
        results.add(
            await call_with_failover(
                ["http://slow", "http://fast"],
                attempt,
                policy=RetryPolicy(attempt_timeout=0.1, sleep=Sleeps()),
                breakers=board,
            )
        )
    assert results == {"http://fast"}


async def test_cancellation_propagates_and_releases_the_probe() -> None:
    clock = FakeClock()
    board = BreakerBoard(failure_threshold=1, cool_down=1.0, clock=clock)
    board.get("http://a").record_failure()
    clock.now += 1.0
    started = asyncio.Event()

    async def attempt(url: str) -> str:
        started.set()
        await asyncio.sleep(30)
        return url

    task = asyncio.create_task(
        call_with_failover(
            ["http://a"], attempt, policy=RetryPolicy(sleep=Sleeps()), breakers=board
        )
    )
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert board.get("http://a").allow()


def test_a_board_forgets_the_breakers_of_targets_it_no_longer_has() -> None:
    board = BreakerBoard(failure_threshold=1)
    board.get("http://a").record_failure()
    board.get("http://b")
    assert board.state("http://a") is BreakerState.OPEN
    assert board.state("http://never") is BreakerState.CLOSED  # asking makes no breaker
    board.retain(["http://b", "http://c"])
    assert board.states() == {"http://b": "closed"}
    assert board.state("http://a") is BreakerState.CLOSED


async def test_a_first_attempt_that_succeeds_skips_the_retry_loop_and_a_failed_one_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first attempt runs outside tenacity (its cost is in every delegation); a retryable
    # failure of it must still be retried, with the same waits and on_retry as before.
    import mesh._resilience as resilience

    built: list[int] = []
    real = resilience.AsyncRetrying

    def counting(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(resilience, "AsyncRetrying", counting)
    sleeps = Sleeps()
    policy = RetryPolicy(attempts=3, initial_delay=0.1, jitter=0.0, sleep=sleeps)
    calls: list[int] = []

    async def ok(n: int) -> str:
        calls.append(n)
        return "ok"

    assert await policy.run(ok) == "ok"
    assert (calls, built, sleeps.delays) == ([1], [], [])

    retries: list[tuple[int, str]] = []

    async def flaky(n: int) -> str:
        calls.append(n)
        if n == 1:
            raise ConnectionRefusedError("first")
        return "second"

    calls.clear()
    got = await policy.run(flaky, on_retry=lambda n, exc: retries.append((n, str(exc))))
    assert got == "second"
    assert calls == [1, 2]
    assert retries == [(1, "first")]
    assert sleeps.delays == pytest.approx([0.1])

    async def refused(n: int) -> str:
        raise ConnectionRefusedError(f"try {n}")

    with pytest.raises(ConnectionRefusedError, match="try 1"):
        await RetryPolicy(attempts=1, sleep=sleeps).run(refused)
