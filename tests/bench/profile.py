"""Profile one row's loaded process under load with py-spy (sampling, attaches by pid).

    pip install -e '.[bench]'     # py-spy is in the bench extra (a dev tool binary)
    python -m tests.bench.profile --row mesh-node --duration 10

Starts the row like the benchmark does, keeps it busy with wrk at ``--connections``, samples
the loaded process for ``--duration`` seconds (all threads, idle time excluded, so the numbers
are CPU), writes the collapsed stacks (feed them to flamegraph.pl or speedscope) and prints
where the time went: the hottest functions by self time, and the share of samples that pass
through each package (inclusive).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from tests.bench.harness import Options, spawn
from tests.bench.load import LoadResult, run_wrk, warm_up
from tests.bench.scenarios import ROWS, Ctx
from tests.support import ROOT, free_port

# Inclusive shares worth reading in a node's profile, by frame file path.
GROUPS: tuple[tuple[str, str], ...] = (
    ("mesh (our code)", r"/mesh/"),
    ("a2a-sdk", r"/a2a/"),
    ("protobuf", r"/google/protobuf/"),
    ("pydantic", r"/pydantic(_core)?/"),
    ("sqlite3", r"/sqlite3/|\bsqlite3\b"),
    ("logging", r"/logging/"),
    ("prometheus_client", r"/prometheus_client/"),
    ("json", r"/json/"),
    ("starlette/fastapi", r"/(starlette|fastapi)/"),
    ("uvicorn", r"/uvicorn/"),
    ("asyncio", r"/asyncio/"),
    ("opentelemetry", r"/opentelemetry/"),
)


_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>.*?)(?::\d+)?\)$")


def _function(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py:123)`` -> ``func (pkg/mod.py)``: self time
    is summed per function, not per line."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = re.sub(r"^.*/(site-packages|lib/python3\.\d+)/", "", match["path"])
    path = path.removeprefix(str(ROOT) + "/")
    return f"{match['func']} ({path})"


def summarize(collapsed: str, *, top: int = 25) -> str:
    """Self-time leaders and per-package inclusive shares of py-spy's collapsed stacks."""
    self_time: collections.Counter[str] = collections.Counter()
    groups: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        threads[frames[0]] += count
        self_time[_function(frames[-1])] += count
        for name, pattern in GROUPS:
            if any(re.search(pattern, f) for f in frames):
                groups[name] += count
    if not total:
        return "no samples (was the process busy? is ptrace allowed?)"
    out = [f"{total} samples (CPU only)", "", "by thread:"]
    out += [f"  {100 * n / total:5.1f}%  {t}" for t, n in threads.most_common(6)]
    out += ["", "inclusive share by package (a sample may count in several):"]
    out += [f"  {100 * n / total:5.1f}%  {g}" for g, n in groups.most_common()]
    out += ["", f"top {top} functions by self time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_time.most_common(top)]
    return "\n".join(out)


WARMUP = 200


def _db_calls(tmp: Path, answered: int) -> str:
    """Per-request database round trips of each mesh node, by the code that made them."""
    out = []
    for record in sorted(tmp.glob("*.modules.json")):
        calls: dict[str, int] = json.loads(record.read_text()).get("db_calls", {})
        ops = sum(n for name, n in calls.items() if not name.startswith("["))
        out.append(f"  {record.name.split('.')[0]}: {ops / answered:.2f} operations")
        out += [
            f"    {n / answered:5.2f}  {name}"
            for name, n in sorted(calls.items(), key=lambda kv: -kv[1])
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--row", default="mesh-node", choices=[r.key for r in ROWS])
    parser.add_argument("--duration", type=int, default=10, help="seconds sampled (default 10)")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=int, default=250, help="samples per second (default 250)")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    # On PATH, or next to this interpreter (a venv that is not activated).
    beside = Path(sys.executable).parent / "py-spy"
    found = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    parser.add_argument("--py-spy", default=found, help="path of py-spy")
    args = parser.parse_args(argv)
    if not args.py_spy:
        parser.error("py-spy not found: pip install py-spy (or pass --py-spy PATH)")
    if not 1 <= args.duration <= 120:
        parser.error("--duration: 1 to 120 seconds")
    row = next(r for r in ROWS if r.key == args.row)
    reason = row.missing()
    if reason:
        print(f"profile: {row.key} cannot run: {reason}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    # Counted by tests/bench/servers/mesh_node.py in each mesh node it starts.
    os.environ["BENCH_COUNT_DB"] = "1"
    collapsed_path = args.out / f"profile-{row.key}.collapsed"
    with tempfile.TemporaryDirectory(prefix="mesh-profile-") as tmp:
        ctx = Ctx(ports={s.name: free_port() for s in row.servers}, tmp=Path(tmp))
        procs = []
        try:
            for spec in row.servers:
                procs.append(spawn(spec, ctx, Options().health_timeout_s)[0])
            target = row.target(ctx)
            run = uuid.uuid4().hex[:8]
            warm_up(target, requests=WARMUP, run_id=f"{run}-warm")
            # wrk runs a little longer than the sampler so every sample is under load.
            results: list[LoadResult] = []
            load = threading.Thread(
                target=lambda **kw: results.append(run_wrk(**kw)),
                kwargs={
                    "target": target,
                    "connections": args.connections,
                    "duration_s": args.duration + 2,
                    "run_id": f"{run}-load",
                },
            )
            load.start()
            subprocess.run(
                [
                    args.py_spy,
                    "record",
                    "--pid",
                    str(procs[-1].pid),
                    "--duration",
                    str(args.duration),
                    "--rate",
                    str(args.rate),
                    "--threads",
                    "--full-filenames",
                    "--format",
                    "raw",
                    "--output",
                    str(collapsed_path),
                    "--nonblocking",
                ],
                check=True,
                timeout=args.duration + 60,
                capture_output=True,
            )
            load.join(timeout=args.duration + 60)
        finally:
            for proc in reversed(procs):
                proc.terminate()
        answered = WARMUP + sum(r.requests for r in results)
        db_calls = _db_calls(Path(tmp), answered)
    print(summarize(collapsed_path.read_text(), top=args.top))
    if db_calls:
        print(
            "\ndatabase operations per request, and the thread hops and commits they "
            f"took ({answered} requests):\n{db_calls}"
        )
    print(f"\ncollapsed stacks: {collapsed_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
