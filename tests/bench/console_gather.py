"""What the console's gathering costs the registry, at a simulated fleet (docs/performance.md).

    python -m tests.bench.console_gather                 # 1,000 instances, 5 s interval, 6 rounds
    python -m tests.bench.console_gather --instances 200 --rounds 3

For each mode a real registry (``python -m registry``) and one ``tests.bench.fleet`` process
serving every instance; the instances are registered through the API, then the registry probes
them every ``--interval``. Modes: ``stats`` (each answer carries a node's window stats, as mesh
nodes send them) and ``no-stats`` (the same answers without: what probing cost before the
console). Measured: the registry's CPU per interval (utime+stime from /proc), each round's
duration (the registry's /introspect ``prober.last_round``), and the wall time of a
``GET /v1/topology`` and of the ``/topology`` page over the whole fleet (median of 5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.bench.procstat import cpu_seconds
from tests.support import Proc, clean_env, free_port, wait_for, wait_until_ok


def _register(reg: str, fleet: str, n: int, agents: int) -> None:
    body = {
        "instance_id": f"fleet-{n}",
        "agent": f"agent-{n % agents}",
        "url": f"{fleet}/i/{n}",
        "version": "1",
    }
    for _ in range(50):  # 503 registry_busy: too many at once, retry
        r = httpx.post(f"{reg}/v1/instances", json=body, timeout=30)
        if r.status_code == 201:
            return
        if r.status_code != 503:
            raise AssertionError(f"registering {n}: {r.status_code} {r.text}")
        time.sleep(0.1)
    raise AssertionError(f"registering {n}: still busy")


def _introspect(reg: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{reg}/introspect", timeout=30).json()
    return doc


def _timed_get(url: str) -> float:
    times = []
    for _ in range(5):
        started = time.perf_counter()
        r = httpx.get(url, timeout=60)
        times.append(time.perf_counter() - started)
        assert r.status_code == 200, r.status_code
    return statistics.median(times) * 1000


def run(
    stats: bool, *, instances: int, agents: int, interval: float, rounds: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="console-gather-") as tmp_dir:
        tmp = Path(tmp_dir)
        fleet_port, reg_port = free_port(), free_port()
        fleet_argv = [sys.executable, "-m", "tests.bench.fleet", "--port", str(fleet_port),
                      "--agents", str(agents), *([] if stats else ["--no-stats"])]  # fmt: skip
        reg_argv = [sys.executable, "-m", "registry", "--port", str(reg_port),
                    "--data-dir", str(tmp / "reg"), "--probe-interval", str(interval),
                    "--ttl", "3600", "--remove-after", "3600", "--log-level", "warning"]  # fmt: skip
        fleet = f"http://127.0.0.1:{fleet_port}"
        reg = f"http://127.0.0.1:{reg_port}"
        with Proc.start(fleet_argv, name="fleet", tmp=tmp, env=clean_env()) as fleet_proc:
            wait_until_ok(f"{fleet}/ready", proc=fleet_proc)
            with Proc.start(reg_argv, name="registry", tmp=tmp, env=clean_env()) as reg_proc:
                wait_until_ok(f"{reg}/health", proc=reg_proc)
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda n: _register(reg, fleet, n, agents), range(instances)))
                wait_for(
                    lambda: _introspect(reg)["prober"]["last_round"]["instances"] == instances,
                    timeout=interval * 3 + 30,
                    what="a round over the whole fleet",
                )
                durations: dict[int, float] = {}
                cpu0, t0 = cpu_seconds(reg_proc.pid), time.monotonic()
                deadline = t0 + rounds * interval
                while time.monotonic() < deadline:  # bounded by the deadline
                    last = _introspect(reg)["prober"]["last_round"]
                    durations[last["rounds"]] = last["duration_s"]
                    time.sleep(interval / 4)
                cpu1, t1 = cpu_seconds(reg_proc.pid), time.monotonic()
                doc = _introspect(reg)
                try:
                    topology_ms = _timed_get(f"{reg}/v1/topology")
                    page_ms = _timed_get(f"{reg}/topology")
                except AssertionError:
                    print(reg_proc.output()[-4000:], file=sys.stderr)
                    raise
        cpu_per_interval = (cpu1 - cpu0) / ((t1 - t0) / interval)
        return {
            "mode": "stats" if stats else "no-stats",
            "instances": instances,
            "interval_s": interval,
            "rounds": len(durations),
            "round_s_median": statistics.median(durations.values()),
            "round_s_max": max(durations.values()),
            "cpu_ms_per_interval": cpu_per_interval * 1000,
            "cpu_pct": cpu_per_interval / interval * 100,
            "with_stats": doc["gathering"]["instances_with_stats"],
            "topology_json_ms": topology_ms,
            "topology_page_ms": page_ms,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rows = [
        run(stats, instances=args.instances, agents=args.agents, interval=args.interval,
            rounds=args.rounds)
        for stats in (False, True)
    ]  # fmt: skip
    head = ("mode", "instances", "rounds", "round s (median/max)", "registry CPU/interval",
            "CPU %", "with stats", "/v1/topology", "/topology")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        print(
            f"{r['mode']} | {r['instances']} | {r['rounds']} | "
            f"{r['round_s_median']:.2f} / {r['round_s_max']:.2f} | "
            f"{r['cpu_ms_per_interval']:.0f} ms | {r['cpu_pct']:.1f}% | {r['with_stats']} | "
            f"{r['topology_json_ms']:.0f} ms | {r['topology_page_ms']:.0f} ms"
        )


if __name__ == "__main__":
    main()
