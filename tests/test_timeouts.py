"""mesh._timeouts.timeout behaves as asyncio.timeout, with one loop timer for all deadlines."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from mesh import _timeouts
from mesh._timeouts import timeout

KINDS: list[Callable[[float | None], Any]] = [asyncio.timeout, timeout]


def _run(main: Callable[[], Any], *, uv: bool = False) -> Any:
    if uv:
        return uvloop.run(main())
    return asyncio.run(main())


@pytest.mark.parametrize("uv", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_it_expires_as_asyncio_timeout_does(kind: Callable[[float | None], Any], uv: bool) -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            async with kind(0.05):
                await asyncio.sleep(5)
        took = loop.time() - started
        seen.append("expired" if 0.04 <= took < 1 else f"took {took}")
        async with kind(1):  # not due: nothing happens
            await asyncio.sleep(0.01)
        seen.append("kept")
        async with kind(None):
            await asyncio.sleep(0.01)
        seen.append("none")
        try:
            async with kind(0):  # due at once: at the next await
                seen.append("inside")
                await asyncio.sleep(1)
        except TimeoutError as exc:
            seen.append(f"zero {type(exc.__cause__).__name__}")
        try:
            async with kind(-1):
                seen.append("negative")
                await asyncio.sleep(1)
        except TimeoutError:
            seen.append("negative expired")
        return seen

    assert _run(main, uv=uv) == [
        "expired",
        "kept",
        "none",
        "inside",
        "zero CancelledError",
        "negative",
        "negative expired",
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_nested_deadlines_each_raise_their_own(kind: Callable[[float | None], Any]) -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        # The inner expires first: its TimeoutError, caught inside the outer.
        async with kind(5):
            try:
                async with kind(0.02):
                    await asyncio.sleep(5)
            except TimeoutError:
                seen.append("inner")
        # The outer expires first: the inner lets the cancellation through.
        try:
            async with kind(0.02):
                try:
                    async with kind(5):
                        await asyncio.sleep(5)
                except TimeoutError:
                    seen.append("inner wrongly")
        except TimeoutError:
            seen.append("outer")
        # Both at once: the outer's (the inner sees a second cancellation).
        loop = asyncio.get_running_loop()
        try:
            async with kind(0.02), kind(0.02):
                await asyncio.sleep(5)
        except TimeoutError:
            seen.append("both")
        assert loop.time() > 0
        return seen

    assert _run(main) == ["inner", "outer", "both"]


@pytest.mark.parametrize("kind", KINDS)
def test_another_cancellation_is_not_a_timeout(kind: Callable[[float | None], Any]) -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def body() -> None:
            async with kind(0.05):
                await asyncio.sleep(5)

        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            seen.append("canceled")

        # The deadline's cancellation swallowed by the body: it ends normally, uncancelled.
        async def swallowing() -> int:
            async with kind(0.01):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(5)
            current = asyncio.current_task()
            assert current is not None
            return current.cancelling()

        seen.append(f"swallowed {await asyncio.ensure_future(swallowing())}")
        return seen

    assert _run(main) == ["canceled", "swallowed 0"]


def test_one_loop_timer_serves_deadlines_set_one_after_another() -> None:
    """The point of it: deadlines of one length set in turn arm one timer, not one each
    (asyncio.timeout arms 50 here)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal armed
            armed += 1
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting  # type: ignore[method-assign]
        for _ in range(50):
            with timeout(30):
                await asyncio.sleep(0)
        return armed

    assert _run(main) == 1


def test_deadlines_left_early_are_dropped_from_the_heap() -> None:
    async def main() -> tuple[int, list[str]]:
        seen: list[str] = []

        # A long one still running while many short ones come and go.
        async def long() -> None:
            try:
                async with timeout(0.3):
                    await asyncio.sleep(5)
            except TimeoutError:
                seen.append("long expired")

        task = asyncio.ensure_future(long())
        await asyncio.sleep(0)
        for _ in range(1000):
            async with timeout(3600):
                await asyncio.sleep(0)
        wheel = _timeouts._wheel(asyncio.get_running_loop())
        kept = len(wheel.heap)
        await task
        return kept, seen

    kept, seen = _run(main)
    assert kept <= 2 * _timeouts._STALE_KEPT + 2
    assert seen == ["long expired"]


def test_each_loop_has_its_own_deadlines() -> None:
    async def main() -> str:
        try:
            async with timeout(0.02):
                await asyncio.sleep(5)
        except TimeoutError:
            return "expired"
        return "not expired"

    assert [_run(main), _run(main, uv=True), _run(main)] == ["expired"] * 3


