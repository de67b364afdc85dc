"""``mesh up`` (run a whole mesh from a mesh.toml) and ``mesh chat`` (talk to one agent).

mesh up                       # agents/mesh.toml: the loan desk
mesh up path/to/mesh.toml
mesh chat loan-officer        # by name, through the registry
mesh chat http://127.0.0.1:8401
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import TextIO

from mesh.meshfile import MeshFile, load_meshfile
from mesh.supervisor import Child, Supervisor

__all__ = ["add_parsers"]

DEFAULT_MESHFILE = "agents/mesh.toml"

_MARK = {
    "pending": " ",
    "starting": "…",
    "healthy": "✓",
    "unhealthy": "!",
    "crashed": "✗",
    "stopped": "■",
}


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up",
        help="start the registry and every node of a mesh file; Ctrl-C stops them",
        description="Start the registry and every node of a mesh file as separate processes, "
        "restart crashed nodes, and stop everything on Ctrl-C or SIGTERM. Logs go to "
        "<state_dir>/logs/.",
    )
    up.add_argument(
        "meshfile", nargs="?", default=DEFAULT_MESHFILE, help=f"default: {DEFAULT_MESHFILE}"
    )
    up.add_argument(
        "--root",
        default=".",
        help="directory the processes run in (modules and relative paths resolve here)",
    )
    up.add_argument(
        "--start-timeout", type=float, default=60.0, help="seconds to wait for each process"
    )
    up.set_defaults(handler=_run_up)


def _run_up(args: argparse.Namespace) -> int:
    meshfile = load_meshfile(args.meshfile)
    root = Path(args.root).resolve()
    return asyncio.run(up(meshfile, root=root, start_timeout=args.start_timeout))


async def up(
    meshfile: MeshFile, *, root: Path, start_timeout: float = 60.0, out: TextIO = sys.stdout
) -> int:
    """Run the mesh until SIGINT/SIGTERM. Returns the exit code."""
    log_dir = (root / meshfile.state_dir / "logs").resolve()
    started = False

    def report(child: Child) -> None:
        # Before everything is up, show every step; afterwards only what matters.
        if not started or child.status in ("crashed", "healthy", "unhealthy"):
            restarts = f" (restart {child.restarts})" if child.restarts else ""
            print(
                f"  {_MARK[child.status]} {child.spec.name:<20} {child.status:<9} "
                f"{child.detail}{restarts}",
                file=out,
                flush=True,
            )

    specs = meshfile.plan(root)
    supervisor = Supervisor(
        specs, log_dir=log_dir, cwd=root, on_change=report, start_timeout=start_timeout
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        print(f"mesh up: starting {len(specs)} processes (logs in {log_dir})", file=out, flush=True)
        start = asyncio.create_task(supervisor.start())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await start
            stopper.cancel()
            await supervisor.stop()
            print("mesh up: interrupted while starting; stopped", file=out, flush=True)
            return 130
        stopper.cancel()
        start.result()  # raises ConfigError (after stopping everything) when a process failed
        started = True
        _print_table(meshfile, supervisor, out)
        watcher = asyncio.create_task(supervisor.watch())
        await stop.wait()
        print("mesh up: stopping…", file=out, flush=True)
        await supervisor.stop()
        await watcher
        print("mesh up: stopped", file=out, flush=True)
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _print_table(meshfile: MeshFile, supervisor: Supervisor, out: TextIO) -> None:
    rows = [("AGENT", "PROCESS", "URL", "HEALTH")]
    for child in supervisor.children:
        health = "ok" if child.status == "healthy" else child.status
        rows.append((child.spec.agent, child.spec.name, child.spec.url, health))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(file=out)
    for row in rows:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)), file=out)
    print(file=out)
    print(f"registry page: {meshfile.registry.public_url}/", file=out)
    first = next(iter(meshfile.nodes))
    print(f"try:           mesh chat {first} --registry {meshfile.registry.public_url}", file=out)
    print("Ctrl-C stops everything.", file=out, flush=True)
