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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mesh",
        description="Run LLM agents as services that find each other and delegate over A2A.",
    )
    parser.add_argument("--version", action="version", version=f"mesh {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
