"""The operator page: server-rendered HTML, no build step, no external assets.

``/`` lists every agent (search by name, skill or text through the query string);
``/topology`` draws the agents and the delegation edges used between them with their traffic
(``registry.topology``, inline SVG laid out here); ``/agents/{name}`` shows one agent live (its
traffic, tokens and cost, peers, breakers, instances with uptime and restarts), its card, and
its skills with their input/output fields. See docs/console.md.
A tiny script re-fetches the page every few seconds and swaps the content, so it stays current
while open without disturbing the search box.

The HTML is Jinja2 templates (``registry/templates``) with autoescape on: everything a card or a
registration says is text on the page, never markup.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, StrictUndefined

from mesh._stats import WINDOW_S
from registry.catalog import AgentView
from registry.schema_view import schema_rows
from registry.state import RegistryState, get_state
from registry.topology import BOX_H, BOX_W, AgentLive, Topology, layout

__all__ = ["REFRESH_S", "render", "router"]

REFRESH_S = 3

router = APIRouter(include_in_schema=False)
State = Annotated[RegistryState, Depends(get_state)]
_NO_STORE = {"Cache-Control": "no-store"}


def _age(ts: float, now: float) -> str:
    s = max(0, int(now - ts))
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m {s % 60}s ago"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m ago"
    return f"{s // 86400}d ago"


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _since(stamp: str, now: float) -> str:
    """An RFC 3339 time as an age ("3s ago"), or as given when it is not one."""
    try:
        return _age(datetime.fromisoformat(stamp).timestamp(), now)
    except ValueError:
        return stamp or "—"


def _query(**params: str) -> str:
    return urlencode(params)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return _age(0, seconds).removesuffix(" ago")


def _percent(rate: float | None) -> str:
    return "—" if rate is None else f"{rate * 100:.0f}%" if rate >= 0.01 or rate == 0 else "<1%"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.1f}"


def _cost(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}" if value < 1 else f"{value:,.2f}"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("registry", "templates"),
        autoescape=True,
        # A misspelt name in a template fails the render instead of printing nothing.
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        age=_age,
        since=_since,
        stamp=_stamp,
        duration=_duration,
        percent=_percent,
        number=_number,
        cost=_cost,
    )
    env.globals.update(query=_query, schema_rows=schema_rows, refresh_ms=REFRESH_S * 1000)
    return env


_templates = Jinja2Templates(env=_environment())


def render(
    request: Request, name: str, context: dict[str, Any], *, status: int = 200
) -> HTMLResponse:
    """A page of the console (never cached: it is live)."""
    return _templates.TemplateResponse(
        request, name, context, status_code=status, headers=_NO_STORE
    )


@router.get("/", response_class=HTMLResponse)
async def index(
    request: Request, state: State, q: str = "", skill: str = "", tag: str = ""
) -> HTMLResponse:
    views = await state.catalog.agents(skill=skill or None, tag=tag or None, q=q or None)
    filters = [
        (kind, value) for kind, value in (("text", q), ("skill", skill), ("tag", tag)) if value
    ]
    context = {"title": "mesh registry", "q": q, "views": views, "filters": filters}
    return _templates.TemplateResponse(request, "index.html", context, headers=_NO_STORE)


@router.get("/topology", response_class=HTMLResponse)
async def topology_page(request: Request, state: State) -> HTMLResponse:
    topology = Topology.build(await state.catalog.agents(), state.prober.traffic)
    context = {
        "title": "topology · mesh registry",
        "q": "",
        "topology": topology,
        "graph": layout(topology),
        "box_w": BOX_W,
        "box_h": BOX_H,
        "window_s": WINDOW_S,
    }
    return _templates.TemplateResponse(request, "topology.html", context, headers=_NO_STORE)


@router.get("/agents/{name}", response_class=HTMLResponse)
async def agent_page(request: Request, name: str, state: State) -> HTMLResponse:
    view: AgentView | None = await state.catalog.agent(name)
    context: dict[str, Any] = {"q": "", "name": name, "view": view, "now": time.time()}
    if view is None:
        context["title"] = f"{name}: not found"
        return _templates.TemplateResponse(
            request, "agent.html", context, status_code=404, headers=_NO_STORE
        )
    # The whole catalog: the edges into this agent come from its callers' stats.
    topology = Topology.build(await state.catalog.agents(), state.prober.traffic)
    # Removed between the two reads: shown with no traffic rather than a 500.
    context["live"] = topology.agents.get(name) or AgentLive(name, registered=True)
    context["heard"] = {i.instance_id: i for i in context["live"].instances}
    context["calls_out"], context["calls_in"] = topology.edges_of(name)
    context["window_s"] = WINDOW_S
    context["title"] = f"{view.agent.name} · mesh registry"
    context["card_json"] = json.dumps(view.agent.card, indent=2, sort_keys=True)
    # Asked of the agent's nodes now, while its page is open (registry.recent); the
    # operator's only when the registry holds the mesh token (registry.operator).
    readable = state.sessions.may_read_tasks(request, mesh_token=state.reach.mesh_token is not None)
    context["recent"] = await state.recent.of(state, name) if readable else None
    return _templates.TemplateResponse(request, "agent.html", context, headers=_NO_STORE)
