"""The Consul discovery backend: its translations checked against what a Consul agent answers
(tests/fixtures/consul/, sources in its README), the same answers over HTTP through py-consul
(tests/fakes/consul_server.py), the blocking-query cache, error translation, and (with a real
Consul agent) register / find / heartbeat / deregister."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import threading
import tomllib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh._discovery.base import Instance, Registration, UnknownInstance
from mesh._discovery.consul import (
    ConsulBackend,
    ConsulCheck,
    QueryCache,
    instance_from_entry,
    parse_consul_url,
    service_registration,
)
from mesh._errors import ConfigError, DiscoveryError
from mesh._settings import MeshSettings
from tests.fakes.consul_server import FakeConsul, health_host, real_consul_address, recorded
from tests.support import ROOT, Proc, eventually, free_port, wait_until_ok

REG = Registration(
    instance_id="credit-bureau-7f3a",
    agent="credit-bureau",
    url="http://bureau-a.internal:8101",
    version="1.2.0",
    skills=("credit_report", "chat"),
    tags=("finance", "kyc"),
)


# -- pure parts -----------------------------------------------------------------------------------


def test_the_py_consul_requirement_admits_only_releases_with_what_the_backend_passes() -> None:
    # connections_timeout (ConsulBackend's request timeout) first exists in py-consul 1.8.0: an
    # older release raised TypeError in ConsulBackend() (and set no timeout at all).
    from packaging.requirements import Requirement

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in declared if Requirement(d).name == "py-consul"]
    assert not any(req.specifier.contains(v) for v in ("1.5.0", "1.6.0", "1.7.1")), req
    assert req.specifier.contains("1.8.0")
    import consul

    assert "connections_timeout" in inspect.signature(consul.Consul).parameters


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
    # The skills, and the tag that marks a mesh service in a catalog shared with others.
    assert payload["tags"] == ["credit_report", "chat", "mesh:node"]
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


# -- Consul's recorded answers (tests/fixtures/consul/) ----------------------------------------

# What the mesh node in the recording registered: Consul holds it as the first bureau entry.
RECORDED_NODE = Registration(
    instance_id="credit-bureau-7f3a",
    agent="credit-bureau",
    url="http://bureau-a.internal:8101",
    version="0.1.0",
    skills=("score",),
    tags=("credit", "bureau"),
)
CARD = "/.well-known/agent-card.json"


def _bureaus() -> list[dict[str, Any]]:
    return recorded("health_service_credit-bureau.json")  # type: ignore[no-any-return]


def test_an_instance_from_consul_s_entry_for_a_mesh_node() -> None:
    assert instance_from_entry(_bureaus()[0]) == Instance(
        instance_id="credit-bureau-7f3a",
        agent="credit-bureau",
        url="http://bureau-a.internal:8101",
        version="0.1.0",
        status="passing",
        skills=("score",),
        meta={
            "card_path": CARD,
            "tags": "credit,bureau",
            "url": "http://bureau-a.internal:8101",
            "version": "0.1.0",
        },
    )
    # The URL the node advertises wins over Consul's address and port (e.g. behind a proxy).
    proxied = _bureaus()[0]
    proxied["Service"]["Meta"]["url"] = "https://bureau.example/mesh"
    assert instance_from_entry(proxied).url == "https://bureau.example/mesh"  # type: ignore[union-attr]


def test_an_instance_with_no_address_or_url_is_at_its_node_address() -> None:
    # Registered from a service definition file: no Address, no url in its meta.
    inst = instance_from_entry(_bureaus()[1])
    assert inst is not None
    assert (inst.instance_id, inst.url, inst.status) == (
        "credit-bureau-b2",
        "http://10.0.3.22:8101",
        "critical",
    )
    assert inst.meta == {"card_path": CARD, "version": "0.1.0"}
    on_ipv6 = _bureaus()[1]
    on_ipv6["Node"]["Address"] = "fd00::22"
    assert instance_from_entry(on_ipv6).url == "http://[fd00::22]:8101"  # type: ignore[union-attr]


_MAINTENANCE = {
    "Node": "worker-1",
    "CheckID": "_service_maintenance:credit-bureau-7f3a",
    "Name": "Service Maintenance Mode",
    "Status": "critical",
    "Notes": "draining for an upgrade",
    "Output": "",
    "ServiceID": "credit-bureau-7f3a",
    "ServiceName": "credit-bureau",
    "ServiceTags": ["score"],
    "Type": "maintenance",
    "Interval": "",
    "Timeout": "",
    "ExposedPort": 0,
    "Definition": {},
    "CreateIndex": 44,
    "ModifyIndex": 44,
}


@pytest.mark.parametrize(
    ("serf", "service", "extra", "expected"),
    [
        ("passing", "warning", [], "warning"),  # its /health answered 429
        ("critical", "passing", [], "critical"),  # its Consul agent stopped answering
        ("passing", "passing", [_MAINTENANCE], "critical"),  # maintenance mode
        ("passing", "unknown-to-mesh", [], "critical"),  # never route to a state it cannot read
    ],
)
def test_the_status_is_the_worst_of_the_node_s_and_the_service_s_checks(
    serf: str, service: str, extra: list[dict[str, Any]], expected: str
) -> None:
    entry = _bureaus()[0]
    entry["Checks"][0]["Status"], entry["Checks"][1]["Status"] = serf, service
    entry["Checks"] += extra
    assert instance_from_entry(entry).status == expected  # type: ignore[union-attr]
    entry["Checks"] = []  # Consul sends [] for an instance with no check at all
    assert instance_from_entry(entry).status == "passing"  # type: ignore[union-attr]


def test_services_that_are_not_mesh_nodes_are_not_instances() -> None:
    # Consul's own service has a "version" in its meta too; postgres has tags and meta.
    (consul_itself,) = recorded("health_service_consul.json")
    (postgres,) = recorded("health_service_postgres.json")
    assert consul_itself["Service"]["Meta"]["version"] == "1.18.1"
    assert instance_from_entry(consul_itself) is None
    assert instance_from_entry(postgres) is None
    postgres["Service"]["Meta"] = None  # what Consul sends for a service registered without meta
    assert instance_from_entry(postgres) is None


def test_a_node_registers_what_consul_holds_for_it() -> None:
    payload = service_registration(RECORDED_NODE)
    held = _bureaus()[0]["Service"]
    sent = (payload["name"], payload["service_id"], payload["tags"], payload["address"])
    assert sent == (held["Service"], held["ID"], held["Tags"], held["Address"])
    assert (payload["port"], payload["meta"]) == (held["Port"], held["Meta"])
    assert payload["check"]["Name"] == _bureaus()[0]["Checks"][1]["Name"]


def test_a_url_longer_than_consul_keeps_is_a_config_error_naming_it() -> None:
    long_url = "http://bureau.example/" + "p" * 500
    with pytest.raises(ConfigError, match=r"url: its URL is 522 characters.*512.*MESH_PUBLIC_URL"):
        service_registration(Registration(instance_id="i", agent="a", url=long_url, version="1"))
    many_tags = tuple(f"tag-{n:03}" for n in range(80))
    with pytest.raises(ConfigError, match=r"tags: its tags take 639 characters.*fewer or shorter"):
        service_registration(
            Registration(instance_id="i", agent="a", url="http://a:1", version="1", tags=many_tags)
        )
    for key in ("not a key", "consul-owner", "k" * 129):
        bad = Registration(
            instance_id="i", agent="a", url="http://a:1", version="1", meta={key: "1"}
        )
        with pytest.raises(ConfigError, match="Consul refuses the service meta key"):
            service_registration(bad)


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


async def test_cache_serves_its_last_answer_for_a_bounded_time_then_reports_the_error(
    source: Source,
) -> None:
    clock = Clock()
    cache: QueryCache[str, str] = QueryCache(
        source.fetch, direct=_to_thread, wait_s=5.0, ttl=2.0, max_stale_s=60.0, clock=clock
    )
    try:
        assert await cache.get("k") == "k=v1"
        await eventually(lambda: len(source.blocking) >= 1)
        source.break_(ConnectionError("consul went away"))  # e.g. its agent restarting
        # Past what a live watch would have delivered: the direct fetch fails, and the answer
        # of 10 s ago stands in for it (it died on the first failure before).
        clock.now += 10.0
        assert await cache.get("k") == "k=v1"
        assert source.direct == 2, "the direct fetch was tried"
        clock.now += 60.0  # past max_stale_s: the error reaches the caller
        with pytest.raises(ConnectionError, match="consul went away"):
            await cache.get("k")
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


# -- Consul's recorded answers over HTTP, through py-consul ---------------------------------------


@pytest.fixture
def consul() -> Iterator[FakeConsul]:
    with FakeConsul() as fake:
        yield fake


@pytest.mark.integration
async def test_find_heartbeat_and_ping_read_consul_s_answers(consul: FakeConsul) -> None:
    base = f"http://127.0.0.1:{consul.port}"
    # The fake answers what the recording says (before anything registers).
    async with httpx.AsyncClient(trust_env=False) as http:
        agent_services = (await http.get(f"{base}/v1/agent/services")).json()
        catalog = (await http.get(f"{base}/v1/catalog/services")).json()
    assert agent_services == recorded("agent_services.json")
    assert catalog == recorded("catalog_services.json")

    backend = ConsulBackend(consul.address, wait_s=2.0)
    try:
        passing = await backend.find(agent="credit-bureau")
        assert [(i.instance_id, i.url) for i in passing] == [
            ("credit-bureau-7f3a", "http://bureau-a.internal:8101")
        ]
        everyone = await backend.find(agent="credit-bureau", passing_only=False)
        assert sorted((i.instance_id, i.url, i.status) for i in everyone) == [
            ("credit-bureau-7f3a", "http://bureau-a.internal:8101", "passing"),
            ("credit-bureau-b2", "http://10.0.3.22:8101", "critical"),
        ]
        # By skill: through the catalog, whose other services (consul, postgres) are no nodes.
        assert [i.instance_id for i in await backend.find(skill="score")] == ["credit-bureau-7f3a"]
        assert len(await backend.find(passing_only=False)) == 2
        assert await backend.find(skill="no-such-skill") == []
        await backend.heartbeat("credit-bureau-7f3a")  # registered with this agent
        with pytest.raises(UnknownInstance):  # registered with worker-2's agent
            await backend.heartbeat("credit-bureau-b2")
        await backend.ping()
    finally:
        await backend.aclose()


@pytest.mark.integration
async def test_a_registration_is_consul_s_documented_body_and_its_check_is_followed(
    consul: FakeConsul,
) -> None:
    reg = Registration(
        instance_id="cb-new", agent="credit-bureau", url="http://10.0.3.21:8102", version="0.2.0",
        skills=("score",), tags=("credit",),
    )  # fmt: skip
    backend = ConsulBackend(consul.address, wait_s=2.0)
    try:
        await backend.register(reg)
        # The fake refuses any field Consul does not document: this body passed.
        (sent,) = consul.registrations
        assert sent["id"] == "cb-new"
        assert sent["checks"][0]["HTTP"] == "http://10.0.3.21:8102/health"
        (new,) = [
            i for i in await backend.find(agent="credit-bureau", passing_only=False)
            if i.instance_id == "cb-new"
        ]  # fmt: skip
        assert (new.url, new.version, new.status) == ("http://10.0.3.21:8102", "0.2.0", "critical")
        await backend.heartbeat("cb-new")

        # Consul's check passes: the blocking query delivers it (no direct refetch needed).
        await backend.find(agent="credit-bureau")
        consul.set_status("cb-new", "passing")

        async def passing_ids() -> set[str]:
            return {i.instance_id for i in await backend.find(agent="credit-bureau")}

        await eventually(lambda: _contains(passing_ids(), "cb-new"), what="cb-new passing")

        await backend.deregister("cb-new")
        assert "cb-new" not in consul.entries
        with pytest.raises(UnknownInstance):
            await backend.heartbeat("cb-new")
    finally:
        await backend.aclose()


async def _contains(found: Awaitable[set[str]], item: str) -> bool:
    return item in await found


@pytest.mark.integration
async def test_a_registration_consul_refuses_says_consul_s_reason(consul: FakeConsul) -> None:
    # An HTTP check needs an interval: Consul answers 400 with its reason, which is not an
    # outage ("is the Consul agent running?") but a request to correct.
    backend = ConsulBackend(consul.address, check=ConsulCheck(interval="0s"))
    try:
        with pytest.raises(DiscoveryError) as refused:
            await backend.register(RECORDED_NODE)
    finally:
        await backend.aclose()
    assert str(refused.value) == (
        f"Consul at {consul.address} refused to register 'credit-bureau': Invalid check: "
        "Interval must be > 0 for Script, HTTP, H2PING, or TCP checks"
    )


@pytest.mark.integration
async def test_a_registration_consul_would_refuse_is_not_sent(consul: FakeConsul) -> None:
    # A DiscoveryError (what a node's registrar reports and retries), naming the field.
    long_url = "http://bureau.example/" + "p" * 500
    backend = ConsulBackend(consul.address)
    try:
        with pytest.raises(
            DiscoveryError, match=r"cannot register: agent 'a': url: its URL is 522"
        ):
            await backend.register(
                Registration(instance_id="i", agent="a", url=long_url, version="1")
            )
    finally:
        await backend.aclose()
    assert consul.registrations == []


def test_bad_address_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="consul://HOST:8500"):
        ConsulBackend("http://127.0.0.1:8500")


# -- a real Consul agent --------------------------------------------------------------------------

needs_consul = pytest.mark.skipif(
    not os.environ.get("CONSUL_HTTP_ADDR"),
    reason="needs a Consul agent: set CONSUL_HTTP_ADDR=127.0.0.1:8500 to one (e.g. started with "
    "`consul agent -dev`; CONSUL_HTTP_TOKEN too if it enforces ACLs)",
)


def test_the_gated_tests_read_any_consul_http_addr() -> None:
    # Consul's CLI takes all three spellings; http:// alone was stripped before.
    assert real_consul_address("127.0.0.1:8500") == "consul://127.0.0.1:8500"
    assert real_consul_address("http://10.0.0.5:8500/") == "consul://10.0.0.5:8500"
    assert real_consul_address("HTTPS://consul.internal:8501") == (
        "consul+https://consul.internal:8501"
    )


def _consul_url() -> str:
    return real_consul_address(os.environ["CONSUL_HTTP_ADDR"])


def _health_server(tmp_path: Path, name: str) -> tuple[Proc, str]:
    # A real HTTP server whose GET /health answers 200: what Consul's check needs to see, on
    # an address the agent can reach (MESH_TEST_HEALTH_HOST for an agent in a container).
    root = tmp_path / name
    root.mkdir()
    (root / "health").write_text("ok")
    host = health_host()
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", host]
    proc = Proc.start([*argv, "--directory", str(root)], name=name, tmp=tmp_path)
    url = f"http://{host}:{port}"
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
    # tls: CONSUL_CACERT and the client certificate when the agent speaks https.
    tls = MeshSettings.from_environment().consul_tls
    backend = ConsulBackend(
        _consul_url(), token=os.environ.get("CONSUL_HTTP_TOKEN"), tls=tls, check=check
    )
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
