"""The registry on Consul (``registry.consul_store``): Consul instances as registry records,
agent cards read from live nodes, clear failures when Consul is away, and (with a real Consul
agent) the registry API writing to and reading from Consul."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh.discovery.base import Instance, Registration, UnknownInstance
from mesh.discovery.consul import instance_from_entry, service_registration
from mesh.errors import StoreError
from registry.consul_store import CardCache, ConsulRegistryStore, fallback_agent, instance_record
from registry.store import (
    AgentRecord,
    InstanceRecord,
    InstanceTaken,
    NotOwner,
    RegistryFull,
    UrlTaken,
    secret_hash,
)
from tests.support import Proc, free_port, running, wait_for, wait_until_ok


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


# -- ownership, offline against an in-memory Consul -----------------------------------------------


class FakeConsul:
    """What the store uses of ``ConsulBackend``, in memory, through the same service and meta
    translation as the real backend (``service_registration`` / ``instance_from_entry``)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    async def register(self, registration: Registration) -> None:
        payload = service_registration(registration)
        self.entries[registration.instance_id] = {
            "Service": {
                "ID": payload["service_id"],
                "Service": payload["name"],
                "Tags": payload["tags"],
                "Meta": payload["meta"],
                "Address": payload["address"],
                "Port": payload["port"],
            },
            "Checks": [{"Status": "passing"}],
        }

    async def heartbeat(self, instance_id: str) -> None:
        if instance_id not in self.entries:
            raise UnknownInstance(instance_id)

    async def deregister(self, instance_id: str) -> None:
        self.entries.pop(instance_id, None)

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        found = [instance_from_entry(e) for e in self.entries.values()]
        return [i for i in found if i is not None and agent in (None, i.agent)]

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...


def _agent(name: str) -> AgentRecord:
    return AgentRecord(name=name, description="", version="1", card={})


def _inst(iid: str, agent: str, url: str = "http://10.0.0.7:8000") -> InstanceRecord:
    return InstanceRecord(instance_id=iid, agent=agent, url=url, version="1", registered_at=1.0)


async def test_consul_store_keeps_the_ownership_rules() -> None:
    consul = FakeConsul()
    async with httpx.AsyncClient(trust_env=False) as http:
        store = ConsulRegistryStore(consul, http)  # type: ignore[arg-type]
        owner, other = secret_hash("mine"), secret_hash("theirs")
        done = await store.put(_agent("a"), _inst("i", "a"), secret_hash=owner, presented=None)
        assert done.created
        # The hash, never the secret, is in the service meta.
        assert consul.entries["i"]["Service"]["Meta"]["secret_hash"] == owner
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
        again = await store.put(_agent("a"), _inst("i", "a"), secret_hash=other, presented=owner)
        assert not again.created
        assert consul.entries["i"]["Service"]["Meta"]["secret_hash"] == owner, "owner kept"
        assert await store.heartbeat("i", 3.0, presented=owner) is not None
        assert await store.heartbeat("unknown", 3.0, presented=owner) is None
        # One instance per (agent, URL): a new id there supersedes the old one, once the caller
        # proved the process at the URL is the new one (else UrlTaken, nothing written).
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


async def test_a_node_registered_straight_into_consul_cannot_be_changed_through_the_api() -> None:
    consul = FakeConsul()
    await consul.register(Registration(instance_id="n", agent="a", url="http://h:1", version="1"))
    async with httpx.AsyncClient(trust_env=False) as http:
        store = ConsulRegistryStore(consul, http)  # type: ignore[arg-type]
        with pytest.raises(NotOwner):
            await store.put(
                _agent("a"), _inst("n", "a", "http://h:1"), secret_hash="h", presented=None
            )
        with pytest.raises(NotOwner):
            await store.deregister("n", presented=secret_hash("guess"))
    assert set(consul.entries) == {"n"}


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
def test_registry_api_registers_into_consul_and_lists_from_it(tmp_path: Path, node: str) -> None:
    addr = os.environ["CONSUL_HTTP_ADDR"].removeprefix("http://")
    port = free_port()
    argv = _registry_argv(f"consul://{addr}", port, tmp_path)
    instance_id = f"cb-test-{uuid.uuid4().hex[:8]}"
    with Proc.start(argv, name="registry", tmp=tmp_path) as proc:
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
