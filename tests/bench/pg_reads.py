"""Reads beside writes on PostgreSQL: how long a ``GetTask`` waits while a node's writes run.

    .venv/bin/python -m tests.bench.pg_reads [--rounds 2] [--seconds 6] [--concurrency 16]

Starts a PostgreSQL server (``tests.postgres_support.running_postgres``) and, per round, two real
``mesh serve agents.credit_bureau:agent --store postgresql://...`` nodes one after the other:
``MESH_PG_POOL_MAX=0`` (reads queue with the writes on the one connection, the design before the
reader pool) and the default pool (reads on their own connections). Each node gets concurrent
blocking ``SendMessage`` calls (every one a new task: group-committed writes) and, meanwhile,
one ``GetTask`` after another of a settled task (read from the database). Prints the GetTask
p50/p95/p99 and the sends per second. Rounds alternate the two, for this machine's moving load.
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.bench.task_store import HEADERS, send_message
from tests.postgres_support import running_postgres, server_bin
from tests.support import clean_env, free_port, running


async def _drive(url: str, seconds: float, concurrency: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=concurrency + 1)
    async with httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) as http:
        first = (await http.post(url + "/", json=send_message(0), headers=HEADERS)).json()
        task_id = first["result"]["task"]["id"]
        for i in range(50):  # warm up: imports, connections, pages
            await http.post(url + "/", json=send_message(-i - 1), headers=HEADERS)
        deadline = time.monotonic() + seconds
        sent = 0

        async def sender() -> None:
            nonlocal sent
            while time.monotonic() < deadline:
                r = await http.post(url + "/", json=send_message(sent), headers=HEADERS)
                r.raise_for_status()
                sent += 1

        reads: list[float] = []

        async def reader() -> None:
            get = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
            while time.monotonic() < deadline:
                began = time.perf_counter()
                r = await http.post(url + "/", json=get, headers=HEADERS)
                if r.json()["result"]["id"] != task_id:
                    raise RuntimeError(f"GetTask answered {r.text[:200]}")
                reads.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(reader(), *(sender() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    reads.sort()
    return {
        "reads": len(reads),
        "p50_ms": statistics.median(reads) * 1000,
        "p95_ms": reads[int(len(reads) * 0.95) - 1] * 1000,
        "p99_ms": reads[int(len(reads) * 0.99) - 1] * 1000,
        "sends_per_s": sent / elapsed,
    }


def _run(db_url: str, pool_max: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port), "--no-register"]
    argv += ["--data-dir", str(tmp / f"node-{pool_max}"), "--store", db_url]
    env = clean_env(MESH_LOG_LEVEL="WARNING", MESH_PG_POOL_MAX=pool_max)
    with running(argv, name=f"node-pool-{pool_max}", tmp=tmp, env=env, health=url + "/health"):
        return asyncio.run(_drive(url, args.seconds, args.concurrency))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.pg_reads", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds (2)")
    parser.add_argument("--seconds", type=float, default=6, help="seconds per node (6)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent senders (16)")
    args = parser.parse_args(argv)
    bindir = server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries: apt-get install postgresql", file=sys.stderr)
        return 2
    rows: list[tuple[str, dict[str, float]]] = []
    with running_postgres(bindir) as server, tempfile.TemporaryDirectory() as tmp:
        import psycopg

        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("create database bench")
        for _ in range(args.rounds):
            for pool_max in ("0", "4"):
                rows.append((pool_max, _run(server.url("bench"), pool_max, args, Path(tmp))))
    print(
        f"{'MESH_PG_POOL_MAX':<17} {'reads':>6} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} sends/s"
    )
    for pool_max, row in rows:
        print(
            f"{pool_max:<17} {row['reads']:>6.0f} {row['p50_ms']:>7.2f} {row['p95_ms']:>7.2f} "
            f"{row['p99_ms']:>7.2f} {row['sends_per_s']:>7.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
