"""What an idle gap between requests costs the next one on this host.

    python -m tests.bench.idle_gap                        # fastapi and mesh-node, gaps 0-3 ms
    python -m tests.bench.idle_gap --rows mesh-node --gaps 0,2 --rounds 3 --seconds 3

One connection (wrk, the bench's request and check of every answer) with wrk waiting ``gap`` ms
after each answer before it sends the next request: the server is idle for that long between
requests. For each row and gap: the p50 (wrk's latency starts when the request is written, so
the gap is not in it) and the server's CPU per request. On a machine whose idle CPUs keep their
state both stay flat as the gap grows. On a VM whose idle vCPU halts at once (no guest halt
polling: ``cat /sys/module/haltpoll/parameters/guest_halt_poll_ns``) and whose host core then runs
other work, a request after a gap runs on cold caches and takes longer. A delegation hop is such
a request twice over (the specialist has been idle since its last call, the coordinator since
it sent the request), so this is the host's share of the hop (docs/performance.md, "Where the
hop's time goes on this host"). Gaps are alternated within each round; the table gives the
median over rounds and each gap's ratio to gap 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from tests.bench import procstat
from tests.bench.harness import spawn
from tests.bench.load import LUA, run_wrk, warm_up, wrk_path
from tests.bench.scenarios import FLOOR, MESH, ROWS, Ctx
from tests.support import Proc, free_port

__all__ = ["gap_script", "main", "parse_args"]


def gap_script(folder: Path, gap_ms: int) -> Path:
    """A wrk script that is ``wrk.lua`` plus a wait of ``gap_ms`` before each request."""
    path = folder / f"gap-{gap_ms}.lua"
    path.write_text(f'dofile("{LUA}")\nfunction delay()\n  return {gap_ms}\nend\n')
    return path


def _positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        msg = f"expected comma-separated whole ms, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not values or any(v < 0 or v > 100 for v in values):
        raise argparse.ArgumentTypeError(f"each gap must be 0-100 ms, got {text!r}")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.idle_gap",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    known = [r.key for r in ROWS]
    parser.add_argument("--rows", default=f"{FLOOR},{MESH}", help=f"comma-separated, of: {known}")
    parser.add_argument("--gaps", type=_positive_list, default=[0, 1, 2, 3], help="ms (0,1,2,3)")
    parser.add_argument("--rounds", type=_positive, default=3, help="alternated rounds (3)")
    parser.add_argument("--seconds", type=_positive, default=2, help="seconds per burst (2)")
    parser.add_argument("--warmup", type=_positive, default=300, help="checked requests (300)")
    args = parser.parse_args(argv)
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in args.rows if r not in known]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {known}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        wrk_path()
    except RuntimeError as exc:
        print(f"idle_gap: {exc}", file=sys.stderr)
        return 2
    rows = {r.key: r for r in ROWS}
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="mesh-idle-gap-") as tmp:
        folder = Path(tmp)
        scripts = {gap: gap_script(folder, gap) for gap in args.gaps}
        for key in args.rows:
            row = rows[key]
            ctx = Ctx(ports={s.name: free_port() for s in row.servers}, tmp=folder / key)
            ctx.tmp.mkdir()
            procs: list[Proc] = []
            try:
                for spec in row.servers:
                    procs.append(spawn(spec, ctx, 60.0)[0])
                target = row.target(ctx)
                warm_up(target, requests=args.warmup, run_id=f"{uuid.uuid4().hex[:8]}-w")
                for n in range(args.rounds):
                    order = args.gaps if n % 2 == 0 else list(reversed(args.gaps))
                    for gap in order:
                        before = sum(procstat.cpu_seconds(p.pid) for p in procs)
                        run = run_wrk(
                            target,
                            connections=1,
                            duration_s=args.seconds,
                            run_id=f"{uuid.uuid4().hex[:8]}-{n}-{gap}",
                            script=scripts[gap],
                        )
                        used = sum(procstat.cpu_seconds(p.pid) for p in procs) - before
                        if run.errors or not run.requests:
                            raise RuntimeError(
                                f"{key} gap {gap}: {run.errors} bad answers of {run.requests}: "
                                f"{run.first_error}"
                            )
                        cpu_ms = used * 1000 / run.requests
                        results.setdefault((key, gap), []).append((run.latency_ms["p50"], cpu_ms))
                        print(
                            f"{key} round {n + 1} gap {gap} ms: p50 {run.latency_ms['p50']:.3f}"
                            f" ms, CPU {cpu_ms:.3f} ms/request ({run.requests} requests)",
                            file=sys.stderr,
                            flush=True,
                        )
            finally:
                for proc in reversed(procs):
                    with contextlib.suppress(Exception):
                        proc.terminate()
    print(f"load average {os.getloadavg()[0]:.2f}; medians over {args.rounds} rounds")
    print(
        f"{'row':<14}{'gap ms':>8}{'p50 ms':>9}{'CPU ms/req':>12}{'p50 x gap0':>12}{'CPU x gap0':>12}"
    )
    for key in args.rows:
        base_p50 = statistics.median(p for p, _ in results[(key, args.gaps[0])])
        base_cpu = statistics.median(c for _, c in results[(key, args.gaps[0])])
        for gap in args.gaps:
            p50 = statistics.median(p for p, _ in results[(key, gap)])
            cpu = statistics.median(c for _, c in results[(key, gap)])
            print(
                f"{key:<14}{gap:>8}{p50:>9.3f}{cpu:>12.3f}"
                f"{p50 / base_p50:>12.2f}{cpu / base_cpu:>12.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
