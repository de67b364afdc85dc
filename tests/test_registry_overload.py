"""The registry never blames instances for its own overload (issue 21 item 2).

A real registry whose prober cannot keep up (2 probes at once, a 0.2 s deadline, a 0.5 s
interval) probes a simulated fleet (``tests.bench.fleet``, one process) whose instances answer
``/health`` slowly but heartbeat on time. Before: every one of them turned critical ("health
check failed: no whole answer in time"). Now each such probe is unknown (status kept), and the
registry says it is behind in ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf.json_format import MessageToDict

from registry.card import agent_record
from registry.prober import Prober
from registry.sqlite_store import SqliteRegistryStore
from registry.store import InstanceRecord, secret_hash
from tests.bench.registry_scale import RawHttp
from tests.echo_node import build_card
from tests.registry_support import instances, registry
from tests.support import Proc, clean_env, free_port, wait_for, wait_until_ok

pytestmark = pytest.mark.integration

FLEET = 24


def _register(reg: str, fleet: str, n: int) -> str:
    body = {"instance_id": f"fleet-{n}", "agent": f"agent-{n % 4}", "url": f"{fleet}/i/{n}"}
    r = httpx.post(f"{reg}/v1/instances", json=body, timeout=10)
    assert r.status_code == 201, r.text
    secret: str = r.json()["secret"]
    return secret


class _Heartbeats:
    """Heartbeats every instance each 0.5 s in a thread until stopped (bounded by ``stop``)."""

    def __init__(self, reg: str, secrets: dict[str, str]) -> None:
        self._reg, self._secrets = reg, secrets
        self._stop = threading.Event()
        self.refused: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.5):
                for iid, secret in self._secrets.items():
                    r = client.put(
                        f"{self._reg}/v1/instances/{iid}/heartbeat",
                        headers={"Mesh-Instance-Secret": secret},
                    )
                    if r.status_code != 200:
                        self.refused.append(f"{iid}: {r.status_code}")

    def __enter__(self) -> _Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@contextlib.contextmanager
def _fleet(tmp: Path, delay: float) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.bench.fleet", "--port", str(port),
            "--agents", "4", "--no-stats", "--health-delay", str(delay)]  # fmt: skip
    with Proc.start(argv, name=f"fleet-{port}", tmp=tmp, env=clean_env()) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until_ok(f"{url}/ready", proc=proc)
        yield url


def test_an_overloaded_prober_demotes_no_live_instance(tmp_path: Path) -> None:
    extra = ["--probe-concurrency", "2"]
    with (
        _fleet(tmp_path, delay=0.5) as fleet,
        registry(tmp_path, probe_interval=0.5, ttl=20, extra=extra) as reg,
    ):
        # Its probe timeout is 0.4 s (registry_support): every probe runs out of time.
        secrets = {f"fleet-{n}": _register(reg.url, fleet, n) for n in range(FLEET)}
        registered_at = time.time()
        with _Heartbeats(reg.url, secrets) as beats:
            # 24 probes, 2 at a time, 0.4 s each: a round lasts ~5 s, over the interval.
            health = wait_for(lambda: _behind(reg.url), timeout=30, what="/health says behind")
            assert any("probe round" in why for why in health["why_behind"]), health
            # A whole round that started once every instance was registered probed them all
            # (each out of time) and demoted none.
            last = wait_for(
                lambda: _round_since(reg.url, registered_at), timeout=60, what="a whole round"
            )
            every = instances(reg.url, status="any")
            assert len(every) == FLEET
            assert [i for i in every if i["status"] != "passing"] == []
            assert (last["instances"], last["unknown"]) == (FLEET, FLEET), last
            metrics = httpx.get(f"{reg.url}/metrics", timeout=5).text
            assert "mesh_registry_behind 1.0" in metrics
            assert 'mesh_registry_probes_total{outcome="unknown"}' in metrics
            assert 'mesh_registry_probes_total{outcome="critical"}' not in metrics
            assert beats.refused == []


SECRET = "Mesh-Instance-Secret"


class _Flood:
    """Heartbeats as fast as the registry answers them, over ``lanes`` keep-alive connections,
    ``PIPELINE`` sent at once on each (a thread with its own loop; pipelined, a raw client costs
    a fraction of what the registry spends on each: one request at a time per connection, it
    no longer kept the registry busy once heartbeats were answered below FastAPI), until
    stopped or ``limit_s`` passes."""

    PIPELINE = 32

    def __init__(self, port: int, secrets: dict[str, str], lanes: int = 16) -> None:
        self._port, self._secrets, self._lanes = port, secrets, lanes
        self._stop = threading.Event()
        self.answered: dict[int, int] = {}
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self, limit_s: float = 120.0) -> None:
        deadline = time.monotonic() + limit_s

        async def lane(k: int) -> None:
            raw = RawHttp(self._port)
            items = list(self._secrets.items())
            try:
                n = k
                while not self._stop.is_set() and time.monotonic() < deadline:
                    batch = [items[(n + j) % len(items)] for j in range(self.PIPELINE)]
                    statuses = await raw.pipeline(
                        [
                            ("PUT", f"/v1/instances/{iid}/heartbeat", f"{SECRET}: {secret}\r\n")
                            for iid, secret in batch
                        ]
                    )
                    for status in statuses:
                        self.answered[status] = self.answered.get(status, 0) + 1
                    n += self.PIPELINE
            finally:
                raw.close()

        await asyncio.gather(*(lane(k) for k in range(self._lanes)))

    def __enter__(self) -> _Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_a_registry_saturated_by_heartbeats_says_it_is_behind(tmp_path: Path) -> None:
    # Heartbeats faster than one process answers them: its event loop never idles, but runs
    # late by only a request or two (the backlog waits in the clients' connections), and every
    # probe answers in time. Before: /health said nothing ("behind" only on loop lag or a
    # round overrun). Now: behind, naming the busy loop, and not behind once the flood stops.
    with (
        _fleet(tmp_path, delay=0.0) as fleet,
        registry(tmp_path, probe_interval=1.0, ttl=30) as reg,
    ):
        secrets = {f"fleet-{n}": _register(reg.url, fleet, n) for n in range(8)}
        assert _behind(reg.url) == {}
        with _Flood(reg.port, secrets) as flood:
            health = wait_for(lambda: _behind(reg.url), timeout=60, what="/health says behind")
            assert any("event loop busy" in why for why in health["why_behind"]), health
            wait_for(
                lambda: "mesh_registry_behind 1.0" in httpx.get(f"{reg.url}/metrics").text,
                timeout=30,
                what="mesh_registry_behind 1",
            )
        assert set(flood.answered) == {200}, flood.answered
        wait_for(lambda: not _behind(reg.url), timeout=60, what="/health no longer behind")
        every = instances(reg.url, status="any")
        assert [i["status"] for i in every] == ["passing"] * 8


def _behind(reg: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{reg}/health", timeout=5).json()
    return body if body.get("behind") is True else {}


def _round_since(reg: str, since: float) -> dict[str, Any]:
    doc = httpx.get(f"{reg}/introspect", timeout=5).json()
    last: dict[str, Any] = doc["prober"]["last_round"]
    return last if last["started_at"] > since else {}


def test_the_registry_warns_as_it_nears_what_one_process_should_hold(tmp_path: Path) -> None:
    # --max-instances 5: it warns at 4 (80%), once, naming where a bigger mesh goes. A limit
    # over what one process keeps up with is said at start-up.
    with (
        _fleet(tmp_path, delay=0.0) as fleet,
        registry(tmp_path, probe_interval=0.2, extra=["--max-instances", "5"]) as reg,
    ):
        for n in range(3):
            _register(reg.url, fleet, n)
        started = time.time()
        wait_for(lambda: _round_since(reg.url, started), what="a round over 3 instances")
        assert "near the" not in reg.proc.output()
        _register(reg.url, fleet, 3)
        line = wait_for(
            lambda: [x for x in reg.proc.output().splitlines() if "near the" in x],
            what="the size warning",
        )
        assert "4 instances: near the 5 this registry should hold" in line[0], line
        assert "--backend consul://" in line[0]
        started = time.time()
        wait_for(lambda: _round_since(reg.url, started), what="another round")
        assert len([x for x in reg.proc.output().splitlines() if "near the" in x]) == 1
    big_args = ["--max-instances", "20000"]
    with registry(tmp_path, data_dir=tmp_path / "big", extra=big_args, name="big") as big:
        log = wait_for(lambda: _line(big.proc.output(), "--max-instances 20000"))
        assert "holds about 10000 instances" in log
        assert "Consul" in log


def _line(log: str, text: str) -> str:
    return next((line for line in log.splitlines() if text in line), "")


def test_past_its_probe_budget_a_round_probes_instances_in_turn(tmp_path: Path) -> None:
    with (
        _fleet(tmp_path, delay=0.0) as fleet,
        registry(tmp_path, probe_interval=0.3, extra=["--probe-budget", "5"]) as reg,
    ):
        for n in range(12):
            _register(reg.url, fleet, n)
        started = time.time()
        last = wait_for(lambda: _round_since(reg.url, started), what="a round over 12 instances")
        assert (last["instances"], last["probed"]) == (12, 5), last
        assert len(instances(reg.url)) == 12


async def _put(store: SqliteRegistryStore, url: str) -> None:
    """One passing instance at ``url``, heartbeating now."""
    card = MessageToDict(build_card("echo", url, description="Gone.", skill_id="echo"))
    now = time.time()
    record = InstanceRecord(instance_id="echo-1", agent="echo", url=url, version="1",
                            status_changed_at=now, last_heartbeat_at=now, registered_at=now)  # fmt: skip
    agent = agent_record(card, expected_name="echo", now=now)
    await store.put(agent, record, secret_hash=secret_hash("s" * 43), presented=None)


@pytest.mark.parametrize("late", [False, True])
async def test_while_its_event_loop_is_late_the_prober_demotes_nobody(
    tmp_path: Path, late: bool
) -> None:
    # A port nobody listens on: the probe is refused, which makes an instance critical; but
    # not while the registry's own loop runs late (its heartbeats would be waiting too).
    store = await SqliteRegistryStore.open(tmp_path / "registry.db")
    async with httpx.AsyncClient() as http:
        prober = Prober(store, http, interval_s=60, timeout_s=0.5, ttl_s=30)
        try:
            await prober.start()  # a first round (of nothing), the loop-lag watch started
            await _put(store, f"http://127.0.0.1:{free_port()}")
            if late:
                await asyncio.sleep(0.15)  # the watch is waiting on its 0.1 s timer
                time.sleep(0.7)  # noqa: ASYNC251 (the point: the loop blocked, as by CPU-bound work)
                await asyncio.sleep(0.15)  # the watch sees it
                assert prober.behind(), "the late loop not seen"
            await prober.tick()
            (inst,) = await store.instances()
        finally:
            await prober.aclose()
            await store.aclose()
    if late:
        assert (inst.status, prober.last_round.deferred) == ("passing", 1)
    else:
        assert (inst.status, inst.status_reason) == ("critical", "health check failed: unreachable")


@pytest.mark.parametrize(("busy", "silent_ttls", "expected"), [
    (0.95, 1.5, "passing"),  # saturated, silent under 2 TTLs: perhaps the registry's delay
    (0.95, 2.5, "critical"),  # saturated, silent past 2 TTLs: demoted all the same
    (0.5, 1.5, "critical"),  # not saturated: the TTL as usual
])  # fmt: skip
async def test_while_saturated_a_missed_ttl_demotes_only_past_two_ttls(
    tmp_path: Path, busy: float, silent_ttls: float, expected: str
) -> None:
    store = await SqliteRegistryStore.open(tmp_path / "registry.db")
    now = [time.time()]
    async with httpx.AsyncClient() as http:
        # Not started: no loop watch overwrites loop_busy, as measured on a saturated loop.
        prober = Prober(store, http, interval_s=60, ttl_s=30, clock=lambda: now[0])
        try:
            await _put(store, f"http://127.0.0.1:{free_port()}")
            prober.loop_busy = busy
            now[0] += 30 * silent_ttls
            await prober.tick()
            (inst,) = await store.instances()
        finally:
            await store.aclose()
    assert inst.status == expected, inst.status_reason
    assert prober.last_round.deferred == (1 if expected == "passing" else 0)
