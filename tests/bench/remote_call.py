"""Instructions of one ``remote()`` call alone, in the caller's process: the coordinator's side
of the hop without the turn around it (no model, no session, no A2A ingress).

    python -m tests.bench.remote_call                        # this checkout
    python -m tests.bench.remote_call --tree /tmp/me/before  # another one, same method
    python -m tests.bench.remote_call --no-valgrind          # CPU per call only
    python -m tests.bench.remote_call --split 40             # one call's instructions by stretch

A ``remote("bench-bureau", skill="score", url=...)`` toolset, bound as a node binds it (mesh's
guarded HTTP client, a ``PeerTrust``, metrics), is asked for its tools and calls the tool once,
per call, with the metadata a node's LLM turn gives it (deadline, traceparent, usage sink,
``durable_children``), logging at INFO as ``mesh serve`` does. The peer is the bench
specialist served by a plain process of the same tree (``tests.bench.instructions.peer``).
Instructions per call are the difference of two runs under cachegrind (N1 and N2 calls after
the same warm-up) divided by N2 - N1, as ``tests.bench.instructions`` counts a request. Unlike
a whole coordinator turn, nothing here depends on timing (no group commit, no database
thread), so two runs of one tree agree within a few thousand instructions.

``--split N`` runs N calls (after the warm-up) under callgrind instead and splits each call at
three points: the request's bytes written (``mesh._pool._Connection.write`` returned), the
answer's first bytes arrived (its ``data_received``), the call returned. Each point calls
``os.getppid`` (a cheap libc call nothing else here makes; callgrind
``--dump-before=getppid``), so each stretch's instructions are a dump of their own: before the
write (the tool's call up to its request on the wire), the wait (what the coordinator does
while the specialist works: free in wall time, the other core serving it), after (from the
answer's bytes to the tool's answer) and the bench's own (the turn's ``ToolContext`` and the
toolset's ``tools()``). The hooks wrap the pool's connection from here (the same in any tree
since ``_Connection``), so a base tree runs as it is. The default output is unchanged.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]
# As tests.bench.instructions logs (imported by the driver only: the measured process runs in
# the measured tree, whose copy of it may be older).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Marks:
    """The split's points (``--split``): ``os.getppid`` at each, once the warm-up is over."""

    def __init__(self) -> None:
        self.on = False
        self.sent = False

    def install(self) -> None:
        from mesh._pool import _Connection

        write, received = _Connection.write, _Connection.data_received
        marks = self

        def marked_write(connection: Any, data: bytes) -> bool:
            full = write(connection, data)
            if marks.on:
                os.getppid()  # the request's bytes are written
                marks.sent = True
            return full

        def marked_received(connection: Any, data: bytes) -> None:
            if marks.sent:
                marks.sent = False
                os.getppid()  # the answer's first bytes arrived
            received(connection, data)

        _Connection.write = marked_write  # type: ignore[method-assign]
        _Connection.data_received = marked_received  # type: ignore[method-assign]

    def point(self) -> None:
        if self.on:
            os.getppid()


async def _calls(url: str, warmup: int, calls: int, marks: _Marks | None = None) -> float:
    """Run the calls (imported here: the measured tree's mesh); CPU seconds per call.
    ``marks``: the split's points, marked from the first call after the warm-up."""
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
        if marks is not None:
            marks.point()  # the call starts
        answer = await tool.call({"applicant_id": "a-1001", "amount": 25000}, ctx)
        if marks is not None:
            marks.point()  # the call returned
        if answer.get("applicant_id") != "a-1001":
            raise RuntimeError(f"bad answer: {answer}")

    if marks is not None:
        # Before the first connection: uvloop holds a protocol's data_received from then on.
        marks.install()
    try:
        # The card read once before the calls: under callgrind on a loaded host the first
        # tools() (card, schemas, imports) took ~20 s of the first call's 30 s deadline.
        await toolset.tools(ToolContext(agent_name="bench-coordinator", user_id="a2a"))
        for i in range(warmup):
            await one(i)
        gc.freeze()
        if marks is not None:
            marks.on = True
        cpu0 = time.process_time()
        for i in range(calls):
            await one(warmup + i)
        return (time.process_time() - cpu0) / max(calls, 1)
    finally:
        await toolset.aclose()
        await http.aclose()


