"""InMemorySessionStore's bounds: an LRU of at most max_sessions, an idle TTL, and never a session
with a turn in it (issue 19 item 3: a coordinator's default store kept every session)."""

from __future__ import annotations

import asyncio

import pytest

from mesh._agent import Agent
from mesh._errors import ConfigError
from mesh._events import Event
from mesh._models.scripted import Call, Rule, Script
from mesh._runner import Runner
from mesh._sessions.memory import InMemorySessionStore
from mesh._tools import tool
from mesh._types import Content


class Clock:
    """A clock the test moves: no sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def user_event(text: str) -> Event:
    return Event(author="user", content=Content.user(text))


async def test_many_sessions_stay_bounded_least_recently_used_go() -> None:
    store = InMemorySessionStore(max_sessions=50, idle_ttl_s=None)
    for i in range(50):
        await store.create("u", f"s{i}")
    await store.get("u", "s0")  # used: now the most recent
    for i in range(50, 1000):
        await store.create("u", f"s{i}")
        assert await store.count() <= 50
    assert await store.count() == 50
    assert await store.get("u", "s1") is None
    assert await store.get("u", "s999") is not None
    # s0 was used after s1..s49 but before s50..: gone by now too; the newest 50 remain.
    assert {i.id for i in await store.list_sessions("u")} == {f"s{i}" for i in range(950, 1000)}


async def test_a_used_session_outlives_older_unused_ones() -> None:
    store = InMemorySessionStore(max_sessions=3, idle_ttl_s=None)
    for sid in ("a", "b", "c"):
        await store.create("u", sid)
    a = await store.get("u", "a")
    assert a is not None
    await store.append_event(a, user_event("hi"))
    await store.create("u", "d")  # b is the least recently used
    assert await store.get("u", "b") is None
    kept = await store.get("u", "a")
    assert kept is not None
    assert len(kept.events) == 1


async def test_the_idle_session_expires() -> None:
    clock = Clock()
    store = InMemorySessionStore(idle_ttl_s=60, clock=clock)
    await store.create("u", "idle")
    await store.create("u", "active")
    for _ in range(5):  # "active" is used every 20 s, "idle" never again
        clock.now += 20
        active = await store.get("u", "active")
        assert active is not None
        await store.append_event(active, user_event("ping"))
    assert await store.get("u", "idle") is None
    assert await store.get("u", "active") is not None
    assert await store.count() == 1
    clock.now += 61
    assert await store.count() == 0


async def test_no_bounds_keeps_everything_and_bad_bounds_are_refused() -> None:
    store = InMemorySessionStore(max_sessions=None, idle_ttl_s=None)
    for i in range(200):
        await store.create("u", f"s{i}")
    assert await store.count() == 200
    with pytest.raises(ConfigError, match="max_sessions"):
        InMemorySessionStore(max_sessions=0)
    with pytest.raises(ConfigError, match="idle_ttl_s"):
        InMemorySessionStore(idle_ttl_s=0)


async def test_a_session_with_a_turn_in_it_is_not_evicted() -> None:
    clock = Clock()
    entered = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def slow_lookup(ref: str) -> dict[str, str]:
        """Look something up, slowly."""
        entered.set()
        await release.wait()
        return {"ref": ref}

    agent = Agent(
        name="clerk",
        instruction="You look things up.",
        tools=[slow_lookup],
        script=Script(
            rules=[
                Rule(
                    when=r"look up (?P<ref>\w+)",
                    steps=[Call("slow_lookup", {"ref": "{ref}"})],
                    answer="found {slow_lookup.ref}",
                )
            ],
            fallback="ok",
        ),
    )
    store = InMemorySessionStore(max_sessions=2, idle_ttl_s=60, clock=clock)
    # Given the store, the runner wires its session locks in: the busy session is kept.
    runner = Runner(agent, sessions=store, env={})
    turn = asyncio.create_task(runner.run(user_id="u", session_id="busy", message="look up r1"))
    await asyncio.wait_for(entered.wait(), 10)
    clock.now += 3600  # far past the TTL, mid-turn
    for i in range(10):  # and far past the count
        await runner.run(user_id="u", session_id=f"other{i}", message="hello")
        assert await store.count() <= 2
    assert await store.get("u", "busy") is not None
    release.set()
    result = await asyncio.wait_for(turn, 10)
    assert result.text == "found r1"
    busy = await store.get("u", "busy")
    assert busy is not None
    assert busy.events[0].author == "user"
    assert busy.events[-1].content is not None
    # Once the turn is over it is an ordinary session: idle long enough, it goes.
    clock.now += 61
    assert await store.get("u", "busy") is None


async def test_a_runner_without_a_store_is_bounded() -> None:
    agent = Agent(name="echo", instruction="Echo.", script=Script(fallback="ok"))
    runner = Runner(agent, env={})
    assert isinstance(runner.sessions, InMemorySessionStore)
    assert runner.sessions.max_sessions == 10_000
    assert runner.sessions.idle_ttl_s == 3600.0
    assert runner.sessions.in_use is not None
