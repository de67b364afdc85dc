"""``python -m tests.bench.retention_soak``: a node taking N tasks with retention on and off, its
``node.db`` size, page count and freelist through the run (issue 19 item 3, on disk: terminal
tasks and idle sessions accumulated forever).

    python -m tests.bench.retention_soak                     # 20,000 tasks per mode
    python -m tests.bench.retention_soak --tasks 40000 --keep 2000 --modes on,off,vacuum

Each mode serves the bench coordinator (``tests.bench.agents.coordinator:local``: an LLM turn
on the scripted model with one tool call, so every task also makes a session with its events)
with ``mesh serve`` in a fresh data dir, and ``--clients`` concurrent clients send blocking
``SendMessage`` calls, each a new conversation, every answer checked. ``off``: every limit
off (the node as it was). ``on``: at most ``--keep`` terminal tasks, sessions idle ``--idle``
seconds, swept every second. ``vacuum``: as ``on``, the file created with
``pragma auto_vacuum = incremental`` first (each sweep gives free pages back). Bounded: N tasks
per mode, a 20 s answer timeout each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support import Proc, clean_env, free_port, wait_until_ok

AGENT = "tests.bench.agents.coordinator:local"
POINTS = 8


def _stat(db: Path) -> dict[str, Any]:
    """The file's size (and its WAL's), its pages, its free pages, the rows kept."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        pages = conn.execute("pragma page_count").fetchone()[0]
        free = conn.execute("pragma freelist_count").fetchone()[0]
        tasks = conn.execute("select count(*) from a2a_tasks").fetchone()[0]
        sessions = conn.execute("select count(*) from mesh_sessions").fetchone()[0]
        events = conn.execute("select count(*) from mesh_session_events").fetchone()[0]
    finally:
        conn.close()
    wal = Path(str(db) + "-wal")
    return {
        "file_mib": db.stat().st_size / 2**20,
        "wal_mib": wal.stat().st_size / 2**20 if wal.exists() else 0.0,
        "pages": pages,
        "free": free,
        "tasks": tasks,
        "sessions": sessions,
        "events": events,
    }


def _env(mode: str, keep: int, idle: float) -> dict[str, str]:
    if mode == "off":
        limits = {
            "MESH_RETAIN_TASKS_FOR": "off",
            "MESH_RETAIN_TASKS_MAX": "off",
            "MESH_RETAIN_SESSIONS_FOR": "off",
        }
    else:
        limits = {
            "MESH_RETAIN_TASKS_FOR": "off",
            "MESH_RETAIN_TASKS_MAX": str(keep),
            "MESH_RETAIN_SESSIONS_FOR": f"{idle}s",
            "MESH_RETENTION_INTERVAL": "1s",
        }
    return clean_env(MESH_MODEL="scripted", **limits)


async def _send(http: httpx.AsyncClient, url: str, i: int) -> None:
    message = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "parts": [{"text": f"score a-{i % 9000} for {1000 + i % 50}"}],
    }
    body = {"jsonrpc": "2.0", "id": i, "method": "SendMessage", "params": {"message": message}}
    r = await http.post(url + "/", json=body, headers={"A2A-Version": "1.0"})
    answer = r.json()
    state = answer.get("result", {}).get("task", {}).get("status", {}).get("state")
    if state != "TASK_STATE_COMPLETED":
        raise AssertionError(f"task {i}: {str(answer)[:1500]}")


async def _drive(url: str, db: Path, tasks: int, clients: int) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    every = max(1, tasks // POINTS)
    sent = 0
    started = time.perf_counter()
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=20.0, trust_env=False, limits=limits) as http:

        async def worker() -> None:
            nonlocal sent
            while sent < tasks:
                sent += 1
                i = sent
                await _send(http, url, i)
                if i % every == 0:
                    samples.append({"sent": i, "s": time.perf_counter() - started, **_stat(db)})

        await asyncio.gather(*(worker() for _ in range(clients)))
    return sorted(samples, key=lambda s: s["sent"])


def run_mode(mode: str, tasks: int, clients: int, keep: int, idle: float) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix=f"retention-{mode}-"))
    data = tmp / "data"
    data.mkdir()
    db = data / "node.db"
    if mode == "vacuum":
        conn = sqlite3.connect(db)
        conn.execute("pragma auto_vacuum = incremental")
        conn.execute("vacuum")  # writes the header: the setting holds from the first table on
        conn.close()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", AGENT, "--port", str(port), "--data-dir", str(data),
            "--no-register"]  # fmt: skip
    proc = Proc.start(argv, name=f"node-{mode}", tmp=tmp, env=_env(mode, keep, idle))
    try:
        wait_until_ok(url + "/health", proc=proc)
        samples = asyncio.run(_drive(url, db, tasks, clients))
        if mode != "off":  # what the next sweeps leave once the load stops
            time.sleep(max(2.5, idle + 2.5))
            samples.append({"sent": tasks, "s": -1.0, **_stat(db)})
    finally:
        proc.terminate()
    return samples


def _print(mode: str, samples: list[dict[str, Any]]) -> None:
    print(f"\n## {mode}")
    print(
        "| tasks sent | node.db MiB | -wal MiB | pages | free pages | tasks kept | sessions | events |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in samples:
        label = f"{s['sent']:,}" if s["s"] >= 0 else f"{s['sent']:,} + idle"
        print(
            f"| {label} | {s['file_mib']:.2f} | {s['wal_mib']:.2f} | {s['pages']:,} | "
            f"{s['free']:,} | {s['tasks']:,} | {s['sessions']:,} | {s['events']:,} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--keep", type=int, default=2_000, help="MESH_RETAIN_TASKS_MAX when on")
    parser.add_argument("--idle", type=float, default=5.0, help="MESH_RETAIN_SESSIONS_FOR (s)")
    parser.add_argument("--modes", default="on,off")
    args = parser.parse_args(argv)
    print(
        f"retention soak: {args.tasks:,} tasks per mode, {args.clients} clients, "
        f"load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}"
    )
    for mode in args.modes.split(","):
        began = time.perf_counter()
        samples = run_mode(mode, args.tasks, args.clients, args.keep, args.idle)
        _print(mode, samples)
        took = time.perf_counter() - began
        print(f"({took:.0f} s, load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
