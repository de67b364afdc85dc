"""The Consul discovery backend: pure translations, the blocking-query cache, error translation,
and (with a real Consul agent) register / find / heartbeat / deregister."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mesh.discovery.base import Instance, Registration, UnknownInstance
from mesh.discovery.consul import (
    ConsulBackend,
    ConsulCheck,
    QueryCache,
    instance_from_entry,
    parse_consul_url,
    service_registration,
)
from mesh.errors import ConfigError, DiscoveryError
from tests.support import Proc, eventually, free_port, wait_until_ok

REG = Registration(
    instance_id="credit-bureau-7f3a",
    agent="credit-bureau",
    url="http://bureau-a.internal:8101",
    version="1.2.0",
    skills=("credit_report", "chat"),
    tags=("finance", "kyc"),
)


# -- pure parts -----------------------------------------------------------------------------------


def test_parse_consul_url() -> None:
    assert parse_consul_url("consul://consul:8500") == ("http", "consul", 8500)
    assert parse_consul_url("consul://10.0.0.5") == ("http", "10.0.0.5", 8500)
    assert parse_consul_url("consul+https://consul.prod:8501") == ("https", "consul.prod", 8501)


@pytest.mark.parametrize(
    "url", ["http://consul:8500", "consul://", "consul://host:port", "registry"]
)
def test_parse_consul_url_rejects_other_addresses(url: str) -> None:
    with pytest.raises(ConfigError, match="MESH_DISCOVERY"):
        parse_consul_url(url)


def test_service_registration_maps_a_node_to_a_consul_service() -> None:
    check = ConsulCheck(interval="7s", timeout="2s", deregister_after="90s")
    payload = service_registration(REG, check)
    assert payload["name"] == "credit-bureau"
    assert payload["service_id"] == "credit-bureau-7f3a"
    assert payload["address"] == "bureau-a.internal"
    assert payload["port"] == 8101
    assert payload["tags"] == ["credit_report", "chat"]
    assert payload["meta"] == {
        "version": "1.2.0",
        "card_path": "/.well-known/agent-card.json",
        "url": "http://bureau-a.internal:8101",
        "tags": "finance,kyc",
    }
    assert payload["check"]["HTTP"] == "http://bureau-a.internal:8101/health"
    assert payload["check"]["Interval"] == "7s"
    assert payload["check"]["Timeout"] == "2s"
    assert payload["check"]["DeregisterCriticalServiceAfter"] == "90s"


def test_service_registration_default_ports_and_trailing_slash() -> None:
    https = Registration(instance_id="i1", agent="a", url="https://a.example/", version="1")
    payload = service_registration(https)
    assert payload["port"] == 443
    assert payload["check"]["HTTP"] == "https://a.example/health"
    assert payload["meta"]["url"] == "https://a.example"
    assert "tags" not in payload["meta"]
    plain = Registration(instance_id="i2", agent="a", url="http://a.example", version="1")
    assert service_registration(plain)["port"] == 80


def test_service_registration_rejects_an_unroutable_url() -> None:
    bad = Registration(instance_id="i1", agent="a", url="bureau:8101", version="1")
    with pytest.raises(ConfigError, match="MESH_PUBLIC_URL"):
        service_registration(bad)


def _entry(*statuses: str, meta: dict[str, str] | None = None, address: str = "10.1.2.3") -> dict:
    # The shape of one element of GET /v1/health/service/<name> (Consul HTTP API docs).
    return {
        "Node": {"Node": "worker-1", "Address": "10.9.9.9", "Datacenter": "dc1"},
        "Service": {
            "ID": "credit-bureau-7f3a",
            "Service": "credit-bureau",
            "Tags": ["credit_report", "chat"],
            "Address": address,
            "Port": 8101,
            "Meta": meta if meta is not None else {"version": "1.2.0", "card_path": "/c.json"},
        },
        "Checks": [
            {"CheckID": f"c{i}", "Status": status, "ServiceID": ""}
            for i, status in enumerate(statuses)
        ],
    }


def test_instance_from_entry() -> None:
    inst = instance_from_entry(_entry("passing", "passing"))
    assert inst == Instance(
        instance_id="credit-bureau-7f3a",
        agent="credit-bureau",
        url="http://10.1.2.3:8101",
        version="1.2.0",
        status="passing",
        skills=("credit_report", "chat"),
        meta={"version": "1.2.0", "card_path": "/c.json"},
    )


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("passing", "warning"), "warning"),
        (("warning", "critical", "passing"), "critical"),
        (("passing", "maintenance"), "critical"),
        ((), "passing"),
    ],
)
def test_instance_status_is_the_worst_check(statuses: tuple[str, ...], expected: str) -> None:
    inst = instance_from_entry(_entry(*statuses))
    assert inst is not None
    assert inst.status == expected


def test_instance_url_prefers_the_advertised_url_then_node_address() -> None:
    advertised = {"version": "1", "card_path": "/c", "url": "https://bureau.example/mesh"}
    inst = instance_from_entry(_entry("passing", meta=advertised))
    assert inst is not None
    assert inst.url == "https://bureau.example/mesh"
    no_service_address = instance_from_entry(_entry("passing", address=""))
    assert no_service_address is not None
    assert no_service_address.url == "http://10.9.9.9:8101"


def test_non_mesh_services_are_not_instances() -> None:
    assert instance_from_entry(_entry("passing", meta={"version": "1"})) is None
    assert instance_from_entry({"Service": {"ID": "consul", "Service": "consul"}}) is None


def test_register_payload_round_trips_through_a_health_entry() -> None:
    payload = service_registration(REG)
    entry = {
        "Node": {"Address": "10.0.0.1"},
        "Service": {
            "ID": payload["service_id"],
            "Service": payload["name"],
            "Tags": payload["tags"],
            "Address": payload["address"],
            "Port": payload["port"],
            "Meta": payload["meta"],
        },
        "Checks": [{"Status": "passing"}],
    }
    inst = instance_from_entry(entry)
    assert inst is not None
    assert (inst.instance_id, inst.agent, inst.url, inst.version, inst.skills) == (
        REG.instance_id,
        REG.agent,
        REG.url,
        REG.version,
        REG.skills,
    )


# -- the blocking-query cache ---------------------------------------------------------------------


class Source:
    """A versioned value answering like a Consul endpoint: with an index, block until it
    changes or ``wait_s`` passes. Counts direct (index=None) and blocking calls."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.version = 5
        self.direct = 0
        self.blocking: list[str | None] = []
        self.fail: Exception | None = None
        self.cond = threading.Condition()

    def fetch(self, key: str, index: str | None, wait_s: float) -> tuple[str | None, str]:
        with self.cond:
            if index is None:
                self.direct += 1
            else:
                self.blocking.append(index)
                self.cond.wait_for(lambda: self.version != int(index) or self.fail, wait_s)
            if self.fail is not None:
                raise self.fail
            return str(self.version), f"{key}={self.value}"

    def change(self, value: str, *, version: int | None = None) -> None:
        with self.cond:
            self.value = value
            self.version = self.version + 1 if version is None else version
            self.cond.notify_all()

    def break_(self, exc: Exception) -> None:
        with self.cond:
            self.fail = exc
            self.cond.notify_all()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _to_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


