"""Probe connections at 1,000 instances: one shared pool, a pool per target host, or a
short-lived connection per probe (issue 21; docs/performance.md, "The registry at fleet scale").

    python -m tests.bench.probe_connections                 # 1 and 1,000 origins
    python -m tests.bench.probe_connections --origins 1,250 --rounds 5

A fake fleet (``tests.bench.fleet``'s app) in one process, listening on ``--origins`` ports of
127.0.0.1 (an origin per port: in a real mesh each node is its own host:port), serves
``/health`` for 1,000 instances spread over them. This process probes them the way the registry
does (``mesh._outbound.bounded_get`` through ``mesh._netguard.create_http_client``, 64 at once,
each within 2 s), round after round, in three ways:

- ``shared``: the registry's one client (96 connections, 20 kept alive), whatever the origin;
- ``per-host``: a client per origin (a connection or two each, kept alive between rounds);
- ``short``: the shared client, each probe asking ``Connection: close`` (a new TCP connection
  per probe, nothing kept);
- ``once``: what the registry does since (``mesh._outbound.get_once`` on the shared client): a
  connection per probe, as ``short``, made and read with h11 on asyncio streams, not httpx.

Prints the CPU this process spent per probe (what a probe costs the registry), a round's
duration, and failures; the first round of each mode (connections opened) is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._outbound import FetchFailed, bounded_get, get_once
from tests.support import Proc, clean_env, wait_for, wait_until_ok

INSTANCES = 1000
CONCURRENCY = 64
TIMEOUT_S = 2.0

_SERVE = """
import pathlib, socket, sys, uvicorn
from tests.bench.fleet import create_app
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(2048)
    socks.append(s)
ports = [s.getsockname()[1] for s in socks]
pathlib.Path(sys.argv[1] + ".tmp").write_text(",".join(map(str, ports)))
pathlib.Path(sys.argv[1] + ".tmp").rename(sys.argv[1])
config = uvicorn.Config(create_app(ports[0], 100, False), log_level="warning")
uvicorn.Server(config).run(sockets=socks)
"""


@contextmanager
def _fleet(origins: int) -> Iterator[list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        ports_file = Path(tmp) / "ports"
        argv = [sys.executable, "-c", _SERVE, str(ports_file), str(origins)]
        with Proc.start(argv, name="fleet", tmp=Path(tmp), env=clean_env()) as proc:
            wait_for(ports_file.exists, timeout=60, what="the fleet's ports")
            ports = [int(p) for p in ports_file.read_text().split(",")]
            wait_until_ok(f"http://127.0.0.1:{ports[0]}/ready", proc=proc)
            yield [f"http://127.0.0.1:{p}" for p in ports]


def _client(connections: int, keepalive: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=keepalive)
    policy = NetworkPolicy.default_for("127.0.0.1")
    return create_http_client(policy, timeout=TIMEOUT_S, limits=limits)


async def _rounds(mode: str, bases: list[str], rounds: int) -> dict[str, float]:
    urls = [f"{bases[n % len(bases)]}/i/{n}/health?stats=1" for n in range(INSTANCES)]
    shared = _client(96, 20)
    per_host = {b: _client(2, 2) for b in bases} if mode == "per-host" else {}
    headers = {"Connection": "close"} if mode == "short" else None
    slots = asyncio.Semaphore(CONCURRENCY)
    failed = 0

    async def probe(url: str, base: str) -> None:
        nonlocal failed
        http = per_host.get(base, shared)
        async with slots:
            try:
                if mode == "once":
                    r = await get_once(http, url, max_bytes=65536, timeout_s=TIMEOUT_S)
                else:
                    r = await bounded_get(
                        http, url, max_bytes=65536, timeout_s=TIMEOUT_S, headers=headers
                    )
                failed += r.status_code != 200
            except FetchFailed:
                failed += 1

    cpu: list[float] = []
    wall: list[float] = []
    try:
        for k in range(rounds + 1):
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(probe(u, bases[n % len(bases)]) for n, u in enumerate(urls)))
            if k:  # the first round opens the connections
                cpu.append(time.process_time() - cpu0)
                wall.append(time.perf_counter() - wall0)
    finally:
        await shared.aclose()
        for c in per_host.values():
            await c.aclose()
    return {
        "cpu_ms_per_probe": statistics.median(cpu) / INSTANCES * 1000,
        "round_s": statistics.median(wall),
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.probe_connections")
    parser.add_argument("--origins", default="1,1000", help="origins (ports), comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2, help="alternated passes over the modes")
    parser.add_argument("--modes", default="shared,per-host,short,once", help="comma-separated")
    args = parser.parse_args(argv)
    print("| origins | mode | CPU ms per probe | round s | failed |")
    print("|---|---|---|---|---|")
    for origins in (int(s) for s in args.origins.split(",")):
        with _fleet(origins) as bases:
            for _ in range(args.repeat):
                for mode in args.modes.split(","):
                    r = asyncio.run(_rounds(mode, bases, args.rounds))
                    print(
                        f"| {origins:,} | {mode} | {r['cpu_ms_per_probe']:.2f} | "
                        f"{r['round_s']:.2f} | {r['failed']:.0f} |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
