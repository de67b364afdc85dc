"""Instructions per request, counted by cachegrind: a measure a loaded machine does not move.

    python -m tests.bench.instructions                       # every row
    python -m tests.bench.instructions --rows coord-local --n1 96 --n2 384
    python -m tests.bench.instructions --tree /tmp/me/before # another checkout, same method
    python -m tests.bench.instructions --no-valgrind         # CPU per request only
    python -m tests.bench.instructions --rows coord-local,coord-remote --concurrency 1  # the hop
    python -m tests.bench.instructions --rows mesh-node --concurrency 1 --split-at-send

Each row's agent is served in process, without HTTP: its real app (``Node(agent, settings)``,
its lifespan, its SQLite file in a temporary folder) called as ASGI with the bench's own request
body, ``--concurrency`` requests at a time on uvloop, every answer checked. Instructions per
request are the difference of two runs under ``valgrind --tool=cachegrind`` that do the same
start-up and warm-up and then N1 and N2 requests, divided by N2 - N1: start-up, warm-up and exit
cancel, both threads and C code (SQLite, pydantic-core, protobuf) count. ``PYTHONHASHSEED`` is
fixed so two runs of one tree walk the same hash orders. CPU per request comes from a plain run
(no valgrind) of N2 requests: ``process_time`` around the measured requests.

``coord-remote``'s tool is the ``bench-bureau`` specialist over A2A: the driver starts that peer
once per row as a plain ``mesh serve`` process of the same tree (never under valgrind, on a free
port, ``BENCH_PEER_URL`` pointing at it) and the three runs share it; only the coordinator's
instructions are counted. Its answers are checked as ``coord-local``'s (the scored text). At
``--concurrency 1`` (the hop's setting) ``coord-remote`` - ``coord-local`` is what the hop costs
the coordinator. ``lead-remote`` is the same for an LLM specialist (``bench-analyst``, whose own
turn served alone is ``llm-node``): ``lead-remote`` - ``lead-local`` is what that hop costs its
lead.

``--split-at-send`` also says how much of a request comes before its answer is sent: at 1
connection a caller waits for those instructions only, and what a node does after sending
runs while the caller reads the answer. One more run of N1 requests after the warm-up, under
``valgrind --tool=callgrind`` with ``--dump-before`` two marker C functions the bench calls
around each measured request (``os.getpgrp`` as ``one()`` starts it, ``os.getppid`` when its
answer's body is sent: neither is called by anything else the node runs), so callgrind's
dumps alternate between "request start -> answer sent" and "answer sent -> next request";
the row shows each's mean per request (the last request's "after" includes the process's
exit and is left out). Needs ``--concurrency 1`` (at more, requests overlap).

``--tree`` runs the measured processes inside another checkout (its working directory and
``PYTHONPATH``), so ``mesh`` and the bench agents are that tree's, whichever tree this file is
from; the tree needs ``tests/bench/scenarios.py`` and ``tests/bench/agents/``. See
docs/performance.md "Method".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ROWS", "Measure", "main"]

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]
# The same switch `mesh serve` sets before a2a is imported (mesh._cli.serve._quiet_sdk_tracing).
SDK_TRACING = "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class InProcRow:
    """One agent served in process, and what the bench sends it."""

    agent: str
    # "text": the coordinator's text message; "score": the typed data part with skill "score".
    request: str
    # The agent a remote tool calls, served by the driver in its own plain process, or None.
    peer: str | None = None


ROWS: dict[str, InProcRow] = {
    "mesh-node": InProcRow("tests.bench.agents.specialist:agent", "score"),
    "coord-local": InProcRow("tests.bench.agents.coordinator:local", "text"),
    "coord-remote": InProcRow(
        "tests.bench.agents.coordinator:remote_agent",
        "text",
        peer="tests.bench.agents.specialist:agent",
    ),
    # The LLM specialist hop (tests/bench/agents/analyst.py): the analyst's own turn served
    # alone, and a lead asking it in process or over A2A. Only the lead is counted in
    # lead-remote, so lead-remote - lead-local is what the LLM hop costs the lead.
    "llm-node": InProcRow("tests.bench.agents.analyst:agent", "text"),
    "lead-local": InProcRow("tests.bench.agents.analyst:local_lead", "text"),
    "lead-remote": InProcRow(
        "tests.bench.agents.analyst:remote_lead", "text", peer="tests.bench.agents.analyst:agent"
    ),
}
# The coordinator reads its peer's address from here when its module is imported.
PEER_URL = "BENCH_PEER_URL"


@dataclass(frozen=True)
class Measure:
    """What one measured process reports."""

    requests: int
    cpu_s: float
    wall_s: float


# ---- the measured process ----------------------------------------------------------------


def _load(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _split(total: int, workers: int) -> list[int]:
    return [total // workers + (1 if w < total % workers else 0) for w in range(workers)]


#: The factor the measured process's wall-clock thresholds are stretched by
#: (``_hold_commits_inline``): far past how much slower it runs under cachegrind (~40-60x
#: alone, several times that when other processes share the cores; at 50x, session 32 saw a
#: loaded host's remote turns outlast the stretched DEFER_S: coord-remote 4.05 to 4.21 M in two
#: runs of one tree).
THRESHOLD_STRETCH = 1000


def _hold_commits_inline() -> None:
    """Keep every SQLite batch on the event loop, as on an unloaded node, and its deferred
    writes waiting for company as long as in a plain run. Two wall-clock thresholds of
    mesh._sqlite would otherwise count what valgrind's slowdown makes, not what the node does:
    the node moves its commits to the database thread for a second after a batch that took
    over ``SLOW_BATCH_S`` (a slow disk); under valgrind a batch runs ~50x slower, so that
    happened at random moments of a run and moved a row's count by +-0.03 M (mesh-node) to
    +-0.1 M (the coordinators). And a ``write_soon`` commits on its own after ``DEFER_S``
    (5 ms) unless an awaited write takes it along first: a coordinator's turn queues its
    session's create and user event, and under valgrind its own work up to the delegation
    outlasts 5 ms, so every remote turn paid a batch of its own (~0.09 M) that a plain run on
    a fast host does not (the call is back within 5 ms), and some local turns did. A batch
    still running on the loop after ``LOOP_BUDGET_S`` (20 ms) is rolled back and run again on
    the thread: a valgrind run's batch takes ~5 ms, more when other processes share the cores.
    Both are stretched by ``THRESHOLD_STRETCH``. Trees from before a threshold existed have
    nothing to stretch."""
    from mesh import _sqlite

    if hasattr(_sqlite, "SLOW_BATCH_S"):
        _sqlite.SLOW_BATCH_S = float("inf")
    if hasattr(_sqlite, "DEFER_S"):
        _sqlite.DEFER_S *= THRESHOLD_STRETCH
    if hasattr(_sqlite, "LOOP_BUDGET_S"):
        _sqlite.LOOP_BUDGET_S *= THRESHOLD_STRETCH


#: The C functions the split run's marks call (``--split-at-send``): a request's start, and
#: its answer's body sent. Cheap system calls nothing in a node calls.
START_MARK = "getpgrp"
SENT_MARK = "getppid"


async def _serve(
    row: InProcRow, warmup: int, requests: int, concurrency: int, split: bool = False
) -> Measure:
    # Imported here, in the measured process, from the tree on its sys.path.
    from mesh._node import Node
    from mesh._settings import NodeSettings
    from tests.bench.scenarios import (
        A2A_HEADERS,
        COMPLETED,
        SCORE_PARTS,
        SCORE_TEXT,
        SCORED,
        send_message_body,
    )

    if row.request == "text":
        template, expect = send_message_body(SCORE_TEXT, None), SCORED
    else:
        template, expect = send_message_body(SCORE_PARTS, "score"), COMPLETED
    base_headers = [(b"content-type", b"application/json")] + [
        (k.lower().encode(), v.encode()) for k, v in A2A_HEADERS.items()
    ]
    _hold_commits_inline()
    agent = _load(row.agent)
    # The split run's marks (``--split-at-send``), called on the measured requests only.
    marking = False
    with tempfile.TemporaryDirectory(prefix="mesh-ir-") as tmp:
        node = Node(agent, NodeSettings(data_dir=Path(tmp), registry=None))
        app = node.app
        async with app.router.lifespan_context(app) as state:
            lifespan_state = dict(state or {})

            async def one(unique: str) -> None:
                if marking:
                    os.getpgrp()  # START_MARK: callgrind dumps what came before
                body = template.replace("{{ID}}", unique).encode()
                scope = {
                    "type": "http",
                    "asgi": {"version": "3.0"},
                    "http_version": "1.1",
                    "method": "POST",
                    "scheme": "http",
                    "path": "/",
                    "raw_path": b"/",
                    "query_string": b"",
                    "root_path": "",
                    "headers": [*base_headers, (b"content-length", str(len(body)).encode())],
                    "client": ("127.0.0.1", 40000),
                    "server": ("127.0.0.1", 80),
                    "state": dict(lifespan_state),
                }
                sent = False

                async def receive() -> dict[str, Any]:
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    await asyncio.Event().wait()  # no disconnect: the answer is awaited
                    raise AssertionError("unreachable")

                chunks: list[bytes] = []
                status = 0

                async def send(message: dict[str, Any]) -> None:
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = message["status"]
                    elif message["type"] == "http.response.body":
                        chunks.append(message.get("body", b""))
                        if marking and not message.get("more_body", False):
                            os.getppid()  # SENT_MARK: the answer has left

                await app(scope, receive, send)
                text = b"".join(chunks).decode()
                if status != 200 or expect not in text:
                    raise RuntimeError(f"bad answer (HTTP {status}): {text[:300]}")

            async def run(total: int, run_id: str) -> None:
                async def worker(w: int, k: int) -> None:
                    for i in range(k):
                        await one(f"{run_id}-{w}-{i}")

                shares = _split(total, concurrency)
                await asyncio.gather(*(worker(w, k) for w, k in enumerate(shares)))

            await run(warmup, "warm")
            # As `mesh serve` does once ready (mesh._cli.serve.collect_from_here).
            gc.freeze()
            marking = split
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await run(requests, "load")
            cpu1, wall1 = time.process_time(), time.perf_counter()
            marking = False
    return Measure(requests=requests, cpu_s=cpu1 - cpu0, wall_s=wall1 - wall0)


def _inner(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="instructions --inner")
    parser.add_argument("row")
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault(SDK_TRACING, "false")
    # What `mesh serve` logs (the task's line at INFO), to this process's stderr, the way it
    # configures logging (mesh._cli.log_lines; a tree from before it: basicConfig's defaults).
    try:
        from mesh._cli import log_lines
    except ImportError:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    else:
        log_lines.configure(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    import uvloop

    measure = uvloop.run(
        _serve(ROWS[args.row], args.warmup, args.requests, args.concurrency, args.split)
    )
    args.out.write_text(json.dumps(measure.__dict__))
    return 0


# ---- the driver ----------------------------------------------------------------------------

_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def _command(
    tree: Path, row: str, n: int, opts: argparse.Namespace, out: Path, split: bool = False
) -> list[str]:
    # Run this file by path in the tree's interpreter state (cwd and PYTHONPATH = the tree):
    # `-m` would take the tree's copy, which an older tree does not have, and running the file
    # as a script would put tests/bench (its profile.py) ahead of the standard library.
    boot = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
    return [
        sys.executable,
        "-c",
        boot,
        str(THIS),
        "--inner",
        row,
        "--requests",
        str(n),
        "--warmup",
        str(opts.warmup),
        "--concurrency",
        str(opts.concurrency),
        "--out",
        str(out),
        *(["--split"] if split else []),
    ]


def _env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = str(tree)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault(SDK_TRACING, "false")
    return env


def _run(argv: list[str], tree: Path, work: Path, what: str, env: dict[str, str]) -> None:
    log = work / "stderr.log"
    with log.open("w") as err:
        proc = subprocess.run(
            argv,
            cwd=tree,
            env=_env(tree, env),
            stdout=err,
            stderr=err,
            check=False,
            timeout=3600,
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail}")


def _healthy(port: int) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def peer(
    tree: Path, row: InProcRow, work: Path, timeout_s: float = 60.0
) -> Iterator[dict[str, str]]:
    """Serve ``row``'s peer (if it has one) in a plain process of ``tree`` while the row runs:
    ``mesh serve`` on a free port, its own data folder, no registry; its log in ``work``.
    Yields what the measured processes add to their environment (the peer's URL)."""
    if row.peer is None:
        yield {}
        return
    from tests.support import free_port

    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.bench.servers.mesh_node",
        "serve",
        row.peer,
        "--port",
        str(port),
        "--data-dir",
        str(work / "peer"),
        "--no-register",
    ]
    log = work / "peer.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=tree, env=_env(tree), stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"peer {row.peer} did not become healthy:\n{tail}")
            time.sleep(0.02)
        yield {PEER_URL: f"http://127.0.0.1:{port}"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def plain(
    tree: Path, row: str, n: int, opts: argparse.Namespace, work: Path, env: dict[str, str]
) -> Measure:
    """One run without valgrind: CPU and wall time of ``n`` requests after the warm-up."""
    out = work / f"{row}-{n}.json"
    _run(_command(tree, row, n, opts, out), tree, work, f"{row} ({n} requests)", env)
    return Measure(**json.loads(out.read_text()))


def instructions(
    tree: Path, row: str, n: int, opts: argparse.Namespace, work: Path, env: dict[str, str]
) -> int:
    """Instructions the whole process executed (start-up, warm-up, ``n`` requests, exit)."""
    out, vlog = work / f"{row}-{n}-vg.json", work / f"{row}-{n}.valgrind"
    valgrind = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        f"--log-file={vlog}",
    ]
    _run(valgrind + _command(tree, row, n, opts, out), tree, work, f"valgrind {row} ({n})", env)
    found = _IREFS.search(vlog.read_text())
    if found is None:
        raise RuntimeError(f"no 'I refs' line in {vlog}")
    return int(found[1].replace(",", ""))