def _inner(argv: list[str]) -> int:
    url, warmup, calls, out = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    marks = _Marks() if argv[4:5] == ["split"] else None
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

    out.write_text(json.dumps({"cpu_s": uvloop.run(_calls(url, warmup, calls, marks))}))
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
    from tests.bench.instructions import _run as run_in

    run_in(argv, tree, work, f"{calls} calls", {})
    if args.no_valgrind:
        return 0
    found = re.search(r"I\s+refs:\s+([\d,]+)", vlog.read_text())
    if found is None:
        raise RuntimeError(f"no 'I refs' line in {vlog}")
    return int(found[1].replace(",", ""))


# The stretches of one call, in the order their dumps come (each dump ends one).
_STRETCHES = ("before the write", "write -> answer arrived", "after", "the bench's own")


def _split(tree: Path, url: str, args: argparse.Namespace, work: Path) -> dict[str, list[int]]:
    """``--split``: one process under callgrind dumping at each point; each stretch's
    instructions, call by call."""
    boot = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
    out, prefix = work / "split.json", work / "callgrind.out"
    argv = [sys.executable, "-c", boot, str(THIS), "--inner", url]
    argv += [str(args.warmup), str(args.split), str(out), "split"]
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--dump-before=getppid",
        f"--callgrind-out-file={prefix}",
        f"--log-file={work / 'split.valgrind'}",
        *argv,
    ]
    from tests.bench.instructions import _run as run_in

    run_in(argv, tree, work, "the split's run", {})
    dumps: list[tuple[int, int]] = []
    for path in work.glob("callgrind.out.*"):
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: (.*)$", text, re.MULTILINE)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        if trigger is None or total is None or "getppid" not in trigger[1]:
            continue
        dumps.append((int(path.name.rsplit(".", 1)[1]), int(total[1])))
        if args.keep is not None:
            shutil.copy(path, args.keep / path.name)
    dumps.sort()
    # The first dump is everything up to the first call's start; then four a call, the last
    # call's fourth (its end to the program's) not a getppid's.
    counts = [total for _, total in dumps[1:]]
    if len(counts) != 4 * args.split - 1:
        raise RuntimeError(f"{len(counts)} dumps for {args.split} calls: a point was missed")
    return {name: counts[i::4] for i, name in enumerate(_STRETCHES)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.remote_call", description=__doc__)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--n1", type=int, default=50, help="calls of the short run (50)")
    parser.add_argument("--n2", type=int, default=250, help="calls of the long run (250)")
    parser.add_argument("--warmup", type=int, default=100, help="calls before both (100)")
    parser.add_argument("--no-valgrind", action="store_true", help="CPU per call only")
    parser.add_argument(
        "--split", type=int, metavar="N", help="N calls under callgrind, split (see above)"
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="with --split: keep its dumps in DIR"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.n1 < args.n2:
        parser.error("--n1 and --n2: give 0 <= N1 < N2")
    if not args.no_valgrind and shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (or give --no-valgrind)")
    from tests.bench.instructions import PEER_URL, ROWS, peer

    tree = args.tree.resolve()
    if args.split is not None:
        if args.split < 2:
            parser.error("--split: give at least 2 calls")
        if shutil.which("valgrind") is None:
            parser.error("valgrind is not installed")
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
        with (
            tempfile.TemporaryDirectory(prefix="mesh-call-") as tmp,
            peer(tree, ROWS["coord-remote"], Path(tmp)) as env,
        ):
            stretches = _split(tree, env[PEER_URL], args, Path(tmp))
        print(f"tree {tree}  {args.split} calls after a warm-up of {args.warmup}, callgrind")
        # The first quartile too: "after" has modes tens of k apart, and its median moves
        # with how many calls of a run fall in the upper ones.
        print(f"{'stretch':<26}{'median':>10}{'q1':>10}{'min':>10}{'max':>10}")
        whole = low = 0
        for name, counts in stretches.items():
            middle = statistics.median(counts)
            q1 = statistics.quantiles(counts, n=4)[0] if len(counts) > 1 else counts[0]
            if name != _STRETCHES[3]:
                whole += middle
                low += q1
            print(
                f"{name:<26}{middle / 1e3:>9.1f}k{q1 / 1e3:>9.1f}k"
                f"{min(counts) / 1e3:>9.1f}k{max(counts) / 1e3:>9.1f}k"
            )
        print(f"{'the call (first three)':<26}{whole / 1e3:>9.1f}k{low / 1e3:>9.1f}k")
        if args.keep is not None:
            (args.keep / "stretches.json").write_text(json.dumps(stretches))
        return 0
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
