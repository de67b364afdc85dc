"""The ``mesh`` command. Each sub-command lives in the module that owns it and registers itself
through ``add_parsers(subparsers)``; this module only wires them and maps errors to exit codes:

    0    done
    1    a MeshError (the message says what went wrong and what to do); ``mesh eval``: a
         case failed
    2    usage
    3    ``mesh reply``: no agent has the task
    4    ``mesh call`` / ``mesh reply``: the task waits for an answer (the question and the
         ``mesh reply`` command that answers it are printed)
    78   EX_CONFIG: ``mesh serve`` / ``mesh registry`` could not start as configured (a busy
         port, a bad module, a missing token); ``mesh up`` does not restart a process that
         exits with it, since the same start would fail the same way
    130  interrupted
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

from mesh import __version__
from mesh._errors import ConfigError, MeshError

EX_CONFIG = os.EX_CONFIG  # 78, sysexits.h

# Services whose start-up ConfigError exits with EX_CONFIG (their supervisor reads it).
_SERVICES = frozenset({"serve"})

# Modules contributing sub-commands, in help order.
_COMMAND_MODULES = (
    "mesh._cli.serve",  # serve, card, call
    "mesh._cli.registry",  # registry (runs `python -m registry`, which has its own exit codes)
    "mesh._cli.catalog",  # ls, show
    "mesh._cli.up",  # up, chat
    "mesh._cli.tasks",  # tasks
    "mesh._cli.reply",  # reply (a task that waits for an answer)
    "mesh._cli.control",  # ps, restart, stop, logs (the running `mesh up`)
    "mesh._cli.eval",  # eval (test the composed mesh: mesh._eval)
    "mesh._cli.keys",  # keys init, keys issue (signed cards: mesh._keys)
)


# The module registering each command: a run of one command imports that module's parsers
# only (`mesh serve` skips the catalog's, tasks', eval's... modules: ~25 ms of a node's start,
# issue 19 item 5). Help, a bad command and --version build them all. A test
# checks this table against what the modules register (tests/test_import_cost.py).
_COMMANDS = {
    "serve": "mesh._cli.serve",
    "card": "mesh._cli.serve",
    "call": "mesh._cli.serve",
    "registry": "mesh._cli.registry",
    "ls": "mesh._cli.catalog",
    "show": "mesh._cli.catalog",
    "up": "mesh._cli.up",
    "chat": "mesh._cli.up",
    "tasks": "mesh._cli.tasks",
    "reply": "mesh._cli.reply",
    "ps": "mesh._cli.control",
    "restart": "mesh._cli.control",
    "stop": "mesh._cli.control",
    "logs": "mesh._cli.control",
    "eval": "mesh._cli.eval",
    "keys": "mesh._cli.keys",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``mesh`` parser: every command's, or only ``command``'s when it is a known one."""
    parser = argparse.ArgumentParser(
        prog="mesh",
        description="Run LLM agents as services that find each other and delegate over A2A.",
    )
    parser.add_argument("--version", action="version", version=f"mesh {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    owner = _COMMANDS.get(command or "")
    for name in _COMMAND_MODULES if owner is None else (owner,):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else None
    # `mesh serve` starts with the cyclic collector paused: importing and building a node
    # allocates ~160,000 objects and the passes it triggered cost ~70 ms of CPU. The server
    # freezes what start-up built and resumes collecting once the node is ready
    # (mesh._cli.serve.collect_from_here); this resumes it if it never got there.
    paused = command == "serve" and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _run(argv, command, paused)
    finally:
        if paused:
            gc.enable()


def _run(argv: list[str], command: str | None, paused: bool) -> int:
    parser = build_parser(command)
    args = parser.parse_args(argv)
    args.collector_paused = paused
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        _trust()
        result = handler(args)
    except MeshError as exc:
        print(f"mesh: error: {exc}", file=sys.stderr)
        if isinstance(exc, ConfigError) and args.command in _SERVICES:
            return EX_CONFIG
        return 1
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


def _trust() -> None:
    """Every command verifies HTTPS against ``MESH_TLS_CA`` (else the system's store)."""
    from mesh._settings import MeshSettings
    from mesh._tls import trust

    try:
        settings = MeshSettings.from_environment()
    except ConfigError:
        return  # the command reads its settings itself, and says what is wrong its own way
    trust(settings.tls_ca)


if __name__ == "__main__":
    sys.exit(main())