@pytest.fixture
def source() -> Iterator[Source]:
    src = Source("v1")
    yield src
    src.break_(RuntimeError("test over"))  # release any daemon thread still blocked


async def test_cache_follows_changes_through_the_watch(source: Source) -> None:
    cache: QueryCache[str, str] = QueryCache(source.fetch, direct=_to_thread, wait_s=5.0)
    try:
        assert await cache.get("bureau") == "bureau=v1"
        await eventually(lambda: len(source.blocking) >= 1)
        assert source.blocking[0] == "5"  # the watch continues from the answer's index
        source.change("v2")
        assert await eventually(lambda: _equals(cache.get("bureau"), "bureau=v2"))
        assert source.direct == 1, "updates must come from the blocking query, not refetches"
    finally:
        await cache.aclose()


async def _equals(value: Awaitable[Any], expected: Any) -> bool:
    return (await value) == expected


async def test_cache_refetches_directly_and_reports_errors_once_the_watch_died(
    source: Source,
) -> None:
    clock = Clock()
    cache: QueryCache[str, str] = QueryCache(
        source.fetch, direct=_to_thread, wait_s=5.0, ttl=2.0, clock=clock
    )
    try:
        assert await cache.get("k") == "k=v1"
        await eventually(lambda: len(source.blocking) >= 1)
        source.break_(ConnectionError("consul went away"))
        clock.now += 2.5  # past the ttl: without a live watch the entry is stale

        async def probe() -> Exception | None:
            try:
                await cache.get("k")
            except ConnectionError as exc:
                return exc
            return None  # still served by the watch until it notices the failure

        error = await eventually(probe)
        assert "consul went away" in str(error)
    finally:
        await cache.aclose()


async def test_cache_restarts_the_index_when_it_goes_backwards(source: Source) -> None:
    cache: QueryCache[str, str] = QueryCache(source.fetch, direct=_to_thread, wait_s=5.0)
    try:
        await cache.get("k")
        await eventually(lambda: len(source.blocking) >= 1)
        source.change("after-restore", version=2)  # e.g. Consul restored from a snapshot
        await eventually(lambda: "0" in source.blocking)
        assert await cache.get("k") == "k=after-restore"
    finally:
        await cache.aclose()


