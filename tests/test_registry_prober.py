"""Health probes that one slow or huge instance cannot break, and status reasons the registry
writes itself. A real registry probing real (some hostile: ``tests.hostile_node``) processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hostile_node import FAKE_STATUS
from tests.registry_support import Service, instances, registry, start_node
from tests.support import Proc, free_port, wait_for, wait_until_ok

pytestmark = pytest.mark.integration


def _mem_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def hostile(tmp: Path, name: str, health: str) -> Service:
    """Start ``tests.hostile_node`` and wait for its card (its /health may never answer)."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.hostile_node", "--name", name, "--port", str(port),
            "--health", health]  # fmt: skip
    proc = Proc.start(argv, name=f"{name}-{port}", tmp=tmp)
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/.well-known/agent-card.json", proc=proc)
    return Service(proc, url, port)


def _register(reg: str, node: Service, name: str) -> None:
    body = {"instance_id": f"{name}-1", "agent": name, "url": node.url}
    r = httpx.post(f"{reg}/v1/instances", json=body, timeout=10)
    assert r.status_code == 201, r.text


def _status(reg: str, instance_id: str) -> dict[str, Any] | None:
    found = [i for i in instances(reg, status="any") if i["instance_id"] == instance_id]
    return found[0] if found else None


def test_a_huge_health_answer_is_cut_short_and_memory_stays_flat(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        node = hostile(tmp_path, "huge", "huge")
        with node.proc:
            peak_before = _mem_kb(reg.proc.pid, "VmHWM")
            _register(reg.url, node, "huge")
            seen = wait_for(
                lambda: (s := _status(reg.url, "huge-1")) and s["status"] == "critical" and s,
                timeout=10,
                what="the huge /health marked critical",
            )
            assert seen["status_reason"] == "health check failed: answer over 65536 bytes"
            # Several more probes, each cut at the cap: the peak stays where it was.
            probes = f"{node.url}/probes"
            wait_for(lambda: httpx.get(probes).json()["probes"] >= 6, what="more probes")
            assert _mem_kb(reg.proc.pid, "VmHWM") - peak_before < 30_000
            assert reg.proc.output().count("huge-1") == 1, "one log line per status change"


def test_an_instance_answering_byte_by_byte_delays_no_one_else(tmp_path: Path) -> None:
    with registry(tmp_path, probe_interval=0.5) as reg:
        slow = hostile(tmp_path, "slow", "trickle")
        with slow.proc:
            _register(reg.url, slow, "slow")
            echo = start_node(tmp_path, reg.url, name="echo", instance_id="echo-1")
            with echo.proc:
                wait_for(lambda: _status(reg.url, "echo-1"), what="echo registered")
                echo.proc.kill()
                # Probes every 0.5 s with a 0.4 s deadline each: critical within a round or two,
                # however long the trickling answer goes on.
                gone = wait_for(
                    lambda: (s := _status(reg.url, "echo-1")) and s["status"] == "critical" and s,
                    timeout=3.0,
                    what="the killed node critical",
                )
                assert gone["status_reason"] == "health check failed: unreachable"
            trickle = _status(reg.url, "slow-1")
            assert trickle is not None
            # Cut by its deadline: unknown (the registry's slowness would look the same), so
            # its status is kept until a refusal, a bad answer or a missed TTL says more.
            assert "health check failed" not in trickle["status_reason"], trickle


def test_status_reasons_never_repeat_what_an_answer_says(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        node = hostile(tmp_path, "liar", "text")
        with node.proc:
            _register(reg.url, node, "liar")
            seen = wait_for(
                lambda: (s := _status(reg.url, "liar-1")) and s["status"] == "warning" and s,
                what="warning",
            )
            assert seen["status_reason"] == "/health answered 503"
            page = httpx.get(f"{reg.url}/agents/liar").text
            api = httpx.get(f"{reg.url}/v1/agents/liar").text
            # A plain-text piece of what the instance tried to publish (a page escapes the tags).
            piece = "trust me"
            assert piece in FAKE_STATUS
            for text in (page, api, reg.proc.output()):
                assert piece not in text


async def test_an_instance_whose_heartbeats_are_late_is_probed_in_the_next_round(
    tmp_path: Path,
) -> None:
    """Past the probe budget instances take turns; one that stopped heartbeating must not wait
    for its turn (at 10,000 instances and a budget of 1,000 a killed node waited ten rounds and
    was found only by its TTL, 33.9 s after the kill against a 30 s TTL)."""
    from registry.prober import Prober
    from registry.sqlite_store import SqliteRegistryStore
    from registry.store import InstanceRecord

    now = 1_000_000.0
    store = await SqliteRegistryStore.open(tmp_path / "registry.db")
    async with httpx.AsyncClient() as http:
        prober = Prober(store, http, ttl_s=30.0, budget=3, clock=lambda: now - 100.0)
        prober._clock = lambda: now  # started 100 s ago: heartbeats, not start-up, count

        def inst(name: str, beat_ago: float) -> InstanceRecord:
            return InstanceRecord(name, "a", f"http://127.0.0.1:1/{name}", "1",
                                  last_heartbeat_at=now - beat_ago)  # fmt: skip

        fleet = [inst(f"i-{n}", 1.0) for n in range(9)] + [inst("z-late", 12.0)]
        fleet.append(inst("z-silent", 31.0))  # past its TTL: in every round, outside the budget
        first = {i.instance_id for i in prober._this_round(fleet)}
        assert {"z-late", "z-silent"} <= first
        assert len(first - {"z-silent"}) == 3  # the budget holds, the late one within it
        # The rest still take turns: every fresh instance is probed within a few rounds.
        seen = set(first)
        for _ in range(5):
            seen |= {i.instance_id for i in prober._this_round(fleet)}
        assert seen == {i.instance_id for i in fleet}
    await store.aclose()
