"""The registry on Consul (``registry.consul_store``): Consul instances as registry records,
agent cards read from live nodes, clear failures when Consul is away, and (with a real Consul
agent) the registry API writing to and reading from Consul."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from mesh._discovery.base import Instance
from mesh._discovery.consul import ConsulBackend
from mesh._errors import StoreError
from registry.consul_store import CardCache, ConsulRegistryStore, fallback_agent, instance_record
from registry.store import (
    AgentRecord,
    InstanceRecord,
    InstanceTaken,
    NotOwner,
    RegistryFull,
    Unstorable,
    UrlTaken,
    secret_hash,
)
from tests.fakes.consul_server import FakeConsul, health_host, real_consul_address
from tests.registry_support import flood_node
from tests.support import Proc, clean_env, free_port, running, wait_for, wait_until_ok


def bureau(url: str, *, version: str = "0.1.0", status: str = "passing", **kw: str) -> Instance:
    return Instance(
        instance_id=kw.get("instance_id", "cb-1"),
        agent=kw.get("agent", "credit-bureau"),
        url=url,
        version=version,
        status=status,  # type: ignore[arg-type]
        skills=("score",),
        meta={"version": version, "card_path": "/.well-known/agent-card.json", "url": url},
    )


def test_instance_record_carries_consul_status_and_the_registry_times() -> None:
    inst = bureau("http://10.0.0.7:8000", status="warning")
    record = instance_record(inst, registered_at=100.0, status_changed_at=150.0, now=200.0)
    assert (record.instance_id, record.agent, record.url, record.version) == (
        "cb-1",
        "credit-bureau",
        "http://10.0.0.7:8000",
        "0.1.0",
    )
    assert record.status == "warning"
    assert "Consul" in record.status_reason
    assert (record.registered_at, record.status_changed_at, record.last_heartbeat_at) == (
        100.0,
        150.0,
        200.0,
    )


def test_fallback_agent_lists_the_skills_consul_tags_name() -> None:
    a = bureau("http://a", version="1.0")
    b = Instance(instance_id="cb-2", agent="credit-bureau", url="http://b", version="1.1",
                 skills=("score", "report"))  # fmt: skip
    record = fallback_agent("credit-bureau", [a, b], now=5.0)
    assert record.name == "credit-bureau"
    assert record.version == "1.1"
    assert [s.id for s in record.skills] == ["report", "score"]
    assert record.card == {}


# -- ownership, on Consul's answers through the real ConsulBackend --------------------------------


def _agent(name: str) -> AgentRecord:
    return AgentRecord(name=name, description="", version="1", card={})


def _inst(iid: str, agent: str, url: str = "http://10.0.0.7:8000") -> InstanceRecord:
    return InstanceRecord(instance_id=iid, agent=agent, url=url, version="1", registered_at=1.0)


@contextlib.asynccontextmanager
async def _store(consul: FakeConsul) -> AsyncIterator[ConsulRegistryStore]:
    store = ConsulRegistryStore(
        ConsulBackend(consul.address, wait_s=2.0), httpx.AsyncClient(trust_env=False)
    )
    try:
        yield store
    finally:
        await store.aclose()


def _meta(consul: FakeConsul, instance_id: str) -> dict[str, str]:
    return consul.entries[instance_id]["Service"]["Meta"]  # type: ignore[no-any-return]


@pytest.mark.integration
async def test_consul_store_keeps_the_ownership_rules() -> None:
    with FakeConsul(recorded_services=False) as consul:
        async with _store(consul) as store:
            owner, other = secret_hash("mine"), secret_hash("theirs")
            done = await store.put(_agent("a"), _inst("i", "a"), secret_hash=owner, presented=None)
            assert done.created
            # The hash, never the secret, is in the service meta.
            assert _meta(consul, "i")["secret_hash"] == owner
            with pytest.raises(InstanceTaken):
                await store.put(_agent("b"), _inst("i", "b"), secret_hash=other, presented=owner)
            for presented in (None, other):
                with pytest.raises(NotOwner):
                    await store.put(
                        _agent("a"), _inst("i", "a"), secret_hash=other, presented=presented
                    )
                with pytest.raises(NotOwner):
                    await store.heartbeat("i", 2.0, presented=presented)
                with pytest.raises(NotOwner):
                    await store.deregister("i", presented=presented)
            again = await store.put(
                _agent("a"), _inst("i", "a"), secret_hash=other, presented=owner
            )
            assert not again.created
            assert _meta(consul, "i")["secret_hash"] == owner, "owner kept"
            assert await store.heartbeat("i", 3.0, presented=owner) is not None
            assert await store.heartbeat("unknown", 3.0, presented=owner) is None
            # One instance per (agent, URL): a new id there supersedes the old one, once the
            # caller proved the process at the URL is the new one (else UrlTaken, nothing
            # written).
            with pytest.raises(UrlTaken):
                await store.put(_agent("a"), _inst("i2", "a"), secret_hash=other, presented=None)
            assert set(consul.entries) == {"i"}
            moved = await store.put(
                _agent("a"), _inst("i2", "a"), secret_hash=other, presented=None, supersede={"i"}
            )
            assert [r.instance_id for r in moved.superseded] == ["i"]
            assert set(consul.entries) == {"i2"}
            # A full store takes no new id.
            with pytest.raises(RegistryFull):
                await store.put(
                    _agent("a"),
                    _inst("i3", "a", "http://h:3"),
                    secret_hash=other,
                    presented=None,
                    max_instances=1,
                )
            assert await store.deregister("i2", presented=other) is not None
            assert consul.entries == {}


@pytest.mark.integration
async def test_a_node_registered_straight_into_consul_cannot_be_changed_through_the_api() -> None:
    # The recorded credit-bureau-7f3a registered itself (MESH_DISCOVERY=consul://...): its meta
    # holds no secret hash.
    with FakeConsul() as consul:
        async with _store(consul) as store:
            bureau = _inst("credit-bureau-7f3a", "credit-bureau", "http://bureau-a.internal:8101")
            with pytest.raises(NotOwner):
                await store.put(_agent("credit-bureau"), bureau, secret_hash="h", presented=None)
            with pytest.raises(NotOwner):
                await store.deregister("credit-bureau-7f3a", presented=secret_hash("guess"))
        assert "credit-bureau-7f3a" in consul.entries
        assert consul.registrations == []


@pytest.mark.integration
async def test_a_registration_consul_cannot_hold_is_refused_before_any_write() -> None:
    with FakeConsul(recorded_services=False) as consul:
        async with _store(consul) as store:
            url = "http://10.0.0.7:8000"
            await store.put(_agent("a"), _inst("old", "a", url), secret_hash="h", presented=None)
            long_url = "http://10.0.0.7:8000/" + "p" * 500
            with pytest.raises(Unstorable, match=r"url: its URL is 521 characters.*512"):
                await store.put(
                    _agent("a"), _inst("new", "a", long_url), secret_hash="h", presented=None
                )
            tags = tuple(f"tag-{n:03}" for n in range(80))
            many = AgentRecord(name="a", description="", version="1", card={}, agent_tags=tags)
            # Not even the instance it would supersede is removed.
            with pytest.raises(Unstorable, match="tags: its tags take 639 characters"):
                await store.put(
                    many, _inst("new", "a", url), secret_hash="h", presented=None,
                    supersede={"old"},
                )  # fmt: skip
        assert set(consul.entries) == {"old"}
        assert len(consul.registrations) == 1


@pytest.mark.integration
async def test_an_instance_another_consul_agent_holds_is_not_reported_removed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # In the topology docs/production.md recommends (a Consul agent per host) a node registers
    # with its own host's agent; the registry's agent answers 404 for it (issue 20 item 6).
    with FakeConsul() as consul:
        async with _store(consul) as store:
            # The prober: nothing removed, said once.
            assert await store.remove("credit-bureau-b2") is None
            assert await store.remove("credit-bureau-b2") is None
            assert caplog.text.count("not removing credit-bureau-b2") == 1
            assert "credit-bureau-b2" in consul.entries
            # The API, for an instance it registered that now sits with another agent (a
            # second registry replica's): an error, not a 204 that did nothing.
            owner = secret_hash("mine")
            await store.put(_agent("a"), _inst("i", "a"), secret_hash=owner, presented=None)
            consul.entries["i"]["Node"]["Node"] = "worker-2"
            with pytest.raises(StoreError, match=r"cannot deregister 'i'.*does not hold"):
                await store.deregister("i", presented=owner)
            assert "i" in consul.entries
            consul.entries["i"]["Node"]["Node"] = "worker-1"
            assert await store.deregister("i", presented=owner) is not None
            assert "i" not in consul.entries


# -- cards read from a real node ------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("bureau")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)]
    with running([*argv, "--data-dir", str(tmp / "data")], name="bureau", tmp=tmp,
                 health=f"{url}/health"):  # fmt: skip
        yield url


@pytest.mark.integration
async def test_card_cache_reads_the_card_with_schemas_from_a_live_node(node: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        cards = CardCache(http)
        record = await cards.get("credit-bureau", [bureau(node)])
    assert record.name == "credit-bureau"
    assert record.card["name"] == "credit-bureau"
    score = record.skill("score")
    assert score is not None
    assert score.input_schema is not None
    assert "applicant_id" in score.input_schema["properties"]


@pytest.mark.integration
async def test_card_cache_skips_dead_instances_and_keeps_cards_per_version(node: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient(trust_env=False) as http:
        cards = CardCache(http)
        # A critical instance that no longer answers is tried last, and skipped.
        first = await cards.get(
            "credit-bureau", [bureau(dead, status="critical", instance_id="x"), bureau(node)]
        )
        assert first.card
        # Same version, only a dead instance left: the card already read still stands.
        again = await cards.get("credit-bureau", [bureau(dead)])
        assert again is first
        cards.forget(keep=[])
        gone = await cards.get("credit-bureau", [bureau(dead)])
    assert gone.card == {}, "with no card reachable the agent is still listed, from Consul's tags"
    assert [s.id for s in gone.skills] == ["score"]


@pytest.mark.integration
async def test_card_cache_refuses_a_card_naming_another_agent(node: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        record = await CardCache(http).get("impostor", [bureau(node, agent="impostor")])
    assert record.card == {}
    assert record.name == "impostor"


# -- Consul away: the store and the registry say so ----------------------------------------------


@pytest.mark.integration
async def test_store_errors_name_consul_when_it_is_unreachable() -> None:
    port = free_port()
    store = ConsulRegistryStore.from_url(f"consul://127.0.0.1:{port}")
    try:
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
            await store.ping()
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
            await store.agents()
    finally:
        await store.aclose()


def _registry_argv(consul: str, port: int, data: Path) -> list[str]:
    """`mesh registry` on the Consul backend, as compose.yaml runs it."""
    return ["mesh", "registry", "--port", str(port), "--data-dir", str(data),
            "--probe-interval", "60", "--backend", consul]  # fmt: skip


@pytest.mark.integration
def test_registry_on_an_unreachable_consul_answers_503_not_500(tmp_path: Path) -> None:
    port = free_port()
    consul = f"consul://127.0.0.1:{free_port()}"
    argv = _registry_argv(consul, port, tmp_path)
    with Proc.start(argv, name="registry", tmp=tmp_path) as proc:
        base = f"http://127.0.0.1:{port}"

        def health() -> httpx.Response:
            assert proc.popen.poll() is None, proc.output()
            return httpx.get(f"{base}/health", timeout=5)

        response = wait_for(health, what="the registry to answer")
        assert response.status_code == 503
        agents = httpx.get(f"{base}/v1/agents", timeout=10)
        assert agents.status_code == 503
        assert agents.json()["error"] == "store_unavailable"


@contextlib.contextmanager
def _registry_on(consul: FakeConsul, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = _registry_argv(f"consul://127.0.0.1:{consul.port}", port, tmp_path)
    with Proc.start(argv, name="registry", tmp=tmp_path) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_until_ok(f"{base}/health", proc=proc)
        yield base


@pytest.mark.integration
def test_the_registry_on_consul_serves_what_consul_answers(tmp_path: Path) -> None:
    with FakeConsul() as consul, _registry_on(consul, tmp_path) as base:
        passing = httpx.get(f"{base}/v1/instances", timeout=10).json()["instances"]
        assert [i["instance_id"] for i in passing] == ["credit-bureau-7f3a"]
        listed = httpx.get(f"{base}/v1/instances?status=any", timeout=10).json()["instances"]
        assert sorted((i["instance_id"], i["url"], i["status"]) for i in listed) == [
            ("credit-bureau-7f3a", "http://bureau-a.internal:8101", "passing"),
            ("credit-bureau-b2", "http://10.0.3.22:8101", "critical"),
        ]
        # Neither card is reachable from here: the agent is listed from Consul's tags.
        agents = httpx.get(f"{base}/v1/agents", timeout=10).json()["agents"]
        assert [(a["name"], [s["id"] for s in a["skills"]]) for a in agents] == [
            ("credit-bureau", ["score"])
        ]


@pytest.mark.integration
def test_prometheus_targets_scrape_a_node_at_its_url_s_scheme_and_path(tmp_path: Path) -> None:
    # A node behind a proxy advertises https://bureau.example/mesh: Prometheus builds the
    # target from the address, so the SD answer carries the scheme and the path (item 11).
    with FakeConsul() as consul:
        consul.entries["credit-bureau-7f3a"]["Service"]["Meta"]["url"] = (
            "https://bureau.example/mesh"
        )
        with _registry_on(consul, tmp_path) as base:
            groups = httpx.get(f"{base}/v1/prometheus/targets", timeout=10).json()
    assert groups == [
        {
            "targets": ["bureau.example"],
            "labels": {
                "agent": "credit-bureau",
                "version": "0.1.0",
                "instance": "credit-bureau-7f3a",
                "__scheme__": "https",
                "__metrics_path__": "/mesh/metrics",
            },
        }
    ]


@pytest.mark.integration
def test_the_registry_on_consul_refuses_a_url_consul_cannot_hold(tmp_path: Path) -> None:
    flood = flood_node(tmp_path)  # serves a card under any /i/<n>
    with flood.proc, FakeConsul() as consul, _registry_on(consul, tmp_path) as base:
        url = f"{flood.url}/i/{'n' * 500}"
        r = httpx.post(
            f"{base}/v1/instances",
            json={"instance_id": "long-1", "url": url, "agent": "junk"},
            timeout=10,
        )
        assert r.status_code == 422, r.text
        assert r.json()["error"] == "unstorable"
        assert f"url: its URL is {len(url)} characters" in r.json()["message"]
        assert consul.registrations == []


def test_registry_backend_must_be_consul(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mesh", "registry", "--backend", "etcd://x:1"],
        capture_output=True, text=True, timeout=30, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 78  # EX_CONFIG: a start-up mistake, not restarted by mesh up
    assert "--backend 'etcd://x:1': use consul://host:8500" in result.stderr
    assert "Traceback" not in result.stderr


# -- a real Consul agent --------------------------------------------------------------------------

needs_consul = pytest.mark.skipif(
    not os.environ.get("CONSUL_HTTP_ADDR"),
    reason="needs a Consul agent: set CONSUL_HTTP_ADDR=127.0.0.1:8500 to one (e.g. started with "
    "`consul agent -dev`; CONSUL_HTTP_TOKEN too if it enforces ACLs)",
)


@pytest.mark.consul
@pytest.mark.integration
@needs_consul
def test_registry_api_registers_into_consul_and_lists_from_it(tmp_path: Path) -> None:
    # The node listens where the agent's check can reach it (MESH_TEST_HEALTH_HOST for an
    # agent in a container); the registry may then fetch its card there.
    host = health_host()
    node_port = free_port()
    node = f"http://{host}:{node_port}"
    node_argv = ["mesh", "serve", "agents.credit_bureau:agent", "--host", host,
                 "--port", str(node_port), "--data-dir", str(tmp_path / "node"), "--no-register"]  # fmt: skip
    port = free_port()
    argv = _registry_argv(real_consul_address(os.environ["CONSUL_HTTP_ADDR"]), port, tmp_path)
    if host not in ("127.0.0.1", "localhost", "::1"):
        argv += ["--allow-networks", "any"]
    # The children get the Consul variables the suite keeps from them (clean_env).
    consul_env = {k: v for k, v in os.environ.items() if k.startswith("CONSUL_")}
    instance_id = f"cb-test-{uuid.uuid4().hex[:8]}"
    with (
        running(
            node_argv,
            name="bureau",
            tmp=tmp_path,
            health=f"{node}/health",
            env=clean_env(MESH_PUBLIC_URL=node),
        ),  # fmt: skip
        Proc.start(argv, name="registry", tmp=tmp_path, env=clean_env(**consul_env)) as proc,
    ):
        base = f"http://127.0.0.1:{port}"
        wait_until_ok(f"{base}/health", proc=proc)
        created = httpx.post(
            f"{base}/v1/instances",
            json={"instance_id": instance_id, "url": node, "agent": "credit-bureau",
                  "version": "0.1.0"},
            timeout=10,
        )  # fmt: skip
        assert created.status_code == 201, created.text
        try:

            def listed() -> bool:
                r = httpx.get(f"{base}/v1/instances?agent=credit-bureau", timeout=5).json()
                return instance_id in {i["instance_id"] for i in r["instances"]}

            wait_for(listed, timeout=30, what="the instance passing in Consul")
            agents = httpx.get(f"{base}/v1/agents?skill=score", timeout=5).json()["agents"]
            assert [a["name"] for a in agents] == ["credit-bureau"]
            targets = httpx.get(f"{base}/v1/prometheus/targets", timeout=5).json()
            assert any(g["labels"].get("instance") == instance_id for g in targets)
        finally:
            owner = {"Mesh-Instance-Secret": created.json()["secret"]}
            httpx.delete(f"{base}/v1/instances/{instance_id}", headers=owner, timeout=10)
        beat = httpx.put(f"{base}/v1/instances/{instance_id}/heartbeat", headers=owner, timeout=5)
        assert beat.status_code == 404
