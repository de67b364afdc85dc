"""``mesh registry ARGS...``: an alias of ``python -m registry ARGS...`` (``mesh-registry``).

The registry is a service built from mesh's parts, with its own command (``registry.cli``); mesh
does not import it (the import contracts in pyproject.toml). The alias replaces this process
with the registry's (``os.execv``): the pid stays the one ``mesh up``'s supervisor started and
signals, and the registry's help, errors and exit codes are the command's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Register ``registry`` on the ``mesh`` sub-parsers: every argument after it, ``--help``
    included, goes to the registry's command unread."""
    p = sub.add_parser(
        "registry",
        help="run the registry (API, operator page, Prometheus SD): same as mesh-registry",
        add_help=False,
        # No prefix character: no argument is an option of this parser, all pass through.
        prefix_chars="\0",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_exec_registry)


def _exec_registry(args: argparse.Namespace) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "registry", *args.args])
