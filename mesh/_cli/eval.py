"""``mesh eval``: run a file of cases against a live mesh and report (mesh._eval).

mesh eval agents/evals/loan_desk.yaml                      # a table; exit 1 when a case fails
mesh eval cases.yaml --junit eval.xml --json eval.json     # for CI
mesh eval cases.yaml --repeat 5 --min-pass-rate 0.8        # flakiness of LLM-driven cases
mesh eval agents/evals/loan_desk.yaml --up agents/mesh.toml  # a fresh `mesh up` for the run

Agents are found through the registry like ``mesh call`` (``--registry``, else the settings');
the trace of each case is read from every instance the registry lists (and ``--node`` URLs).
Cases with ``without`` stop agents through the control channel of the local ``mesh up``
(``--meshfile``, else the mesh file of the current folder, as ``mesh ps`` finds it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from mesh._errors import ConfigError

if TYPE_CHECKING:
    from mesh._eval.run import CaseResult

__all__ = ["UpFaults", "add_parsers"]


def add_parsers(sub: Any) -> None:
    """Register ``eval`` on the ``mesh`` sub-parsers."""
    p = sub.add_parser(
        "eval",
        help="test the mesh: answers, trajectories across hops, bounds, faults",
        description="Run the cases of CASES (YAML or JSON, see docs/eval.md) against the mesh.",
    )
    p.add_argument("cases", metavar="CASES", help="the case file (.yaml, .yml or .json)")
    p.add_argument("--registry", default=None, help="registry URL (default: the settings')")
    p.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="URL",
        help="also read traces from this node (one the registry does not list); repeatable",
    )
    p.add_argument("--case", action="append", default=[], metavar="NAME", help="only this case")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run each case N times")
    p.add_argument(
        "--min-pass-rate",
        type=float,
        default=1.0,
        metavar="R",
        help="share of a case's runs that must pass (default 1.0)",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="write the JSON report here")
    p.add_argument("--junit", default=None, metavar="FILE", help="write JUnit XML here")
    p.add_argument("--meshfile", default=None, help="the mesh file of the `mesh up` (faults)")
    p.add_argument(
        "--up",
        default=None,
        metavar="MESHFILE",
        help="start a fresh `mesh up MESHFILE` for the run (its registry and its control "
        "channel for faults), and stop it after",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="seconds --up waits for every process to be healthy (default 120)",
    )
    p.add_argument("--root", default=".", help="folder of the mesh file (default: .)")
    p.set_defaults(handler=_eval)


class UpFaults:
    """Stops and restarts agents through a running ``mesh up``'s control channel."""

    def __init__(self, state_dir: Path, meshfile: str) -> None:
        self.state_dir = state_dir
        self.meshfile = meshfile

    async def _do(self, op: str, agent: str) -> None:
        from mesh._control import ControlRequest, ask

        reply = await ask(
            self.state_dir,
            ControlRequest.model_validate({"op": op, "name": agent}),
            meshfile=self.meshfile,
        )
        if not reply.ok:
            raise ConfigError(reply.error)

    async def stop(self, agent: str) -> None:
        await self._do("stop", agent)

    async def restore(self, agent: str) -> None:
        await self._do("restart", agent)


def _faults(args: argparse.Namespace) -> UpFaults | None:
    """The running ``mesh up`` (None when there is no mesh file)."""
    from mesh._control import up_running
    from mesh._meshfile import load_meshfile, meshfiles_in

    root = Path(args.root).resolve()
    if args.meshfile is not None:
        return UpFaults(load_meshfile(args.meshfile).state_path(root), args.meshfile)
    candidates = [(path, load_meshfile(path)) for path in meshfiles_in(root)]
    running = [(p, m) for p, m in candidates if up_running(m.state_path(root))]
    if not (running or candidates):
        return None
    path, meshfile = (running or candidates)[0]
    return UpFaults(meshfile.state_path(root), str(path))


def _progress(stream: TextIO) -> Any:
    if not stream.isatty():
        return None

    def show(done: int, total: int, name: str) -> None:
        width = 20
        filled = width * done // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        line = f"[{bar}] {done}/{total} {name}" if name else ""
        stream.write("\r\x1b[2K" + line)
        stream.flush()

    return show


