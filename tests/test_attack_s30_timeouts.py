"""Attack cases (session 30) on mesh._timeouts.timeout that hold: the same outcome as
asyncio.timeout where expiry meets another cancellation, another exception, a nested deadline
due at once, or a block already left; the next real deadline on time after the one timer fired
for a stale one; the heap bounded under many long deadlines left early; loops in threads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from mesh import _timeouts
from mesh._timeouts import timeout

KINDS: list[Callable[[float | None], Any]] = [asyncio.timeout, timeout]


def _run(main: Callable[[], Any], uv: bool) -> Any:
    return uvloop.run(main()) if uv else asyncio.run(main())


def _name(exc: BaseException | None) -> str:
    return type(exc).__name__


@pytest.mark.parametrize("uv", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_expiry_meeting_other_events_ends_as_asyncio_timeout(
    kind: Callable[[float | None], Any], uv: bool
) -> None:
    async def main() -> list[Any]:
        seen: list[Any] = []
        loop = asyncio.get_running_loop()

        # An outside cancel due in the same iteration as the expiry: a cancellation.
        async def cancelled_at_expiry() -> None:
            async with kind(0.02):
                await asyncio.sleep(1)

        task = asyncio.create_task(cancelled_at_expiry())
        await asyncio.sleep(0)
        loop.call_at(loop.time() + 0.02, task.cancel)
        # The loop held past both: they are due in one iteration however loaded the host is
        # (else the expiry may run an iteration before the cancel, and the task ends first).
        time.sleep(0.05)  # noqa: ASYNC251
        try:
            await task
        except BaseException as exc:
            seen.append(("both", _name(exc), task.cancelling()))

        # Another exception leaving the block while it expires: that one, uncancelled.
        try:
            async with kind(0.01):
                try:
                    await asyncio.sleep(1)
                finally:
                    raise ValueError("cleanup failed")
        except BaseException as exc:
            seen.append(("other", _name(exc), asyncio.current_task().cancelling()))  # type: ignore[union-attr]

        # Nested deadlines both overdue when the loop next looks: the outer's timeout.
        nested: list[str] = []
        try:
            async with kind(0.02):
                try:
                    async with kind(0.01):
                        time.sleep(0.04)  # noqa: ASYNC251 - the loop held past both deadlines
                        await asyncio.sleep(1)
                except BaseException as exc:
                    nested.append(f"inner {_name(exc)}")
                    raise
        except BaseException as exc:
            nested.append(f"outer {_name(exc)}")
        seen.append(nested)

        # Left before its time: nothing happens at its time.
        async with kind(0.01):
            pass
        await asyncio.sleep(0.03)
        seen.append(("left", asyncio.current_task().cancelling()))  # type: ignore[union-attr]
        return seen

    assert _run(main, uv) == [
        ("both", "CancelledError", 1),
        ("other", "ValueError", 0),
        ["inner CancelledError", "outer TimeoutError"],
        ("left", 0),
    ]


@pytest.mark.parametrize("uv", [False, True])
def test_the_next_deadline_is_on_time_after_the_timer_fired_for_a_stale_one(uv: bool) -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        for i in range(200):  # the timer is armed for the first of these, all left at once
            with timeout(0.02 + i * 0.0001):
                pass
        started = loop.time()
        try:
            with timeout(0.1):
                await asyncio.sleep(2)
        except TimeoutError:
            return loop.time() - started
        return -1.0

    took = _run(main, uv)
    assert 0.09 <= took < 0.5


@pytest.mark.parametrize("uv", [False, True])
def test_many_long_deadlines_left_early_keep_the_heap_small(uv: bool) -> None:
    async def main() -> tuple[int, int]:
        wheel = None
        peak = 0
        for _ in range(20_000):
            with timeout(30):
                await asyncio.sleep(0)
            wheel = wheel or _timeouts._wheel(asyncio.get_running_loop())
            peak = max(peak, len(wheel.heap))
        assert wheel is not None
        return peak, len(wheel.heap)

    peak, left = _run(main, uv)
    assert peak <= 2 * _timeouts._STALE_KEPT + 2
    assert left <= peak


def test_a_loop_per_thread_at_once_each_expires_its_own() -> None:
    results: list[Any] = []

    async def work() -> str:
        loop = asyncio.get_running_loop()
        for _ in range(50):
            with timeout(30):
                await asyncio.sleep(0.001)
        started = loop.time()
        try:
            with timeout(0.05):
                await asyncio.sleep(2)
        except TimeoutError:
            return "expired" if loop.time() - started < 1 else "late"
        return "kept"

    def thread(uv: bool) -> None:
        results.append(_run(work, uv))

    threads = [threading.Thread(target=thread, args=(i % 2 == 0,)) for i in range(4)]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    assert results == ["expired"] * 4


# The four the attack broke, fixed (session 30).


async def _fired(delay: float) -> bool:
    """Whether a deadline of ``delay`` around a 1 s sleep expires (else the sleep ends)."""
    try:
        with timeout(delay):
            await asyncio.sleep(1)
    except TimeoutError:
        return True
    return False


@pytest.mark.parametrize("uv", [False, True])
def test_a_loop_that_had_deadlines_is_not_kept(uv: bool) -> None:
    import gc
    import weakref

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        # Left early: its slot stays in the heap, the loop's one timer armed for it.
        with timeout(30):
            await asyncio.sleep(0)

    for _ in range(20):
        _run(main, uv)
    gc.collect()
    assert [r for r in loops if r() is not None] == []


@pytest.mark.parametrize("uv", [False, True])
def test_a_nan_delay_is_due_at_once_and_stops_no_other_deadline(uv: bool) -> None:
    async def main() -> bool:
        with pytest.raises(TimeoutError), timeout(float("nan")):
            await asyncio.sleep(1)
        hang = asyncio.Event()

        async def left_waiting() -> None:
            with timeout(float("nan")):
                await hang.wait()

        other = asyncio.create_task(left_waiting())
        await asyncio.sleep(0)
        started = time.monotonic()
        fired = await _fired(0.05)
        with pytest.raises(TimeoutError):
            await other
        assert time.monotonic() - started < 0.9
        return fired

    assert _run(main, uv)


@pytest.mark.parametrize("uv", [False, True])
def test_a_cancel_that_raises_leaves_the_other_deadlines_their_timer(uv: bool) -> None:
    class Stubborn(asyncio.Future[None]):
        refused = False

        def cancel(self, msg: Any = None) -> bool:
            if not Stubborn.refused:
                Stubborn.refused = True
                raise RuntimeError("this future refuses cancel once")
            return super().cancel(msg=msg)

    async def main() -> bool:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: None)

        async def stubborn() -> None:
            with timeout(0.02):
                await Stubborn()

        first = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        fired = await _fired(0.1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return fired

    assert _run(main, uv)


@pytest.mark.parametrize("kind", KINDS)
def test_one_deadline_is_entered_once(kind: Callable[[float | None], Any]) -> None:
    async def main() -> None:
        once = kind(0.1)
        async with once:
            pass
        with pytest.raises(RuntimeError, match="already been entered"):
            async with once:
                await asyncio.sleep(0)

    asyncio.run(main())


@pytest.mark.parametrize("name", ["deadline_s", "wait_deadline_s", "long_after_s"])
def test_remote_refuses_a_nan_deadline_naming_it(name: str) -> None:
    from mesh._errors import ConfigError
    from mesh._remote import remote

    nan: dict[str, Any] = {name: float("nan")}
    with pytest.raises(ConfigError, match=name):
        remote("bench-bureau", url="http://127.0.0.1:9", **nan)
