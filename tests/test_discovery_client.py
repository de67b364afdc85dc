"""DiscoveryClient: caching, last known answers, single flight. A scripted in-process backend
stands in for the registry so time and failures are exact (the HTTP path is covered by the
integration tests)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mesh._discovery import DiscoveryClient, Instance, Registration, create_backend
from mesh._discovery.registry_client import RegistryBackend
from mesh._errors import AgentNotFound, ConfigError, DiscoveryError


class ScriptedBackend:
    """Answers ``find`` from ``self.instances``; raises ``self.error`` when set."""

    url = "http://registry.test"

    def __init__(self) -> None:
        self.instances = [Instance("b-1", "bureau", "http://127.0.0.1:1", skills=("score",))]
        self.error: Exception | None = None
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.closed = False

    async def register(self, registration: Registration) -> None: ...

    async def heartbeat(self, instance_id: str) -> None: ...

    async def deregister(self, instance_id: str) -> None: ...

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return [
            i
            for i in self.instances
            if (agent is None or i.agent == agent) and (skill is None or skill in i.skills)
        ]

    async def aclose(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_answers_are_cached_for_the_ttl() -> None:
    backend, clock = ScriptedBackend(), Clock()
    client = DiscoveryClient(backend, ttl_s=3.0, clock=clock)
    first = await client.find(agent="bureau")
    backend.instances = []
    clock.now += 2.9
    assert await client.find(agent="bureau") == first
    assert backend.calls == 1
    clock.now += 0.2
    assert await client.find(agent="bureau") == []
    assert backend.calls == 2
    # Different questions are cached apart.
    await client.find(skill="score")
    assert backend.calls == 3


async def test_last_known_answer_served_while_backend_is_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, clock = ScriptedBackend(), Clock()
    client = DiscoveryClient(backend, ttl_s=1.0, clock=clock)
    known = await client.find(agent="bureau")
    backend.error = DiscoveryError("no registry at http://registry.test")
    with caplog.at_level(logging.INFO, logger="mesh._discovery"):
        for _ in range(3):
            clock.now += 5
            assert await client.find(agent="bureau") == known
        assert backend.calls == 4  # it keeps asking, and keeps serving the last answer
        assert caplog.text.count("serving last known answers") == 1
        backend.error = None
        backend.instances = []
        clock.now += 5
        assert await client.find(agent="bureau") == []
        assert "discovery answering again" in caplog.text


async def test_no_answer_ever_seen_raises() -> None:
    backend = ScriptedBackend()
    backend.error = DiscoveryError("no registry")
    client = DiscoveryClient(backend)
    with pytest.raises(DiscoveryError, match="no registry"):
        await client.find(agent="bureau")


async def test_require_raises_agent_not_found_with_a_hint() -> None:
    client = DiscoveryClient(ScriptedBackend())
    assert [i.instance_id for i in await client.require(agent="bureau")] == ["b-1"]
    with pytest.raises(AgentNotFound) as info:
        await client.require(agent="ghost")
    assert str(info.value) == (
        "no passing agent named 'ghost' in the registry at http://registry.test; "
        "is it running? try: mesh ls"
    )
    with pytest.raises(AgentNotFound, match="offering skill 'fly'"):
        await client.require(skill="fly")


async def test_invalidate_asks_again_but_keeps_the_fallback() -> None:
    backend, clock = ScriptedBackend(), Clock()
    client = DiscoveryClient(backend, ttl_s=60, clock=clock)
    known = await client.find(agent="bureau")
    client.invalidate(agent="bureau")
    await client.find(agent="bureau")
    assert backend.calls == 2
    client.invalidate()
    backend.error = DiscoveryError("down")
    assert await client.find(agent="bureau") == known
    assert backend.calls == 3


async def test_concurrent_misses_share_one_backend_call() -> None:
    backend = ScriptedBackend()
    backend.gate = asyncio.Event()
    client = DiscoveryClient(backend)
    lookups = [asyncio.create_task(client.find(agent="bureau")) for _ in range(5)]
    await asyncio.sleep(0)
    backend.gate.set()
    results = await asyncio.gather(*lookups)
    assert backend.calls == 1
    assert all(r == results[0] for r in results)


async def test_aclose_closes_the_backend() -> None:
    backend = ScriptedBackend()
    await DiscoveryClient(backend).aclose()
    assert backend.closed


async def test_create_backend_picks_by_scheme() -> None:
    backend = create_backend("http://127.0.0.1:8400/", token="t")
    assert isinstance(backend, RegistryBackend)
    assert backend.url == "http://127.0.0.1:8400"
    await backend.aclose()
    with pytest.raises(ConfigError, match="consul://host:8500"):
        create_backend("zookeeper://x")


async def test_an_empty_answer_is_not_kept_for_the_ttl() -> None:
    # Right after a restart the registry may not list the new instance yet: a caller that
    # asked then must find it on its next call, not a TTL later.
    backend, clock = ScriptedBackend(), Clock()
    client = DiscoveryClient(backend, ttl_s=60, clock=clock)
    listed = backend.instances
    backend.instances = []
    with pytest.raises(AgentNotFound):
        await client.require(agent="bureau")
    backend.instances = listed
    assert [i.instance_id for i in await client.require(agent="bureau")] == ["b-1"]
    assert backend.calls == 2
    # A non-empty answer is kept as before.
    await client.require(agent="bureau")
    assert backend.calls == 2


async def test_concurrent_misses_share_an_empty_answer_too() -> None:
    backend = ScriptedBackend()
    backend.instances = []
    backend.gate = asyncio.Event()
    client = DiscoveryClient(backend)
    lookups = [asyncio.create_task(client.find(agent="bureau")) for _ in range(5)]
    await asyncio.sleep(0)
    backend.gate.set()
    assert await asyncio.gather(*lookups) == [[]] * 5
    assert backend.calls == 1
    await client.find(agent="bureau")  # the next lookup asks again
    assert backend.calls == 2
