"""``InFlight``: the count of work in progress, and the wait until none is (its event made only
for a wait)."""

from __future__ import annotations

import asyncio

from mesh._inflight import InFlight


async def test_idle_at_once_when_nothing_runs() -> None:
    running = InFlight()
    assert await running.wait_idle(0.01)
    with running:
        assert running.count == 1
    assert running.count == 0
    assert await running.wait_idle(0.01)


async def test_waiters_go_on_when_the_last_work_ends() -> None:
    running = InFlight()
    running.begin()
    running.begin()
    first = asyncio.ensure_future(running.wait_idle(5))
    second = asyncio.ensure_future(running.wait_idle(5))
    await asyncio.sleep(0)
    running.end()
    await asyncio.sleep(0)
    assert not first.done()
    assert not second.done()
    running.end()
    assert await first
    assert await second


async def test_a_wait_after_an_earlier_idle_waits_for_the_new_work() -> None:
    running = InFlight()
    running.begin()
    waiting = asyncio.ensure_future(running.wait_idle(5))
    await asyncio.sleep(0)
    running.end()
    assert await waiting  # the event is set now
    running.begin()
    assert not await running.wait_idle(0.02)  # not idle: the set event of before is not it
    running.end()
    assert await running.wait_idle(0.02)
