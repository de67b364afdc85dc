"""The operator page: server-rendered HTML, no build step, no external assets.

``/`` lists every agent (search by name, skill or text through the query string);
``/agents/{name}`` shows one agent's card, skills with their input/output fields, and instances.
A tiny script re-fetches the page every few seconds and swaps the content, so it stays current
while open without disturbing the search box.

The HTML is Jinja2 templates (``registry/templates``) with autoescape on: everything a card or a
registration says is text on the page, never markup.
"""

from __future__ import annotations

import json
import time
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, StrictUndefined

from registry.catalog import AgentView
from registry.schema_view import schema_rows
from registry.state import RegistryState, get_state

__all__ = ["REFRESH_S", "router"]

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


def _query(**params: str) -> str:
    return urlencode(params)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("registry", "templates"),
        autoescape=True,
        # A misspelt name in a template fails the render instead of printing nothing.
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=_age, stamp=_stamp)
    env.globals.update(query=_query, schema_rows=schema_rows, refresh_ms=REFRESH_S * 1000)
    return env


_templates = Jinja2Templates(env=_environment())


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


@router.get("/agents/{name}", response_class=HTMLResponse)
async def agent_page(request: Request, name: str, state: State) -> HTMLResponse:
    view: AgentView | None = await state.catalog.agent(name)
    context = {"q": "", "name": name, "view": view, "now": time.time()}
    if view is None:
        context["title"] = f"{name}: not found"
        return _templates.TemplateResponse(
            request, "agent.html", context, status_code=404, headers=_NO_STORE
        )
    context["title"] = f"{view.agent.name} · mesh registry"
    context["card_json"] = json.dumps(view.agent.card, indent=2, sort_keys=True)
    return _templates.TemplateResponse(request, "agent.html", context, headers=_NO_STORE)
