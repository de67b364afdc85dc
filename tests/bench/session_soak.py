"""``python -m tests.bench.session_soak``: a coordinator's ``Runner`` in a bounded loop, its RSS
with the bounded in-memory session store against the old one that kept every session (issue 19
item 3: a coordinator grew 44 -> 615 MiB over 47,000 runs).

    python -m tests.bench.session_soak                       # 20,000 runs each
    python -m tests.bench.session_soak --runs 50000 --max-sessions 1000

Each mode runs in a fresh interpreter: the bench coordinator (one in-process tool call, then its
answer, every answer checked), a new session per run as a script calling ``run(session_id=None)``
does. ``unbounded`` is the store as it was (``max_sessions=None, idle_ttl_s=None``); ``bounded``
the default store (or ``--max-sessions``). Prints RSS at points through the loop, the sessions
kept, the objects the collector tracks and its longest pass.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

from tests.bench.procstat import rss_bytes

MODES = ("unbounded", "bounded")
POINTS = 8


def _child(mode: str, runs: int, max_sessions: int | None) -> dict[str, Any]:
    from mesh._runner import Runner
    from mesh._sessions.memory import DEFAULT_MAX_SESSIONS, InMemorySessionStore
    from tests.bench.agents.coordinator import local

    if mode == "unbounded":
        store = InMemorySessionStore(max_sessions=None, idle_ttl_s=None)
    else:
        store = InMemorySessionStore(max_sessions=max_sessions or DEFAULT_MAX_SESSIONS)
    runner = Runner(local, sessions=store, env={})
    pauses: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(on_gc)
    samples: list[tuple[int, int]] = []
    every = max(1, runs // POINTS)

    async def loop() -> None:
        for i in range(1, runs + 1):
            result = await runner.run(
                user_id="u", session_id=None, message=f"score a-{i % 9000} for {1000 + i % 50}"
            )
            if not result.text.startswith(f"a-{i % 9000}: score "):
                raise SystemExit(f"run {i}: unexpected answer {result.text!r}")
            if i % every == 0 or i == 1:
                samples.append((i, rss_bytes(os.getpid())))
        if samples[-1][0] != runs:
            samples.append((runs, rss_bytes(os.getpid())))

    t0 = time.perf_counter()
    asyncio.run(loop())
    elapsed = time.perf_counter() - t0
    return {
        "mode": mode,
        "runs": runs,
        "samples": samples,
        "sessions": asyncio.run(store.count()),
        "tracked": len(gc.get_objects()),
        "gc_max_ms": 1000 * max(pauses, default=0.0),
        "us_per_run": 1e6 * elapsed / runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--max-sessions", type=int, default=None)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.child:
        print(json.dumps(_child(args.child, args.runs, args.max_sessions)))
        return
    rows = []
    for mode in MODES:
        cmd = [sys.executable, "-m", "tests.bench.session_soak", "--child", mode]
        cmd += ["--runs", str(args.runs)]
        if args.max_sessions:
            cmd += ["--max-sessions", str(args.max_sessions)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
        rows.append(json.loads(out.stdout))
    mib = 1024 * 1024
    print(f"{args.runs} runs of the bench coordinator, a new session each (RSS MiB)")
    points = [i for i, _ in rows[0]["samples"]]
    print(f"{'runs':>8} " + " ".join(f"{r['mode']:>10}" for r in rows))
    for n, point in enumerate(points):
        print(f"{point:>8} " + " ".join(f"{r['samples'][n][1] / mib:>10.1f}" for r in rows))
    print(f"{'sessions':>8} " + " ".join(f"{r['sessions']:>10}" for r in rows))
    print(f"{'objects':>8} " + " ".join(f"{r['tracked']:>10}" for r in rows))
    print(f"{'gc max ms':>8} " + " ".join(f"{r['gc_max_ms']:>10.1f}" for r in rows))
    print(f"{'us/run':>8} " + " ".join(f"{r['us_per_run']:>10.0f}" for r in rows))
    for r in rows:
        first, last = r["samples"][0][1], r["samples"][-1][1]
        half = r["samples"][len(r["samples"]) // 2][1]
        print(
            f"{r['mode']}: {(last - first) / mib:+.1f} MiB over the loop, "
            f"{(last - half) / max(1, r['runs'] - points[len(points) // 2]):+.0f} B/run "
            "over its second half"
        )


if __name__ == "__main__":
    main()