async def test_idle_watch_stops_and_aclose_cancels(source: Source) -> None:
    clock = Clock()
    cache: QueryCache[str, str] = QueryCache(
        source.fetch, direct=_to_thread, wait_s=0.2, idle_after=60.0, clock=clock
    )
    await cache.get("idle")
    await cache.get("busy")
    clock.now += 61  # nobody asked for either for a minute...
    await cache.get("busy")  # ...except this one
    await eventually(lambda: len(source.blocking) >= 4)
    before = len(source.blocking)
    await eventually(lambda: len(source.blocking) >= before + 3)
    tasks = {t.get_name(): t for t in asyncio.all_tasks() if t.get_name().startswith("consul")}
    assert "consul-watch idle" not in tasks, "an unread watch must stop"
    assert not tasks["consul-watch busy"].done()
    await cache.aclose()
    assert tasks["consul-watch busy"].done()
    calls = len(source.blocking)
    assert await cache.get("busy") == "busy=v1"  # still answers, without a new watch
    assert not any(t.get_name().startswith("consul") for t in asyncio.all_tasks() if not t.done())
    assert len(source.blocking) == calls


# -- error translation against a port where nothing listens ---------------------------------------


@pytest.mark.integration
async def test_unreachable_consul_is_a_discovery_error_naming_the_address() -> None:
    port = free_port()
    backend = ConsulBackend(f"consul://127.0.0.1:{port}", timeout_s=2.0)
    try:
        with pytest.raises(DiscoveryError, match=f"(?s)127.0.0.1:{port}.*MESH_DISCOVERY"):
            await backend.find(agent="credit-bureau")
        with pytest.raises(DiscoveryError, match="could not register 'credit-bureau'"):
            await backend.register(REG)
    finally:
        await backend.aclose()


def test_bad_address_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="consul://HOST:8500"):
        ConsulBackend("http://127.0.0.1:8500")


# -- a real Consul agent --------------------------------------------------------------------------

needs_consul = pytest.mark.skipif(
    not os.environ.get("CONSUL_HTTP_ADDR"),
    reason="needs a Consul agent: set CONSUL_HTTP_ADDR=127.0.0.1:8500 to one (e.g. started with "
    "`consul agent -dev`; CONSUL_HTTP_TOKEN too if it enforces ACLs)",
)


def _consul_url() -> str:
    addr = os.environ["CONSUL_HTTP_ADDR"]
    if addr.startswith("https://"):
        return "consul+https://" + addr.removeprefix("https://")
    return "consul://" + addr.removeprefix("http://")


def _health_server(tmp_path: Path, name: str) -> tuple[Proc, str]:
    # A real HTTP server whose GET /health answers 200: what Consul's check needs to see.
    root = tmp_path / name
    root.mkdir()
    (root / "health").write_text("ok")
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    proc = Proc.start([*argv, "--directory", str(root)], name=name, tmp=tmp_path)
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", proc=proc)
    return proc, url


@pytest.mark.consul
@pytest.mark.integration
@needs_consul
async def test_register_find_heartbeat_deregister_on_real_consul(tmp_path: Path) -> None:
    proc, url = _health_server(tmp_path, "node")
    agent = f"mesh-test-{uuid.uuid4().hex[:8]}"
    reg = Registration(
        instance_id=f"{agent}-1", agent=agent, url=url, version="0.9", skills=("score",)
    )
    check = ConsulCheck(interval="1s", timeout="1s", deregister_after="1m")
    backend = ConsulBackend(_consul_url(), token=os.environ.get("CONSUL_HTTP_TOKEN"), check=check)
    try:
        await backend.register(reg)
        found = await eventually(lambda: backend.find(agent=agent), within=20)
        assert [(i.instance_id, i.url, i.version, i.status) for i in found] == [
            (reg.instance_id, url, "0.9", "passing")
        ]
        assert [i.instance_id for i in await eventually(lambda: backend.find(skill="score"))] == [
            reg.instance_id
        ]
        assert await backend.find(agent=agent, skill="no-such-skill") == []
        await backend.heartbeat(reg.instance_id)

        proc.terminate()  # the check fails: the instance leaves the passing answers
        await eventually(lambda: _none_passing(backend, agent), within=20)
        everyone = await backend.find(agent=agent, passing_only=False)
        assert [i.status for i in everyone] == ["critical"]

        await backend.deregister(reg.instance_id)
        with pytest.raises(UnknownInstance):
            await backend.heartbeat(reg.instance_id)
        assert await backend.find(agent=agent, passing_only=False) == []
    finally:
        proc.terminate()
        await backend.deregister(reg.instance_id)
        await backend.aclose()


async def _none_passing(backend: ConsulBackend, agent: str) -> bool:
    return await backend.find(agent=agent) == []
