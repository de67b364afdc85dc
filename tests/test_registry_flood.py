"""A registry under a flood of junk instances (an open registry on loopback, anonymous
clients): it keeps serving, recovers once the flood is gone, starts in bounded time on a big
``registry.db``. Real registry processes, a real ``tests.flood_node`` behind the instances."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest

from registry.app import create_app
from registry.card import agent_record
from registry.settings import RegistrySettings
from registry.sqlite_store import SqliteRegistryStore
from registry.store import InstanceRecord, secret_hash
from tests.registry_support import flood_node, instances, registry, start_node
from tests.support import wait_for

pytestmark = pytest.mark.integration


async def _register_many(
    registry_url: str, flood_url: str, n: int, *, distinct: bool = False
) -> dict[int, int]:
    """Register ``/i/0`` .. ``/i/<n-1>`` anonymously, 16 at a time; status code -> count."""
    codes: dict[int, int] = {}
    slots = asyncio.Semaphore(16)
    async with httpx.AsyncClient(timeout=30) as http:

        async def one(i: int) -> None:
            body = {
                "instance_id": f"flood-{i}",
                "url": f"{flood_url}/i/{i}",
                "agent": f"junk-{i}" if distinct else "junk",
            }
            async with slots:
                r = await http.post(f"{registry_url}/v1/instances", json=body)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1

        await asyncio.gather(*(one(i) for i in range(n)))
    return codes


def test_a_registry_flooded_with_slow_instances_recovers(tmp_path: Path) -> None:
    """250 instances whose /health outlasts the probe timeout: every round cancels probes queued
    for a connection (before mesh._pool the registry's pool lost its slots for good, and every
    card fetch, so every registration, failed from then on)."""
    with registry(tmp_path, probe_interval=0.5, ttl=6.0) as reg:
        flood = flood_node(tmp_path, delay_s=3.0)
        try:
            codes = asyncio.run(_register_many(reg.url, flood.url, 250))
            assert codes == {201: 250}, codes

            def probes_cut() -> bool:
                # A probe cut by its deadline is unknown (the instance's status kept).
                text = httpx.get(f"{reg.url}/metrics", timeout=5).text
                found = re.search(r'mesh_registry_probes_total\{outcome="unknown"\} (\S+)', text)
                return found is not None and float(found.group(1)) >= 250

            # As many probes as instances were cut by their deadline.
            wait_for(probes_cut, timeout=20, what="the flood probed")
            # Meanwhile a live node registers and turns passing.
            during = start_node(tmp_path, reg.url, name="echo", instance_id="echo-during")
            with during.proc:
                wait_for(
                    lambda: [i for i in instances(reg.url, agent="echo")],
                    timeout=15,
                    what="a live node passing during the flood",
                )
        finally:
            flood.proc.kill()
        # The flood server is gone; a node that registers now must get in and turn passing.
        after = start_node(tmp_path, reg.url, name="echo2", instance_id="echo-after")
        with after.proc:
            wait_for(
                lambda: [i for i in instances(reg.url, agent="echo2")],
                timeout=15,
                what="a live node passing after the flood",
            )


async def _store_rows(db: Path, flood_url: str, n: int) -> None:
    """``n`` instances in a ``registry.db`` as a registry would have left them (recent
    heartbeats, so the next start probes them all)."""
    async with httpx.AsyncClient(timeout=5) as http:
        card = (await http.get(f"{flood_url}/i/0/.well-known/agent-card.json")).json()
    store = await SqliteRegistryStore.open(db)
    try:
        now = time.time()
        agent = agent_record(card, expected_name="junk", now=now)
        for i in range(n):
            record = InstanceRecord(
                instance_id=f"flood-{i}",
                agent="junk",
                url=f"{flood_url}/i/{i}",
                version="1",
                status_changed_at=now,
                last_heartbeat_at=now,
                registered_at=now,
            )
            await store.put(agent, record, secret_hash=secret_hash("s" * 43), presented=None)
    finally:
        await store.aclose()


async def _start_up_time(settings: RegistrySettings) -> float:
    app = create_app(settings)
    started = time.monotonic()
    async with asyncio.timeout(60), app.router.lifespan_context(app):
        return time.monotonic() - started


def test_a_restart_on_a_thousand_rows_serves_within_one_probe_timeout(tmp_path: Path) -> None:
    """Start-up runs one probe round, bounded by the probe timeout + 1 s (before: 18 s on 1000
    rows, the event loop busy in the HTTP pool's queue of 1000 probes)."""
    flood = flood_node(tmp_path, delay_s=10.0)
    try:
        data = tmp_path / "registry"
        asyncio.run(_store_rows(data / "registry.db", flood.url, 1000))
        settings = RegistrySettings(data_dir=data, probe_timeout_s=0.5)
        took = asyncio.run(_start_up_time(settings))
    finally:
        flood.proc.kill()  # not a graceful stop: its answers would take 10 s
    assert took < 0.5 + 1.0 + 1.0, f"start-up took {took:.1f}s"


async def _burst(settings: RegistrySettings, flood_url: str, n: int) -> dict[int, int]:
    app = create_app(settings)
    codes: dict[int, int] = {}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://reg") as http,
    ):

        async def one(i: int) -> None:
            body = {"instance_id": f"b-{i}", "url": f"{flood_url}/i/{i}", "agent": "junk"}
            r = await http.post("/v1/instances", json=body)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1

        async with asyncio.timeout(30):
            await asyncio.gather(*(one(i) for i in range(n)))
    return codes


def test_a_burst_of_registrations_beyond_the_fetch_slots_is_told_to_retry(
    tmp_path: Path,
) -> None:
    """80 registrations at once whose cards take longer than the card timeout: 32 fetch (and
    fail: 422), the rest wait for a slot no longer than the card timeout, then 503
    ``registry_busy`` (retry), instead of queueing in the registry's HTTP pool."""
    flood = flood_node(tmp_path, delay_s=0.0, card_delay_s=3.0)
    try:
        settings = RegistrySettings(data_dir=tmp_path / "registry", card_timeout_s=0.5)
        codes = asyncio.run(_burst(settings, flood.url, 80))
    finally:
        flood.proc.kill()
    assert set(codes) == {422, 503}, codes
    assert codes[422] >= 32, codes


def test_a_full_registry_takes_no_new_instance_and_its_series_stay_bounded(
    tmp_path: Path,
) -> None:
    """Junk at scale: each registration of another agent name was a new metric series and a
    new row on the page, without end. --max-instances bounds them all (default 10,000)."""
    with registry(tmp_path, extra=["--max-instances", "20"]) as reg:
        flood = flood_node(tmp_path, distinct=True)
        try:
            codes = asyncio.run(_register_many(reg.url, flood.url, 30, distinct=True))
            assert codes == {201: 20, 503: 10}, codes
            body = {"instance_id": "one-more", "url": f"{flood.url}/i/99", "agent": "junk-99"}
            r = httpx.post(f"{reg.url}/v1/instances", json=body, timeout=10)
            assert r.status_code == 503
            assert r.json()["error"] == "registry_full"
            assert "maximum of 20 instances (--max-instances)" in r.json()["message"]

            def series() -> int:
                text = httpx.get(f"{reg.url}/metrics", timeout=5).text
                return sum(1 for x in text.splitlines() if x.startswith("mesh_registry_instances{"))

            # After a probe round the gauge has one series per (agent, status) held: <= 20.
            wait_for(lambda: series() == 20, what="the gauge exported")
            agents = httpx.get(f"{reg.url}/v1/agents", timeout=5).json()["agents"]
            assert len(agents) == 20
        finally:
            flood.proc.kill()