async def _run(args: argparse.Namespace, cases: Any, faults: UpFaults | None) -> list[CaseResult]:
    from mesh._cli.serve import lookup_location
    from mesh._cli.tasks import task_client
    from mesh._discovery.client import DiscoveryClient
    from mesh._eval.judge import create_judge
    from mesh._eval.run import Evaluator
    from mesh._settings import MeshSettings

    settings = MeshSettings.from_environment()
    lookup = lookup_location(args.registry, settings)
    discovery = DiscoveryClient(lookup.backend())
    judge = create_judge() if any(c.rubrics for c in cases) else None
    longest = max(c.timeout_s for c in cases)
    try:
        async with task_client(settings.mesh_token, longest + 5.0) as http:
            evaluator = Evaluator(
                http, discovery=discovery, faults=faults, judge=judge, nodes=args.node
            )
            return await evaluator.run(
                cases,
                repeat=args.repeat,
                min_pass_rate=args.min_pass_rate,
                progress=_progress(sys.stderr),
            )
    finally:
        await discovery.aclose()
        if judge is not None:
            await judge.aclose()


_POLL_S = 0.5
_STOP_S = 30.0


@contextlib.contextmanager
def _fresh_up(args: argparse.Namespace) -> Iterator[None]:
    """``mesh up args.up`` in a child process until every process it runs is healthy; sets
    ``args.registry`` and ``args.meshfile`` to it; stops it (SIGTERM, as Ctrl-C) on the way out.
    A mesh already running on the same state dir or ports makes it fail at once, with its
    words."""
    from mesh._control import ControlRequest, ask, up_running
    from mesh._meshfile import load_meshfile

    root = Path(args.root).resolve()
    meshfile = load_meshfile(args.up)
    state = meshfile.state_path(root)
    if up_running(state):
        # Its control channel would answer for ours: refuse rather than test the wrong mesh.
        raise ConfigError(
            f"a `mesh up` already runs for {args.up} (state dir {state}): stop it (Ctrl-C where "
            f"it runs), or test it as it is: mesh eval {args.cases} --meshfile {args.up}"
        )
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in the finally below
        mode="w+", prefix="mesh-eval-up-", suffix=".log", delete=False
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "mesh", "up", args.up, "--root", str(root)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=root,
        start_new_session=True,  # a Ctrl-C of mesh eval reaches it through the finally only
    )

    def output() -> str:
        log.flush()
        return Path(log.name).read_text(errors="replace")[-2000:]

    try:
        deadline = time.monotonic() + args.start_timeout
        while True:
            if child.poll() is not None:
                raise ConfigError(
                    f"`mesh up {args.up}` exited ({child.returncode}) before the mesh was "
                    "ready; is a mesh (the demo?) already running on its ports or state dir? "
                    f"stop it, or run `mesh eval` against it without --up. Its output:\n" + output()
                )
            with contextlib.suppress(ConfigError):
                reply = asyncio.run(
                    ask(state, ControlRequest(op="ps"), meshfile=args.up)  # not up yet: retry
                )
                if (
                    reply.ok
                    and reply.processes
                    and all(p.status == "healthy" for p in reply.processes)
                ):
                    break
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"`mesh up {args.up}` was not healthy within {args.start_timeout:g}s "
                    "(--start-timeout). Its output:\n" + output()
                )
            time.sleep(_POLL_S)
        args.registry = args.registry or meshfile.registry.public_url
        args.meshfile = args.up
        yield
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGTERM)
            try:
                child.wait(_STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        log.close()
        os.unlink(log.name)


def _eval(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from mesh._eval.cases import load_cases
    from mesh._eval.report import format_results, write_json, write_junit

    out = out or sys.stdout
    if args.repeat < 1:
        raise ConfigError("--repeat: at least 1")
    if not 0.0 <= args.min_pass_rate <= 1.0:
        raise ConfigError("--min-pass-rate: between 0 and 1")
    cases = load_cases(args.cases).cases
    if args.case:
        unknown = sorted(set(args.case) - {c.name for c in cases})
        if unknown:
            raise ConfigError(
                f"no case named {', '.join(unknown)} in {args.cases}: "
                f"cases are {', '.join(c.name for c in cases)}"
            )
        cases = [c for c in cases if c.name in args.case]
    with _fresh_up(args) if args.up else contextlib.nullcontext():
        faults = _faults(args) if any(c.without for c in cases) else None
        results = asyncio.run(_run(args, cases, faults))
    print(format_results(results), file=out)
    if args.json:
        write_json(results, args.json)
    if args.junit:
        write_junit(results, args.junit)
    return 0 if all(r.passed for r in results) else 1
