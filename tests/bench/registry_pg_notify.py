"""What a NOTIFY per heartbeat would cost registry replicas on one PostgreSQL (issue 17).

``python -m tests.bench.registry_pg_notify --instances 2000 --rounds 3``: a PostgreSQL server of
its own, replica A and B (``SqliteRegistryStore.open_postgres``, B listening), ``--instances``
registered on A; then each round heartbeats every instance on A (64 at a time, as the registry's
clients would) once the way the store does (one ``update``) and once with a ``pg_notify`` in the
same transaction, which B hears and applies (``_heard``: it reads the row again). Prints, per
heartbeat, wall time, this process's CPU (A and B) and the database server's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from registry.card import agent_record
from registry.sqlite_store import CHANNEL, SqliteRegistryStore
from registry.store import InstanceRecord, secret_hash
from tests.bench.procstat import cpu_seconds
from tests.postgres_support import running_postgres, server_bin

OWNER = secret_hash("bench")


def _card(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": "d",
        "version": "1",
        "supportedInterfaces": [{"url": "http://127.0.0.1:9", "protocolBinding": "JSONRPC"}],
        "skills": [{"id": "s", "name": "S", "description": "d", "tags": []}],
    }


async def _beat(store: SqliteRegistryStore, iid: str, at: float, *, notify: bool) -> None:
    def write(conn: Any) -> None:
        row = conn.execute(
            "update registry_instances set last_heartbeat_at = ? where instance_id = ? "
            "returning agent",
            (at, iid),
        ).fetchone()
        if notify:
            payload = json.dumps({"a": row["agent"], "i": [iid]})
            conn.execute("select pg_notify(?, ?)", (CHANNEL, payload))

    await store._db.write(write)


async def _round(
    a: SqliteRegistryStore, ids: list[str], pg_pid: int, *, notify: bool
) -> tuple[float, float, float]:
    sem = asyncio.Semaphore(64)
    at = time.time()

    async def one(iid: str) -> None:
        async with sem:
            await _beat(a, iid, at, notify=notify)

    cpu0, db0, t0 = time.process_time(), cpu_seconds(pg_pid), time.perf_counter()
    await asyncio.gather(*(one(i) for i in ids))
    await asyncio.sleep(0.5)  # B applies what it heard (its CPU counted: same process)
    wall = time.perf_counter() - t0 - 0.5
    n = len(ids)
    return (
        wall / n * 1e6,
        (time.process_time() - cpu0) / n * 1e6,
        (cpu_seconds(pg_pid) - db0) / n * 1e6,
    )


async def main(instances: int, rounds: int) -> None:
    bindir = server_bin()
    assert bindir is not None, "needs PostgreSQL's server binaries"
    with running_postgres(bindir) as server:
        pg_pid = int((Path(server.data) / "postmaster.pid").read_text().split()[0])
        url = server.url()
        a = await SqliteRegistryStore.open_postgres(url, refresh_s=3600)
        b = await SqliteRegistryStore.open_postgres(url, refresh_s=3600)
        agents = [agent_record(_card(f"a{k}"), expected_name=f"a{k}", now=1.0) for k in range(100)]
        ids = [f"i-{k}" for k in range(instances)]
        for k, iid in enumerate(ids):
            inst = InstanceRecord(iid, agents[k % 100].name, f"http://h/{iid}", "1")
            await a.put(agents[k % 100], inst, secret_hash=OWNER, presented=None)
        print(f"{instances} instances, load {os.getloadavg()[0]:.1f}")
        for r in range(rounds):
            for notify in (False, True):
                wall, cpu, db = await _round(a, ids, pg_pid, notify=notify)
                label = "notify" if notify else "plain "
                print(
                    f"round {r} {label}: {wall:6.0f} us wall, {cpu:5.0f} us A+B CPU, {db:5.0f} us db CPU per heartbeat"
                )
        await a.aclose()
        await b.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.instances, args.rounds))