_SUMMARY = re.compile(rb"^(?:summary|totals):\s+(\d+)")
_TRIGGER = re.compile(rb"^desc: Trigger: (.*)$")


@dataclass(frozen=True)
class Split:
    """A request's instructions before and after its answer was sent (``--split-at-send``)."""

    requests: int
    before: int
    after: int


def split_parts(parts: list[tuple[str, int]]) -> Split:
    """Each callgrind dump as (its trigger, its instructions), in order, into the means per
    request: a dump triggered by the sent mark counts a request's part before its answer, one
    triggered by the start mark (but the first: start-up and warm-up) the previous request's
    part after it; the last request's after (up to the process's exit) is left out."""
    before: list[int] = []
    after: list[int] = []
    started = False
    for trigger, count in parts:
        if trigger.endswith(f"={SENT_MARK}"):
            before.append(count)
        elif trigger.endswith(f"={START_MARK}"):
            if started:
                after.append(count)
            started = True
    if not before or not after or len(before) != len(after) + 1:
        raise RuntimeError(
            f"the split run's dumps do not alternate: {len(before)} before the answer, "
            f"{len(after)} after (was a request answered by an error, or not at 1 connection?)"
        )
    return Split(len(before), sum(before) // len(before), sum(after) // len(after))


def _callgrind_parts(path: Path) -> list[tuple[str, int]]:
    """(trigger, instructions) of each part of a combined callgrind file."""
    parts: list[tuple[str, int]] = []
    trigger = ""
    with path.open("rb") as lines:
        for line in lines:
            if line.startswith(b"desc: Trigger"):
                found = _TRIGGER.match(line.rstrip())
                trigger = found[1].decode() if found else ""
            elif line.startswith(b"summary:"):
                summary = _SUMMARY.match(line)
                assert summary is not None
                parts.append((trigger, int(summary[1])))
    return parts


def split_at_send(
    tree: Path, row: str, n: int, opts: argparse.Namespace, work: Path, env: dict[str, str]
) -> Split:
    """``n`` requests after the warm-up under callgrind, dumped at each mark: a request's
    instructions before its answer was sent, and after."""
    out, vlog, dumps = work / f"{row}-{n}-cg.json", work / f"{row}-{n}.callgrind", work / "cg.out"
    valgrind = [
        "valgrind",
        "--tool=callgrind",
        f"--dump-before={START_MARK}",
        f"--dump-before={SENT_MARK}",
        "--combine-dumps=yes",
        f"--callgrind-out-file={dumps}",
        f"--log-file={vlog}",
    ]
    argv = valgrind + _command(tree, row, n, opts, out, split=True)
    _run(argv, tree, work, f"callgrind {row} ({n})", env)
    try:
        return split_parts(_callgrind_parts(dumps))
    finally:
        dumps.unlink(missing_ok=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}"
    )
    parser.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="the checkout to measure (default: the one this file is in)",
    )
    parser.add_argument("--n1", type=int, default=96, help="requests of the short run (96)")
    parser.add_argument("--n2", type=int, default=384, help="requests of the long run (384)")
    parser.add_argument("--warmup", type=int, default=200, help="requests before both (200)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests at a time (16)")
    parser.add_argument(
        "--no-valgrind", action="store_true", help="CPU per request only (no instruction count)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--split-at-send",
        action="store_true",
        help="also count a request's instructions before its answer is sent and after "
        "(callgrind, N1 requests; needs --concurrency 1)",
    )
    args = parser.parse_args(argv)
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown or not args.rows:
        parser.error(f"--rows: unknown {unknown}; choose from {sorted(ROWS)}")
    if not 0 <= args.n1 < args.n2:
        parser.error("--n1 and --n2: give 0 <= N1 < N2")
    if args.warmup < 0 or args.concurrency < 1:
        parser.error("--warmup must be >= 0 and --concurrency >= 1")
    if args.split_at_send and (args.concurrency != 1 or args.n1 < 2 or args.no_valgrind):
        parser.error(
            "--split-at-send: needs --concurrency 1, --n1 >= 2 and valgrind (at more "
            "connections the requests overlap)"
        )
    args.tree = args.tree.resolve()
    if not (args.tree / "tests" / "bench" / "scenarios.py").is_file():
        parser.error(f"--tree: {args.tree} has no tests/bench/scenarios.py")
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure each row; print the table (and write ``--json``). Returns the exit status."""
    args = parse_args(argv)
    skip = ""
    if args.no_valgrind:
        skip = "--no-valgrind"
    elif shutil.which("valgrind") is None:
        skip = "valgrind is not installed (apt-get install valgrind, or run .ci/system-deps)"
    if skip:
        print(f"instructions: not counted: {skip}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mesh-ir-run-") as tmp:
        work = Path(tmp)
        for row in args.rows:
            print(f"instructions: {row} ...", file=sys.stderr, flush=True)
            with peer(args.tree, ROWS[row], work) as env:
                result = _measure(row, args, work, skip, env)
            results.append(result)
    print(render(results, args))
    if args.json:
        args.json.write_text(json.dumps({"tree": str(args.tree), "rows": results}, indent=2))
    return 0


def _measure(
    row: str, args: argparse.Namespace, work: Path, skip: str, env: dict[str, str]
) -> dict[str, Any]:
    run = plain(args.tree, row, args.n2, args, work, env)
    result: dict[str, Any] = {
        "row": row,
        "cpu_ms_per_request": round(1000 * run.cpu_s / run.requests, 3),
        "wall_ms_per_request": round(1000 * run.wall_s / run.requests, 3),
        "ir_per_request": None,
    }
    if not skip:
        short = instructions(args.tree, row, args.n1, args, work, env)
        long = instructions(args.tree, row, args.n2, args, work, env)
        result["ir"] = [short, long]
        result["ir_per_request"] = (long - short) // (args.n2 - args.n1)
        if args.split_at_send:
            split = split_at_send(args.tree, row, args.n1, args, work, env)
            result["ir_before_send"] = split.before
            result["ir_after_send"] = split.after
    return result


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The table: one line per row."""
    split = getattr(args, "split_at_send", False)
    head = f"{'row':<14}{'Ir/request':>14}{'CPU ms/req':>12}{'wall ms/req':>13}"
    lines = [
        f"tree {args.tree}  N1={args.n1} N2={args.n2} warm-up={args.warmup} "
        f"concurrency={args.concurrency}",
        head + (f"{'before send':>14}{'after send':>13}" if split else ""),
    ]
    for r in results:
        ir = r["ir_per_request"]
        shown = f"{ir / 1e6:.3f} M" if ir is not None else "-"
        line = (
            f"{r['row']:<14}{shown:>14}{r['cpu_ms_per_request']:>12.3f}"
            f"{r['wall_ms_per_request']:>13.3f}"
        )
        if split and "ir_before_send" in r:
            line += f"{r['ir_before_send'] / 1e6:>12.3f} M{r['ir_after_send'] / 1e6:>11.3f} M"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--inner"]:
        sys.exit(_inner(sys.argv[2:]))
    sys.exit(main())
