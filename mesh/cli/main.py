"""The ``mesh`` command. Each sub-command lives in the module that owns it and registers itself
through ``add_parsers(subparsers)``; this module only wires them and maps errors to exit codes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from mesh import __version__
from mesh.errors import MeshError

# Modules contributing sub-commands, in help order.
_COMMAND_MODULES = (
    "mesh.cli.serve",  # serve, card, call
    "mesh.cli.registry",  # registry, ls, show
    "mesh.cli.up",  # up, chat
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
        result = handler(args)
    except MeshError as exc:
        print(f"mesh: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
