"""Run one row: start its processes, time them to healthy, warm up, load, read /proc, stop.

A row's numbers come from one process tree started fresh for it, so rows do not share caches,
stores or allocator state. Phases, in order: spawn -> /health 200 (timed) -> RSS "start" ->
checked warm-up -> sequential latency (1 connection) -> throughput at each concurrency level
-> a soak run at the last level, over which memory growth per task is read -> RSS "after".
CPU per request is the servers' utime+stime over all measured phases divided
by the requests they answered.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench import procstat
from tests.bench.load import run_wrk, warm_up
from tests.bench.scenarios import Ctx, Row, ServerSpec
from tests.support import ROOT, Proc, clean_env, free_port

__all__ = ["Options", "run_row", "spawn"]

MB = 1024 * 1024


@dataclass(frozen=True)
class Options:
    duration_s: int = 5
    latency_s: int = 3
    warmup_requests: int = 300
    levels: tuple[int, ...] = (16, 64)
    health_timeout_s: float = 60.0


def _healthy(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


# What the servers import from this tree (the rest is site-packages', compiled at install).
_SOURCES = ("mesh", "registry", "tests")


@functools.cache
def _compiled() -> None:
    """Servers start from compiled bytecode, as an installed package does (pip compiles it):
    with PYTHONDONTWRITEBYTECODE set (this machine's sessions) an editable mesh recompiled its
    ~100 modules at every spawn (~50 ms the SDK, whose modules are site-packages' bytecode,
    did not pay). Compiled once per run, into the tree's ``__pycache__`` (git ignores it),
    checked against each source's hash when imported: an edit since is never run stale."""
    sources = [str(ROOT / p) for p in _SOURCES]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", *sources],
        env=clean_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )


def spawn(spec: ServerSpec, ctx: Ctx, timeout_s: float) -> tuple[Proc, float]:
    """Start ``spec`` and return it with the seconds from spawn to its first /health 200."""
    _compiled()
    env = clean_env(**spec.env(ctx))
    t0 = time.monotonic()
    proc = Proc.start(spec.argv(ctx), name=spec.name, tmp=ctx.tmp, env=env)
    port = ctx.ports[spec.name]
    deadline = t0 + timeout_s
    # Polled every 5 ms: spawn times are ~1 s, so the polling error stays well under 1 %.
    while not _healthy(port, spec.health):
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{spec.name} exited with {proc.popen.returncode}:\n{proc.output()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{spec.name} not healthy after {timeout_s}s:\n{proc.output()}")
        time.sleep(0.005)
    return proc, time.monotonic() - t0


def _cpu(procs: list[Proc]) -> float:
    return sum(procstat.cpu_seconds(p.pid) for p in procs)


def _rss(procs: list[Proc]) -> int:
    return sum(procstat.rss_bytes(p.pid) for p in procs)


def run_row(row: Row, opts: Options, tmp: Path) -> dict[str, Any]:
    """Measure ``row``; the result is JSON-ready. Raises with the server's log on failure."""
    ctx = Ctx(ports={s.name: free_port() for s in row.servers}, tmp=tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    procs: list[Proc] = []
    facts: list[dict[str, Any]] = []
    run = uuid.uuid4().hex[:8]
    try:
        for spec in row.servers:
            proc, spawn_s = spawn(spec, ctx, opts.health_timeout_s)
            procs.append(proc)
            facts.append(
                {
                    "name": spec.name,
                    "spawn_to_healthy_s": round(spawn_s, 3),
                    # The CPU the start took: less moved by other load on the machine than the
                    # wall time, which counts the time the process waited for a core.
                    "spawn_cpu_s": round(procstat.cpu_seconds(proc.pid), 3),
                    "rss_start_mb": round(procstat.rss_bytes(proc.pid) / MB, 1),
                }
            )
        target = row.target(ctx)
        warm_ms = warm_up(target, requests=opts.warmup_requests, run_id=f"{run}-warm")
        cpu_before = [procstat.cpu_seconds(p.pid) for p in procs]
        latency = run_wrk(target, connections=1, duration_s=opts.latency_s, run_id=f"{run}-seq")
        answered = latency.requests
        throughput: dict[str, dict[str, Any]] = {}
        for level in opts.levels:
            c0, t0 = _cpu(procs), time.monotonic()
            load = run_wrk(
                target, connections=level, duration_s=opts.duration_s, run_id=f"{run}-c{level}"
            )
            util = (_cpu(procs) - c0) / (time.monotonic() - t0)
            throughput[str(level)] = {**load.as_dict(), "server_cpu_util": round(util, 3)}
            answered += load.requests
        cpu_after = [procstat.cpu_seconds(p.pid) for p in procs]
        # Memory per task is read over one more run at the last level, once the first bursts
        # have grown the buffers and caches they need: a store that keeps every task shows
        # steady growth here, a durable one ~0.
        rss_settled = _rss(procs)
        soak = run_wrk(
            target, connections=opts.levels[-1], duration_s=opts.duration_s, run_id=f"{run}-soak"
        )
        rss_after = _rss(procs)
        for fact, proc, before, after in zip(facts, procs, cpu_before, cpu_after, strict=True):
            fact["rss_after_mb"] = round(procstat.rss_bytes(proc.pid) / MB, 1)
            fact["cpu_s"] = round(after - before, 3)
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(Exception):
                proc.terminate()
    for fact in facts:
        record = tmp / f"{fact['name']}.modules.json"
        if record.exists():
            fact["modules"] = json.loads(record.read_text())
    cpu = sum(after - before for before, after in zip(cpu_before, cpu_after, strict=True))
    growth = (rss_after - rss_settled) / soak.requests if soak.requests else 0.0
    return {
        "key": row.key,
        "label": row.label,
        "status": "ok",
        "processes": facts,
        # The loaded process: the one a client would wait for.
        "spawn_to_healthy_s": facts[-1]["spawn_to_healthy_s"],
        "spawn_cpu_s": facts[-1]["spawn_cpu_s"],
        "warmup_mean_ms": round(warm_ms, 3),
        "latency": latency.as_dict(),
        "throughput": throughput,
        "peak_rps": round(max(t["rps"] for t in throughput.values()), 1) if throughput else 0.0,
        "cpu_ms_per_request": round(1000 * cpu / answered, 3) if answered else None,
        "rss_start_mb": round(sum(f["rss_start_mb"] for f in facts), 1),
        "rss_after_mb": round(rss_after / MB, 1),
        "rss_growth_bytes_per_task": round(growth, 1),
        "soak_requests": soak.requests,
        "errors": latency.errors + soak.errors + sum(t["errors"] for t in throughput.values()),
    }
