"""The two hops of issue 19 item 2 on a loaded machine: every setup up at once, 1-connection
bursts in alternated rounds, the hops taken per round.

    python -m tests.bench.hops                    # 8 rounds of 2 s per row (~2.5 minutes)
    python -m tests.bench.hops --rounds 12 --seconds 3 --json /tmp/hops.json

``make bench`` measures each row's p50 in its own minute, so on a machine other work loads the
hop (a difference of two p50s) takes whatever the load did between them: several milliseconds
either way. Here the rows' servers all run together and each round gives every row one burst
(wrk, 1 connection, the bench's request and check), in an order reversed every other round, so
a drift in load falls on both sides of each difference. Per round: the typed hop
``coord-remote - coord-local``, the LLM specialist's excess ``coord-remote-llm -
coord-local-llm - llm-specialist`` (docs/performance.md "The rows"), and the floor's hop
``fastapi-relay - fastapi``: the same bare FastAPI echo answered directly and through a bare
FastAPI relay that asks it over one kept-alive connection (``tests.bench.servers.fastapi_relay``),
what one HTTP call between two Python processes adds on this machine with nothing of mesh in it
(two processes that each sleep and wake once a request, the loopback). At the end, the hops from
each row's lowest p50 over the rounds (its least disturbed burst: load only adds to a p50),
then the median of the per-round hops and their range, and each server's CPU per request
(median over rounds): the same specialist costs more when a coordinator calls it once a turn,
idle in between, than under wrk back to back. Not a substitute for ``make bench`` on a quiet
machine, a way to read the hops when there is none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from tests.bench import procstat
from tests.bench.harness import spawn
from tests.bench.load import Target, run_wrk, warm_up, wrk_path
from tests.bench.scenarios import (
    FLOOR,
    FLOOR_RELAY,
    HOP_FLOOR_ROWS,
    LLM_SPECIALIST,
    LOCAL,
    LOCAL_LLM,
    MESH,
    REMOTE,
    REMOTE_LLM,
    ROWS,
    Ctx,
)
from tests.support import Proc, free_port

__all__ = ["KEYS", "cpu_per_request", "hops", "main"]

KEYS = (FLOOR, FLOOR_RELAY, MESH, LOCAL, REMOTE, LLM_SPECIALIST, LOCAL_LLM, REMOTE_LLM)
# Every row this runs, by key: the table's and the floor's relay.
_ROWS = {r.key: r for r in (*ROWS, *HOP_FLOOR_ROWS)}
HOPS = (
    ("floor_hop_ms", "floor hop (fastapi-relay - fastapi)"),
    ("typed_hop_ms", "typed hop (coord-remote - coord-local)"),
    ("llm_hop_over_turn_ms", "LLM hop over its turn (remote-llm - local-llm - specialist)"),
)


def hops(p50: dict[str, float]) -> dict[str, float]:
    """From one round: the floor's hop (one HTTP call between two bare FastAPI processes), the
    typed hop, and the LLM specialist's excess over its own turn."""
    return {
        "floor_hop_ms": round(p50[FLOOR_RELAY] - p50[FLOOR], 3),
        "typed_hop_ms": round(p50[REMOTE] - p50[LOCAL], 3),
        "llm_hop_over_turn_ms": round(p50[REMOTE_LLM] - p50[LOCAL_LLM] - p50[LLM_SPECIALIST], 3),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.hops",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=8, help="rounds (8)")
    parser.add_argument("--seconds", type=int, default=2, help="seconds per burst (2)")
    parser.add_argument("--warmup", type=int, default=300, help="checked requests per row (300)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rounds here")
    args = parser.parse_args(argv)
    for name in ("rounds", "seconds", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def _start(tmp: Path) -> tuple[list[Proc], dict[str, Target], dict[str, dict[str, Proc]]]:
    """Every row's servers, started; its target; its servers by name."""
    rows = _ROWS
    procs: list[Proc] = []
    targets: dict[str, Target] = {}
    servers: dict[str, dict[str, Proc]] = {}
    try:
        for key in KEYS:
            row = rows[key]
            ctx = Ctx(ports={s.name: free_port() for s in row.servers}, tmp=tmp / key)
            ctx.tmp.mkdir(parents=True)
            servers[key] = {}
            for spec in row.servers:
                proc = spawn(spec, ctx, 60.0)[0]
                procs.append(proc)
                servers[key][spec.name] = proc
            targets[key] = row.target(ctx)
    except BaseException:
        _stop(procs)
        raise
    return procs, targets, servers


def cpu_per_request(
    before: dict[str, float], after: dict[str, float], requests: int
) -> dict[str, float]:
    """Each server's CPU ms per request over a burst, from its CPU seconds before and after."""
    return {
        name: round((after[name] - before[name]) * 1000 / max(requests, 1), 3) for name in after
    }


def _cpu(servers: dict[str, Proc]) -> dict[str, float]:
    return {name: procstat.cpu_seconds(proc.pid) for name, proc in servers.items()}


def _stop(procs: list[Proc]) -> None:
    for proc in reversed(procs):
        with contextlib.suppress(Exception):
            proc.terminate()


def main(argv: list[str] | None = None) -> int:
    """Run the rounds; print each and the medians (and write ``--json``)."""
    args = parse_args(argv)
    try:
        wrk_path()
    except RuntimeError as exc:
        print(f"hops: {exc}", file=sys.stderr)
        return 2
    for key in KEYS:
        reason = _ROWS[key].missing()
        if reason:
            print(f"hops: cannot run {key}: {reason}", file=sys.stderr)
            return 2
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mesh-hops-") as tmp:
        procs, targets, servers = _start(Path(tmp))
        try:
            for key, target in targets.items():
                warm_up(target, requests=args.warmup, run_id=f"{uuid.uuid4().hex[:8]}-{key}")
            for n in range(args.rounds):
                order = KEYS if n % 2 == 0 else tuple(reversed(KEYS))
                p50: dict[str, float] = {}
                cpu: dict[str, dict[str, float]] = {}
                for key in order:
                    before = _cpu(servers[key])
                    run = run_wrk(
                        targets[key],
                        connections=1,
                        duration_s=args.seconds,
                        run_id=f"{uuid.uuid4().hex[:8]}-{n}",
                    )
                    if run.errors:
                        raise RuntimeError(f"{key}: {run.errors} bad answers: {run.first_error}")
                    p50[key] = run.latency_ms["p50"]
                    cpu[key] = cpu_per_request(before, _cpu(servers[key]), run.requests)
                found = {
                    "load": round(os.getloadavg()[0], 2),
                    "p50_ms": p50,
                    "cpu_ms_per_request": cpu,
                    **hops(p50),
                }
                rounds.append(found)
                print(
                    f"round {n + 1}: load {found['load']:.1f}  "
                    + "  ".join(f"{k} {p50[k]:.2f}" for k in KEYS)
                    + f"  | floor hop {found['floor_hop_ms']:.2f}"
                    f"  typed hop {found['typed_hop_ms']:.2f}"
                    f"  LLM hop over its turn {found['llm_hop_over_turn_ms']:.2f}",
                    flush=True,
                )
        finally:
            _stop(procs)
    summary = {
        name: {
            "median": statistics.median(r[name] for r in rounds),
            "min": min(r[name] for r in rounds),
            "max": max(r[name] for r in rounds),
        }
        for name, _ in HOPS
    }
    # Each row's least disturbed burst: load only ever adds to a p50, so the lowest of a row's
    # rounds is the nearest to what a quiet machine gives (how near: docs/performance.md "The
    # LLM specialist hop").
    lowest = {key: min(r["p50_ms"][key] for r in rounds) for key in KEYS}
    from_lowest = {"p50_ms": lowest, **hops(lowest)}
    for name, label in HOPS:
        s = summary[name]
        print(
            f"{label}: from each row's lowest p50 {from_lowest[name]:.2f} ms; per round: median "
            f"{s['median']:.2f} ms over {len(rounds)} rounds ({s['min']:.2f} .. {s['max']:.2f})"
            + ("" if name == "floor_hop_ms" else "; target <= 1.0")
        )
    print("each row's lowest p50: " + "  ".join(f"{k} {lowest[k]:.2f}" for k in KEYS))
    # A server's CPU per request, by who calls it: a specialist called once per coordinator
    # turn (idle in between) against the same node under wrk back to back (docs/performance.md
    # "Where the hop's time goes on this host").
    cpu_median = {
        key: {
            name: round(statistics.median(r["cpu_ms_per_request"][key][name] for r in rounds), 3)
            for name in servers[key]
        }
        for key in KEYS
    }
    print(
        "CPU ms per request, median over rounds: "
        + "  ".join(
            f"{key} (" + ", ".join(f"{name} {ms:.2f}" for name, ms in cpu_median[key].items()) + ")"
            for key in KEYS
        )
    )
    if args.json:
        result = {
            "rounds": rounds,
            "summary": summary,
            "from_lowest": from_lowest,
            "cpu_ms_per_request": cpu_median,
        }
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
