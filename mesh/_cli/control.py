"""``mesh ps``, ``mesh restart``, ``mesh stop``, ``mesh logs``: the running ``mesh up``.

mesh ps                            # every process: pid, URL, status, restarts, uptime
mesh stop credit-bureau-1          # a process (or every replica: mesh stop credit-bureau)
mesh restart credit-bureau-1       # stop if running, start, wait until healthy
mesh logs loan-officer -f          # its log since its latest start, then follow it

They find the mesh through its mesh file, like ``mesh up`` did: ``--meshfile``, else the first of
``mesh.toml`` and ``agents/mesh.toml`` in ``--root`` (default: the current folder) that a running
``mesh up`` uses, else the first that exists (named on stderr, so nobody guesses which). Its state
dir holds the lock and socket of the running ``mesh up`` (see ``mesh._control``) and the logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from mesh._cli.table import format_table
from mesh._cli.up import shown_path
from mesh._errors import ConfigError

if TYPE_CHECKING:
    from mesh._control import ControlReply, ProcessInfo
    from mesh._meshfile import MeshFile

__all__ = ["add_parsers"]

_FOLLOW_INTERVAL_S = 0.2


def add_parsers(sub: Any) -> None:
    """Register ``ps``, ``restart``, ``stop`` and ``logs`` on the ``mesh`` sub-parsers."""
    ps = sub.add_parser(
        "ps",
        help="list the processes of the running `mesh up`",
        description="Each process of the running `mesh up`: name, agent, pid, URL, status, "
        "restarts, uptime.",
    )
    _mesh_args(ps)
    ps.add_argument("--json", action="store_true", help="print JSON")
    ps.set_defaults(handler=_ps)

    for verb, text in (
        ("restart", "stop (if running) and start one process again, wait until healthy"),
        ("stop", "stop one process; `mesh up` leaves it stopped until `mesh restart`"),
    ):
        p = sub.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("name", help="process name from `mesh ps` (an agent name: every replica)")
        _mesh_args(p)
        p.set_defaults(handler=_act, op=verb)

    logs = sub.add_parser(
        "logs",
        help="print a process's log (since its latest start)",
        description="Print the log of one process of the mesh, from its latest start; -f "
        "keeps printing what it writes (across restarts) until Ctrl-C.",
    )
    logs.add_argument("name", help="process name from `mesh ps`")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--all", action="store_true", help="every run kept in the log file")
    _mesh_args(logs)
    logs.set_defaults(handler=_logs)


def _mesh_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--meshfile",
        default=None,
        help="the mesh file `mesh up` was given (default: mesh.toml or agents/mesh.toml in the "
        "root, the one a running `mesh up` uses first)",
    )
    p.add_argument("--root", default=".", help="the folder `mesh up` ran in (default: here)")


def _load(args: argparse.Namespace) -> tuple[MeshFile, Path]:
    """The mesh file (``args.meshfile`` becomes the path used) and the root folder."""
    from mesh._control import up_running
    from mesh._meshfile import load_meshfile, meshfiles_in

    root = Path(args.root).resolve()
    if args.meshfile is not None:
        return load_meshfile(args.meshfile), root
    candidates = [(path, load_meshfile(path)) for path in meshfiles_in(root)]
    running = [(p, m) for p, m in candidates if up_running(m.state_path(root))]
    path, meshfile = (running or candidates)[0]
    args.meshfile = shown_path(path)
    print(f"(mesh file: {args.meshfile})", file=sys.stderr, flush=True)
    return meshfile, root


def _ask(args: argparse.Namespace, op: str, name: str | None = None) -> ControlReply:
    from mesh._control import ControlRequest, ask

    meshfile, root = _load(args)
    request = ControlRequest.model_validate({"op": op, "name": name})
    reply = asyncio.run(ask(meshfile.state_path(root), request, meshfile=args.meshfile))
    if not reply.ok:
        raise ConfigError(reply.error)
    return reply


# -- ps / restart / stop ----------------------------------------------------------------------
def _ps(args: argparse.Namespace) -> int:
    reply = _ask(args, "ps")
    if args.json:
        print(reply.model_dump_json(indent=2, include={"processes"}))
    else:
        _print_processes(reply.processes, sys.stdout)
    return 0


def _act(args: argparse.Namespace) -> int:
    reply = _ask(args, args.op, args.name)
    acted = [p for p in reply.processes if args.name in (p.name, p.agent)]
    _print_processes(acted, sys.stdout)
    wanted = "healthy" if args.op == "restart" else "stopped"
    return 0 if all(p.status == wanted for p in acted) else 1


def _print_processes(processes: list[ProcessInfo], out: TextIO) -> None:
    rows = []
    for p in processes:
        # A healthy process's detail is its URL, already shown.
        detail = "" if p.status in ("healthy", "starting") else p.detail
        rows.append(
            (
                p.name,
                p.agent,
                str(p.pid) if p.pid else "-",
                p.url,
                p.status,
                str(p.restarts),
                _duration(p.uptime_s),
                detail,
            )
        )
    header = ("NAME", "AGENT", "PID", "URL", "STATUS", "RESTARTS", "UPTIME", "DETAIL")
    print(format_table(header, rows), file=out)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


# -- logs -------------------------------------------------------------------------------------
def _logs(args: argparse.Namespace) -> int:
    from mesh._supervisor import current_run

    meshfile, root = _load(args)
    specs = meshfile.plan(root)
    names = [s.name for s in specs]
    if args.name not in names:
        replicas = [s.name for s in specs if s.agent == args.name]
        if replicas:
            raise ConfigError(
                f"{args.name!r} runs as {len(replicas)} processes: name one of "
                f"{', '.join(replicas)}"
            )
        raise ConfigError(
            f"no process named {args.name!r} in this mesh (it has: {', '.join(names)})"
        )
    log = meshfile.state_path(root) / "logs" / f"{args.name}.log"
    if not log.exists():
        raise ConfigError(f"no log for {args.name} yet ({log}): has `mesh up` started it?")
    data = log.read_bytes()
    out = sys.stdout.buffer
    out.write(data if args.all else current_run(data))
    out.flush()
    if not args.follow:
        return 0
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how one stops following
        _follow(log, len(data), out)
    return 0


def _follow(log: Path, position: int, out: Any) -> None:
    """Print what is appended to ``log`` from ``position`` on, until interrupted."""
    while True:
        try:
            size = log.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < position:  # truncated or replaced: start over
            position = 0
        if size > position:
            with log.open("rb") as fh:
                fh.seek(position)
                chunk = fh.read(size - position)
            position += len(chunk)
            out.write(chunk)
            out.flush()
        time.sleep(_FOLLOW_INTERVAL_S)
