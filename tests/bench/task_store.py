"""Durable vs in-memory task store: is ``SqliteTaskStore`` within 1.5x of ``InMemoryTaskStore``?

    .venv/bin/python -m tests.bench.task_store [--tasks 2000] [--concurrency 16] [--seconds 60]

Starts two real ``mesh serve agents.credit_bureau:agent`` processes, one after the other (the
second with the hidden ``--store memory``), drives each with concurrent blocking ``SendMessage``
calls (unique message ids, so every call is a new task) over httpx, and prints p50/p95 latency,
tasks/s and the throughput ratio. Bounded by ``--tasks`` and ``--seconds``. Not a test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from tests.support import clean_env, free_port, running

#: The A2A version header every bench request carries.
HEADERS = {"A2A-Version": "1.0"}


#: Applicants the bureau has on file (agents/applicants.py): it REJECTS any other id.
_ON_FILE = ("APP-501", "APP-612", "APP-738", "APP-847", "APP-902")


def send_message(i: int) -> dict[str, object]:
    """A blocking ``SendMessage`` to the credit bureau's ``score``, a new message (a new task)
    each call; ``i`` picks the applicant (one on file) and the amount."""
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": uuid.uuid4().hex,
                "parts": [
                    {"data": {"applicant_id": _ON_FILE[i % len(_ON_FILE)], "amount": 1000 + abs(i)}}
                ],
                "metadata": {"skill": "score"},
            },
            "configuration": {"historyLength": 0},
        },
    }


async def _drive(
    url: str, tasks: int, concurrency: int, seconds: float
) -> tuple[list[float], float]:
    latencies: list[float] = []
    counter = iter(range(tasks))
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) as http:

        async def worker() -> None:
            for i in counter:
                if time.monotonic() > deadline:
                    return
                started = time.perf_counter()
                r = await http.post(url + "/", json=send_message(i), headers=HEADERS)
                state = r.json()["result"]["task"]["status"]["state"]
                if state != "TASK_STATE_COMPLETED":
                    raise RuntimeError(f"task {i} ended {state}")
                latencies.append(time.perf_counter() - started)

        # Warm up (imports, first connections, SQLite pages) outside the measurement.
        for i in range(50):
            await http.post(url + "/", json=send_message(-i - 1), headers=HEADERS)
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return latencies, elapsed


def _run(store: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / store), "--store", store]
    env = clean_env(MESH_LOG_LEVEL="WARNING")
    with running(argv, name=f"node-{store}", tmp=tmp, env=env, health=url + "/health"):
        latencies, elapsed = asyncio.run(_drive(url, args.tasks, args.concurrency, args.seconds))
    latencies.sort()
    return {
        "tasks": len(latencies),
        "p50_ms": statistics.median(latencies) * 1000,
        "p95_ms": latencies[int(len(latencies) * 0.95) - 1] * 1000,
        "tasks_per_s": len(latencies) / elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.task_store", description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per store (2000)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent senders (16)")
    parser.add_argument("--seconds", type=float, default=60, help="time cap per store (60)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mesh-bench-") as tmp:
        rows = {store: _run(store, args, Path(tmp)) for store in ("memory", "sqlite")}
    print(f"{'store':<8} {'tasks':>6} {'p50 ms':>8} {'p95 ms':>8} {'tasks/s':>9}")
    for store, row in rows.items():
        print(
            f"{store:<8} {row['tasks']:>6.0f} {row['p50_ms']:>8.2f} {row['p95_ms']:>8.2f} "
            f"{row['tasks_per_s']:>9.1f}"
        )
    ratio = rows["memory"]["tasks_per_s"] / rows["sqlite"]["tasks_per_s"]
    verdict = "OK" if ratio <= 1.5 else "TOO SLOW"
    print(f"memory/sqlite throughput ratio: {ratio:.2f} (target <= 1.5): {verdict}")
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
