"""``mesh keys init DIR`` and ``mesh keys issue DIR AGENT``: the mesh's trust root and the
agents' certified keys (``mesh._keys``; docs/production.md, "Signed cards")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]


def _init(args: argparse.Namespace) -> int:
    from mesh._keys import init_mesh

    folder = Path(args.dir)
    kid = init_mesh(folder)
    print(f"mesh root {kid} created in {folder}")
    print(f"  {folder / 'root.key.jwk'}: the root's private key; keep it off the nodes")
    print(f"  {folder / 'root.jwk'}: the trust root (the registry: MESH_KEYS={folder})")
    print(f"next: mesh keys issue {folder} AGENT, for each agent")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from mesh._keys import issue_agent

    out = issue_agent(Path(args.dir), args.agent, days=args.days)
    print(f"key of {args.agent!r} certified by the mesh root, valid {args.days} days: {out}")
    print(f"serve the agent with MESH_KEYS={out} (or --keys {out})")
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``keys`` (``init``, ``issue``) on the ``mesh`` sub-command parser."""
    p = sub.add_parser(
        "keys",
        help="create the mesh's trust root and certified agent keys (signed cards)",
        description="Keys for signed agent cards: `init` creates the mesh's root key pair, "
        "`issue` a key for one agent with the root's certificate of it. Files are 0600.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    i = verbs.add_parser("init", help="create the mesh's root key pair in DIR")
    i.add_argument("dir", metavar="DIR", help="folder for root.key.jwk and root.jwk")
    i.set_defaults(handler=_init)
    s = verbs.add_parser("issue", help="a key for AGENT, certified by the root in DIR")
    s.add_argument("dir", metavar="DIR", help="the folder of `mesh keys init`")
    s.add_argument("agent", metavar="AGENT", help="the agent's name (as on its card)")
    s.add_argument("--days", type=int, default=365, help="days the certificate lasts (365)")
    s.set_defaults(handler=_issue)
