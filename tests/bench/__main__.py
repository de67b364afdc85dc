"""``python -m tests.bench`` (``make bench``): every server setup side by side, one table.

    python -m tests.bench                  # ~3 minutes: 5 s per load level
    python -m tests.bench --quick          # ~1 minute: 1 s per phase
    python -m tests.bench --only fastapi,a2a-sdk --json /tmp/b.json

Prints the table and writes the whole result (every number, the machine, the targets) as JSON
to ``bench-results/bench.json``. See docs/performance.md for the method.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bench import host, report
from tests.bench.harness import Options, run_row
from tests.bench.load import wrk_path
from tests.bench.scenarios import ROWS
from tests.support import ROOT

DEFAULT_JSON = ROOT / "bench-results" / "bench.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 s per phase and a short warm-up (a smoke run, not a measurement)",
    )
    parser.add_argument(
        "--duration",
        type=int,
        default=None,
        metavar="S",
        help="seconds per throughput level (default 5, 1 with --quick)",
    )
    parser.add_argument(
        "--latency-duration",
        type=int,
        default=None,
        metavar="S",
        help="seconds of sequential latency (default 3, 1 with --quick)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help="checked warm-up requests per row (default 300, 20 with --quick)",
    )
    parser.add_argument("--levels", default="16,64", help="concurrency levels (default 16,64)")
    parser.add_argument(
        "--only",
        default="",
        metavar="ROWS",
        help=f"comma-separated rows, of: {', '.join(r.key for r in ROWS)}",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        metavar="PATH",
        help=f"where to write the result (default {DEFAULT_JSON.relative_to(ROOT)})",
    )
    args = parser.parse_args(argv)
    for name in ("duration", "latency_duration", "warmup"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    known = {r.key for r in ROWS}
    args.only = [k for k in args.only.split(",") if k]
    unknown = sorted(set(args.only) - known)
    if unknown:
        parser.error(f"--only: unknown rows {unknown}; choose from {sorted(known)}")
    try:
        args.levels = tuple(int(n) for n in args.levels.split(",") if n)
    except ValueError:
        parser.error(f"--levels must be comma-separated integers, got {args.levels!r}")
    if not args.levels or any(n < 1 or n > 1000 for n in args.levels):
        parser.error("--levels: give 1 to 1000 connections per level")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    opts = Options(
        duration_s=args.duration or (1 if quick else 5),
        latency_s=args.latency_duration or (1 if quick else 3),
        warmup_requests=args.warmup or (20 if quick else 300),
        levels=args.levels,
    )
    try:
        wrk = wrk_path()
    except RuntimeError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    result: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": host.describe(wrk),
        "options": {
            "quick": quick,
            "duration_s": opts.duration_s,
            "latency_s": opts.latency_s,
            "warmup_requests": opts.warmup_requests,
            "levels": list(opts.levels),
        },
        "rows": [],
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="mesh-bench-") as tmp:
        for row in ROWS:
            if args.only and row.key not in args.only:
                continue
            reason = row.missing()
            if reason:
                print(f"bench: {row.key}: skipped ({reason})", file=sys.stderr)
                result["rows"].append(
                    {"key": row.key, "label": row.label, "status": "skipped", "reason": reason}
                )
                continue
            print(f"bench: {row.key}: {row.label} ...", file=sys.stderr, flush=True)
            try:
                result["rows"].append(run_row(row, opts, Path(tmp) / row.key))
            except Exception as exc:
                failed = True
                traceback.print_exc()
                result["rows"].append(
                    {
                        "key": row.key,
                        "label": row.label,
                        "status": "failed",
                        "reason": str(exc).splitlines()[0][:300],
                    }
                )
    result["imports"] = host.import_times(("mesh", "mesh._node"), repeat=1 if quick else 3)
    report.add_ratios(result["rows"])
    result["delegation"] = report.delegation(result["rows"])
    result["postgres"] = report.postgres(result["rows"], opts.warmup_requests)
    result["targets"] = report.targets(result["rows"], result["delegation"])
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(report.render(result))
    print(f"\nwrote {args.json} ({result['elapsed_s']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
