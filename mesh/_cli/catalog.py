"""``mesh ls`` (agents) and ``mesh show NAME`` (one agent): the registry's catalog, read as a
client over its HTTP API (the registry itself runs as ``mesh-registry``; ``mesh._cli.registry``).

``ls`` and ``show`` find the registry through ``--registry``, else ``MESH_REGISTRY``, else
http://127.0.0.1:8400.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

from mesh._cli.table import format_table
from mesh._discovery.registry_client import RegistryBackend
from mesh._settings import DEFAULT_REGISTRY_URL

__all__ = ["add_parsers", "format_agent", "format_agents"]


def add_parsers(sub: Any) -> None:
    """Register ``ls`` and ``show`` on the ``mesh`` sub-parsers."""
    ls = sub.add_parser("ls", help="list the agents in the registry")
    _registry_arg(ls)
    ls.add_argument("--skill", help="only agents offering this skill id")
    ls.add_argument("--tag", help="only agents with this tag")
    ls.add_argument("-q", "--query", help="free text (name, description, skills)")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(handler=_ls)

    show = sub.add_parser("show", help="show one agent: card, skills with schemas, instances")
    _registry_arg(show)
    show.add_argument("name", help="agent name")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_show)


def _registry_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--registry",
        default=None,
        help=f"registry URL (default: $MESH_REGISTRY or {DEFAULT_REGISTRY_URL})",
    )


def _registry_url(args: argparse.Namespace) -> str:
    from mesh._settings import MeshSettings  # read at the entry point, like every command

    return str(args.registry or MeshSettings.from_environment().registry_url)


async def _fetch_agents(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    backend = RegistryBackend(url)
    try:
        return await backend.list_agents(skill=args.skill, tag=args.tag, q=args.query)
    finally:
        await backend.aclose()


async def _fetch_agent(url: str, name: str) -> dict[str, Any]:
    backend = RegistryBackend(url)
    try:
        return await backend.get_agent(name)
    finally:
        await backend.aclose()


def _ls(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    url = _registry_url(args)
    agents = asyncio.run(_fetch_agents(url, args))
    if args.json:
        print(json.dumps(agents, indent=2), file=out)
    else:
        print(format_agents(agents, url), file=out)
    return 0


def _show(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    agent = asyncio.run(_fetch_agent(_registry_url(args), args.name))
    if args.json:
        print(json.dumps(agent, indent=2), file=out)
    else:
        print(format_agent(agent), file=out)
    return 0


def format_agents(agents: list[dict[str, Any]], url: str = "") -> str:
    """``mesh ls`` as text: one row per agent with skills and instances up/total."""
    if not agents:
        return f"no agents registered{f' at {url}' if url else ''}"
    rows = []
    for a in agents:
        counts = a.get("instances", {})
        rows.append(
            (
                a["name"],
                a.get("version", ""),
                f"{counts.get('passing', 0)}/{counts.get('total', 0)}",
                ", ".join(s["id"] for s in a.get("skills", [])),
                _clip(a.get("description", ""), 60),
            )
        )
    return format_table(("AGENT", "VERSION", "UP", "SKILLS", "DESCRIPTION"), rows)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _schema_lines(title: str, schema: dict[str, Any] | None) -> list[str]:
    # schema_view is the registry's; a lean copy of its idea keeps the CLI free of it.
    if not schema:
        return []
    defs = schema.get("$defs", {})
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    lines = [f"    {title}:"]
    for name, prop in props.items():
        kind = prop.get("type") or (prop.get("$ref", "").rsplit("/", 1)[-1]) or "any"
        if "anyOf" in prop:
            kind = " | ".join(
                p.get("type") or p.get("$ref", "").rsplit("/", 1)[-1] or "any"
                for p in prop["anyOf"]
            )
        if kind == "array" and isinstance(prop.get("items"), dict):
            items = prop["items"]
            kind = f"array of {items.get('type') or items.get('$ref', '').rsplit('/', 1)[-1]}"
        mark = "*" if name in required else " "
        desc = prop.get("description", "")
        lines.append(f"      {mark} {name}: {kind}" + (f"  ({desc})" if desc else ""))
    del defs
    return lines


def format_agent(agent: dict[str, Any]) -> str:
    """``mesh show`` as text: summary, skills with fields (* = required), instances."""
    lines = [f"{agent['name']} {agent.get('version', '')}".rstrip()]
    if agent.get("description"):
        lines.append(f"  {agent['description']}")
    interfaces = agent.get("card", {}).get("supportedInterfaces", [])
    for i in interfaces:
        lines.append(f"  interface: {i.get('url')} ({i.get('protocolBinding', '')})")
    lines.append("")
    lines.append("skills:")
    for s in agent.get("skills", []):
        tags = f" [{', '.join(s['tags'])}]" if s.get("tags") else ""
        lines.append(f"  {s['id']}: {s.get('description', '')}{tags}")
        if s.get("input_schema") is None:
            lines.append("    free text in, free text out")
        lines += _schema_lines("input", s.get("input_schema"))
        lines += _schema_lines("output", s.get("output_schema"))
    lines.append("")
    instances = agent.get("instances", [])
    up = sum(1 for i in instances if i.get("status") == "passing")
    lines.append(f"instances ({up}/{len(instances)} up):")
    rows = [
        (i["url"], i.get("status", ""), i.get("status_reason", ""), i["instance_id"])
        for i in instances
    ]
    if rows:
        lines += [
            "  " + line
            for line in format_table(("URL", "STATUS", "REASON", "ID"), rows).split("\n")
        ]
    else:
        lines.append("  none")
    return "\n".join(lines)