def test_a_plain_with_in_a_task_is_the_same_timeout() -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        try:
            with timeout(0.02):
                await asyncio.sleep(5)
        except TimeoutError:
            seen.append("expired")
        with timeout(5):
            await asyncio.sleep(0)
        seen.append("kept")
        return seen

    assert _run(main, uv=True) == ["expired", "kept"]
    with pytest.raises(RuntimeError):  # outside a task, as asyncio.timeout refuses
        asyncio.run(_outside())


async def _outside() -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, _enter_in_thread)


def _enter_in_thread() -> None:
    with timeout(1):
        pass


AT_KINDS: list[Callable[[float | None], Any]] = [asyncio.timeout_at, _timeouts.timeout_at]


@pytest.mark.parametrize("uv", [False, True])
@pytest.mark.parametrize("kind", AT_KINDS)
def test_timeout_at_expires_and_is_moved_as_asyncio_timeout_at(
    kind: Callable[[float | None], Any], uv: bool
) -> None:
    """What the executor asks of a turn's scope: its loop time, ``reschedule`` (to now: cut at
    once, as ``stop()`` does; later; None) and ``expired()``."""

    async def main() -> list[str]:
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            async with kind(started + 0.05) as scope:
                await asyncio.sleep(5)
        took = loop.time() - started
        seen.append(f"expired {scope.expired()}" if 0.04 <= took < 1 else f"took {took}")
        async with kind(None) as scope:
            await asyncio.sleep(0.01)
        seen.append(f"none {scope.expired()}")
        try:
            async with kind(loop.time() - 1):  # past: due at the next await
                seen.append("inside")
                await asyncio.sleep(1)
        except TimeoutError:
            seen.append("past expired")
        try:
            async with kind(loop.time() + 5) as scope:
                await asyncio.sleep(0.01)
                scope.reschedule(loop.time())  # what stop() does
                seen.append(f"moved to now {scope.expired()}")
                await asyncio.sleep(1)
        except TimeoutError:
            seen.append(f"cut {scope.expired()}")
        # Moved later: its first time passes without it firing; moved to None: never fires.
        async with kind(loop.time() + 0.02) as scope:
            scope.reschedule(loop.time() + 5)
            await asyncio.sleep(0.1)
        seen.append(f"later kept {scope.expired()}")
        async with kind(loop.time() + 0.02) as scope:
            scope.reschedule(None)
            await asyncio.sleep(0.1)
        seen.append("none kept")
        # Moved sooner: it fires at its new time.
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            async with kind(started + 5) as scope:
                scope.reschedule(started + 0.03)
                await asyncio.sleep(5)
        took = loop.time() - started
        seen.append("sooner" if 0.02 <= took < 1 else f"took {took}")
        # Moved to now, then away again before the loop runs: not cut.
        async with kind(loop.time() + 5) as scope:
            scope.reschedule(loop.time())
            scope.reschedule(loop.time() + 5)
            await asyncio.sleep(0.01)
        seen.append("taken back")
        return seen

    assert _run(main, uv=uv) == [
        "expired True",
        "none False",
        "inside",
        "past expired",
        "moved to now False",
        "cut True",
        "later kept False",
        "none kept",
        "sooner",
        "taken back",
    ]


@pytest.mark.parametrize("kind", AT_KINDS)
def test_timeout_at_refuses_to_move_as_asyncio_timeout_at(
    kind: Callable[[float | None], Any],
) -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        made = kind(None)
        for scope in (made,):
            try:
                scope.reschedule(loop.time())
            except RuntimeError as exc:
                seen.append(str(exc))
        async with kind(loop.time() + 5) as left:
            pass
        with contextlib.suppress(TimeoutError):
            async with kind(loop.time()) as cut:
                await asyncio.sleep(1)
        for scope in (left, cut):
            try:
                scope.reschedule(None)
            except RuntimeError as exc:
                seen.append(str(exc))
        seen.append(f"{left.expired()} {cut.expired()}")
        return seen

    assert _run(main) == [
        "Timeout has not been entered",
        "Cannot change state of finished Timeout",
        "Cannot change state of expired Timeout",
        "False True",
    ]


def test_moved_deadlines_do_not_fire_at_their_old_time_nor_fill_the_heap() -> None:
    """A deadline moved many times leaves its old entries in the heap: none of them cuts the
    task, and they are dropped with the other stale ones."""

    async def main() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        wheel = None
        with _timeouts.timeout_at(loop.time() + 0.01) as scope:
            wheel = _timeouts._wheel(loop)
            for i in range(1000):
                scope.reschedule(loop.time() + 0.02 + i * 1e-6)
            scope.reschedule(loop.time() + 5)
            await asyncio.sleep(0.1)
        return scope.expired(), len(wheel.heap)

    expired, kept = _run(main)
    assert not expired
    assert kept <= 2 * _timeouts._STALE_KEPT + 2
