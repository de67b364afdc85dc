"""The load generator: wrk (C, one thread) driven by ``wrk.lua``, plus a checked warm-up.

wrk is used rather than a Python client because on a 2-core machine a Python load generator
needs most of a core to produce ~10k requests/s and would cap the floor row; wrk needs a small
fraction of one. Every run reports wrk's own CPU use (``client_cpu_util``) so a reader can see
the client was not the bottleneck. Each request body gets a unique id (A2A nodes dedupe a
repeated ``messageId``), and each response is checked for an expected substring.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

__all__ = ["LoadResult", "Target", "run_wrk", "warm_up", "wrk_path"]

LUA = Path(__file__).with_name("wrk.lua")
ID = "{{ID}}"


@dataclass(frozen=True)
class Target:
    """One endpoint to load: a POST of ``body`` (containing ``{{ID}}`` once) to ``url``."""

    url: str
    body: str
    # A substring every good response contains (e.g. "TASK_STATE_COMPLETED").
    expect: str
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.body.count(ID) != 1:
            raise ValueError(f"the body template must contain {ID} exactly once: {self.body!r}")

    def render(self, unique: str) -> str:
        return self.body.replace(ID, unique)


@dataclass(frozen=True)
class LoadResult:
    connections: int
    duration_s: float
    requests: int
    # Transport errors + non-200 + responses without the expected substring.
    errors: int
    rps: float
    latency_ms: dict[str, float]
    # wrk's CPU seconds / wall seconds (1.0 = one core busy).
    client_cpu_util: float
    first_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "duration_s": round(self.duration_s, 3),
            "requests": self.requests,
            "errors": self.errors,
            "rps": round(self.rps, 1),
            "latency_ms": self.latency_ms,
            "client_cpu_util": round(self.client_cpu_util, 3),
            **({"first_error": self.first_error} if self.first_error else {}),
        }


def wrk_path() -> str:
    """Path of wrk, or a clear error saying how to get it."""
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk (or run .ci/system-deps)")
    return path


def run_wrk(
    target: Target,
    *,
    connections: int,
    duration_s: int,
    run_id: str,
    timeout_s: float = 10.0,
    script: Path = LUA,
) -> LoadResult:
    """Load ``target`` with ``connections`` keep-alive connections for ``duration_s`` seconds.
    ``script``: ``wrk.lua`` or a script that loads it and adds to it (tests.bench.idle_gap)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        fh.write(target.body)
        template = fh.name
    argv = [
        wrk_path(),
        "-t1",
        f"-c{connections}",
        f"-d{duration_s}s",
        f"--timeout={timeout_s:g}s",
        "-s",
        str(script),
        target.url,
        "--",
        template,
        run_id,
        target.expect,
        *(f"{k}={v}" for k, v in target.headers.items()),
    ]
    started = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # wrk stops itself after -d; the watchdog only guards against a wedged wrk.
        watchdog = threading.Timer(duration_s + timeout_s + 30, proc.kill)
        watchdog.start()
        try:
            # wait4 gives wrk's own rusage: the client-side CPU cost of the run.
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.stdout is not None
        output = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
    finally:
        os.unlink(template)
    wall = time.monotonic() - started
    if proc.returncode == -signal.SIGKILL:
        raise RuntimeError(f"wrk did not finish within its watchdog; output:\n{output}")
    line = next((ln for ln in output.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (exit {proc.returncode}):\n{output}")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    duration = data["duration_us"] / 1e6
    errors = sum(data["errors"].values())
    lat = data["latency_us"]
    good = max(data["requests"] - errors, 0)
    return LoadResult(
        connections=connections,
        duration_s=duration,
        requests=data["requests"],
        errors=errors,
        rps=good / duration if duration > 0 else 0.0,
        latency_ms={k: round(lat[k] / 1000, 3) for k in ("p50", "p90", "p99", "mean", "max")},
        client_cpu_util=(usage.ru_utime + usage.ru_stime) / wall if wall > 0 else 0.0,
        first_error=data["first_unexpected"],
    )


def warm_up(target: Target, *, requests: int, run_id: str, timeout_s: float = 30.0) -> float:
    """Send ``requests`` sequential requests, each checked; return their mean latency in ms.

    Bounded in count and in total time; the first bad response fails the run with its body,
    which is how a broken server is told apart from a slow one.
    """
    deadline = time.monotonic() + timeout_s
    total = 0.0
    with httpx.Client(timeout=10.0, headers=target.headers) as client:
        for i in range(requests):
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up of {target.url} exceeded {timeout_s}s at {i} requests")
            t0 = time.perf_counter()
            r = client.post(
                target.url,
                content=target.render(f"{run_id}-{i}"),
                headers={"Content-Type": "application/json"},
            )
            total += time.perf_counter() - t0
            if r.status_code != 200 or target.expect not in r.text:
                raise RuntimeError(
                    f"bad response from {target.url} (HTTP {r.status_code}): {r.text[:500]}"
                )
    return 1000 * total / max(requests, 1)
