"""The registry's CPU per heartbeat and per lookup, through a real uvicorn (issue 21; docs/performance.md,
"The registry at fleet scale").

    python -m tests.bench.registry_requests                  # 1,000 instances, 8 connections
    PYTHONPATH=/tmp/old python -m tests.bench.registry_requests   # another tree, to alternate

A real registry (``python -m registry``) with probes once an hour (so nothing but the requests
measured runs in it), ``--instances`` instances of 100 agents registered on one
``tests.bench.fleet`` process, then for ``--seconds`` each: heartbeats as fast as the registry
answers them over ``--connections`` raw keep-alive connections, then lookups of one agent
(``GET /v1/instances?agent=``) the same way. Prints the registry's CPU per request (every
thread's, from the scheduler's count) and the requests per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.bench.registry_scale import AGENTS, RawHttp, _fleet, _register
from tests.support import Proc, clean_env, free_port, wait_until_ok


async def _blast(
    port: int, connections: int, seconds: float, target: Callable[[int], tuple[str, str, str]]
) -> int:
    done = 0
    stop = time.monotonic() + seconds

    async def lane(k: int) -> None:
        nonlocal done
        raw = RawHttp(port)
        n = k
        try:
            while time.monotonic() < stop:
                method, path, headers = target(n)
                status = await raw.request(method, path, headers)
                assert status == 200, (method, path, status)
                done += 1
                n += connections
        finally:
            raw.close()

    await asyncio.gather(*(lane(k) for k in range(connections)))
    return done


def cpu_seconds(pid: int) -> float:
    """Seconds on a CPU of every thread of ``pid`` so far, from the scheduler's own count
    (``/proc/<pid>/task/*/schedstat``, nanoseconds): ``/proc/<pid>/stat``'s clock ticks are
    sampled, and a server that runs in bursts shorter than a tick is miscounted by them."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(task.read_text().split()[0])
        except OSError:  # the thread ended while we looked
            continue
    return total / 1e9


async def _cpu_per_request(pid: int, run: Callable[[], Awaitable[int]]) -> tuple[float, float]:
    cpu0, clock0 = cpu_seconds(pid), time.perf_counter()
    done = await run()
    cpu, wall = cpu_seconds(pid) - cpu0, time.perf_counter() - clock0
    return cpu / done * 1e6, done / wall


async def measure(instances: int, seconds: float, connections: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="registry-requests-") as tmp_dir:
        tmp = Path(tmp_dir)
        port = free_port()
        reg = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "registry", "--port", str(port), "--data-dir",
                str(tmp / "reg"), "--probe-interval", "3600", "--ttl", "3600",
                "--max-instances", str(instances + 10), "--log-level", "warning"]  # fmt: skip
        with (
            _fleet(tmp, stats=False) as (_, fleet),
            Proc.start(argv, name="registry", tmp=tmp, env=clean_env()) as proc,
        ):
            wait_until_ok(f"{reg}/health", proc=proc)
            secrets, _ = await _register(reg, fleet, list(range(instances)), "fleet")
            ids = list(secrets.items())

            def heartbeat(n: int) -> tuple[str, str, str]:
                iid, secret = ids[n % len(ids)]
                return (
                    "PUT",
                    f"/v1/instances/{iid}/heartbeat",
                    f"Mesh-Instance-Secret: {secret}\r\n",
                )

            def lookup(n: int) -> tuple[str, str, str]:
                return "GET", f"/v1/instances?agent=agent-{n % AGENTS}", ""

            hb_us, hb_rps = await _cpu_per_request(
                proc.pid, lambda: _blast(port, connections, seconds, heartbeat)
            )
            lk_us, lk_rps = await _cpu_per_request(
                proc.pid, lambda: _blast(port, connections, seconds, lookup)
            )
    return {
        "instances": instances,
        "heartbeat_cpu_us": hb_us,
        "heartbeats_per_s": hb_rps,
        "lookup_cpu_us": lk_us,
        "lookups_per_s": lk_rps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.registry_requests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args(argv)  # fmt: skip
    result = asyncio.run(measure(args.instances, args.seconds, args.connections))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
