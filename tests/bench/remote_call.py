"""Instructions of one ``remote()`` call alone, in the caller's process: the coordinator's side
of the hop without the turn around it (no model, no session, no A2A ingress).

    python -m tests.bench.remote_call                        # this checkout
    python -m tests.bench.remote_call --tree /tmp/me/before  # another one, same method
    python -m tests.bench.remote_call --no-valgrind          # CPU per call only

A ``remote("bench-bureau", skill="score", url=...)`` toolset, bound as a node binds it (mesh's
guarded HTTP client, a ``PeerTrust``, metrics), is asked for its tools and calls the tool once,
per call, with the metadata a node's LLM turn gives it (deadline, traceparent, usage sink,
``durable_children``), logging at INFO as ``mesh serve`` does. The peer is the bench
specialist served by a plain process of the same tree (``tests.bench.instructions.peer``).
Instructions per call are the difference of two runs under cachegrind (N1 and N2 calls after
the same warm-up) divided by N2 - N1, as ``tests.bench.instructions`` counts a request. Unlike
a whole coordinator turn, nothing here depends on timing (no group commit, no database
thread), so two runs of one tree agree within a few thousand instructions.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]
# As tests.bench.instructions logs (imported by the driver only: the measured process runs in
# the measured tree, whose copy of it may be older).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


async def _calls(url: str, warmup: int, calls: int) -> float:
    """Run the calls (imported here: the measured tree's mesh); CPU seconds per call."""
    import httpx
    from prometheus_client import CollectorRegistry

    from mesh._metrics import NodeMetrics
    from mesh._netguard import create_http_client
    from mesh._netpolicy import NetworkPolicy
    from mesh._remote import remote
    from mesh._tools import ToolContext
    from mesh._trust import PeerTrust

    anywhere = NetworkPolicy.parse("any")
    http = create_http_client(anywhere, timeout=httpx.Timeout(35.0, connect=2.0))
    toolset = remote("bench-bureau", skill="score", url=url)
    toolset.bind(
        http=http,
        metrics=NodeMetrics(CollectorRegistry(), "bench-coordinator"),
        caller="bench-coordinator",
        trust=PeerTrust(networks=anywhere),
    )
    trace = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"

    async def one(i: int) -> None:
        ctx = ToolContext(
            agent_name="bench-coordinator",
            user_id="a2a",
            session_id=f"s-{i}",
            invocation_id=f"i-{i}",
            metadata={
                "deadline": time.time() + 30,
                "traceparent": trace,
                "usage_sink": [],
                "durable_children": True,
                "task_id": f"t-{i}",
            },
        )
        (tool,) = await toolset.tools(ctx)
        answer = await tool.call({"applicant_id": "a-1001", "amount": 25000}, ctx)
        if answer.get("applicant_id") != "a-1001":
            raise RuntimeError(f"bad answer: {answer}")

    try:
        for i in range(warmup):
            await one(i)
        gc.freeze()
        cpu0 = time.process_time()
        for i in range(calls):
            await one(warmup + i)
        return (time.process_time() - cpu0) / max(calls, 1)
    finally:
        await toolset.aclose()
        await http.aclose()


def _inner(argv: list[str]) -> int:
    url, warmup, calls, out = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    # As mesh serve configures logging (mesh._cli.log_lines, as tests.bench.instructions does;
    # a tree from before it: basicConfig's defaults in the same format).
    try:
        from mesh._cli import log_lines
    except ImportError:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    else:
        log_lines.configure(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    import uvloop

    out.write_text(json.dumps({"cpu_s": uvloop.run(_calls(url, warmup, calls))}))
    return 0


def _run(tree: Path, url: str, calls: int, args: argparse.Namespace, work: Path) -> int:
    """One measured process; its instructions (0 without valgrind), its CPU per call saved."""
    boot = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
    out, vlog = work / f"calls-{calls}.json", work / f"calls-{calls}.valgrind"
    argv = [sys.executable, "-c", boot, str(THIS), "--inner", url]
    argv += [str(args.warmup), str(calls), str(out)]
    if not args.no_valgrind:
        argv = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            f"--log-file={vlog}",
            *argv,
        ]
    from tests.bench.instructions import _env

    log = work / "stderr.log"
    with log.open("w") as err:
        proc = subprocess.run(
            argv, cwd=tree, env=_env(tree), stdout=err, stderr=err, timeout=3600, check=False
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{calls} calls exited with {proc.returncode}:\n{tail}")
    if args.no_valgrind:
        return 0
    found = re.search(r"I\s+refs:\s+([\d,]+)", vlog.read_text())
    if found is None:
        raise RuntimeError(f"no 'I refs' line in {vlog}")
    return int(found[1].replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.remote_call", description=__doc__)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--n1", type=int, default=50, help="calls of the short run (50)")
    parser.add_argument("--n2", type=int, default=250, help="calls of the long run (250)")
    parser.add_argument("--warmup", type=int, default=100, help="calls before both (100)")
    parser.add_argument("--no-valgrind", action="store_true", help="CPU per call only")
    args = parser.parse_args(argv)
    if not 0 <= args.n1 < args.n2:
        parser.error("--n1 and --n2: give 0 <= N1 < N2")
    if not args.no_valgrind and shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (or give --no-valgrind)")
    from tests.bench.instructions import PEER_URL, ROWS, peer

    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="mesh-call-") as tmp:
        work = Path(tmp)
        with peer(tree, ROWS["coord-remote"], work) as env:
            short = _run(tree, env[PEER_URL], args.n1, args, work)
            long = _run(tree, env[PEER_URL], args.n2, args, work)
            cpu = json.loads((work / f"calls-{args.n2}.json").read_text())["cpu_s"]
    per_call = (long - short) // (args.n2 - args.n1) if not args.no_valgrind else None
    shown = f"{per_call / 1e3:.0f} k" if per_call is not None else "-"
    print(f"tree {tree}  N1={args.n1} N2={args.n2} warm-up={args.warmup}")
    print(f"instructions per call {shown}  CPU ms per call {cpu * 1000:.3f}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inner"]:
        sys.exit(_inner(sys.argv[2:]))
    sys.exit(main())
