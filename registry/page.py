"""The operator page: server-rendered HTML, no build step, no external assets.

``/`` lists every agent (search by name, skill or text through the query string);
``/agents/{name}`` shows one agent's card, skills with their input/output fields, and instances.
A tiny script re-fetches the page every few seconds and swaps the content, so it stays current
while open without disturbing the search box.
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse

from registry.catalog import AgentView
from registry.schema_view import schema_rows
from registry.state import RegistryState, get_state
from registry.store import InstanceRecord, SkillRecord

__all__ = ["REFRESH_S", "router"]

REFRESH_S = 3

router = APIRouter(include_in_schema=False)
State = Annotated[RegistryState, Depends(get_state)]

_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#e3e6ec; --bg:#f6f7f9; --accent:#2457c5;
  --ok:#17803d; --warn:#a86400; --bad:#c0262d; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
  color:var(--fg); background:var(--bg); }
header { background:#fff; border-bottom:1px solid var(--line); padding:12px 24px;
  display:flex; gap:24px; align-items:center; flex-wrap:wrap; }
header h1 { font-size:18px; margin:0; } header h1 a { color:inherit; text-decoration:none; }
header form { display:flex; gap:8px; flex:1; max-width:560px; }
header input { flex:1; padding:7px 10px; border:1px solid #c8cdd6; border-radius:6px; font:inherit; }
header button { padding:7px 14px; border:0; border-radius:6px; background:var(--accent);
  color:#fff; font:inherit; cursor:pointer; }
main { max-width:1200px; margin:0 auto; padding:20px 24px 48px; }
a { color:var(--accent); }
table { width:100%; border-collapse:collapse; background:#fff; border:1px solid var(--line);
  border-radius:8px; overflow:hidden; margin:8px 0 20px; }
th, td { text-align:left; padding:8px 12px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:#fafbfc; font-weight:600; font-size:13px; color:var(--muted); }
tr:last-child td { border-bottom:0; }
.muted { color:var(--muted); } .small { font-size:13px; }
.chip { display:inline-block; padding:1px 8px; margin:2px 4px 2px 0; border-radius:10px;
  background:#eef2fb; color:#234; font-size:13px; text-decoration:none; }
.tag { background:#f1f1f1; color:#444; }
.badge { display:inline-block; padding:1px 9px; border-radius:10px; font-size:13px;
  font-weight:600; color:#fff; }
.passing { background:var(--ok); } .warning { background:var(--warn); }
.critical { background:var(--bad); } .none { background:#8a93a3; }
.card { background:#fff; border:1px solid var(--line); border-radius:8px; padding:14px 18px;
  margin:0 0 16px; }
.card h3 { margin:0 0 4px; } code, pre { font-family:ui-monospace,Menlo,Consolas,monospace;
  font-size:13px; } pre { background:#fafbfc; padding:12px; overflow:auto; border-radius:6px; }
dl { display:grid; grid-template-columns:max-content 1fr; gap:4px 16px; margin:0; }
dt { color:var(--muted); } dd { margin:0; }
.empty { padding:32px; text-align:center; background:#fff; border:1px dashed #c8cdd6;
  border-radius:8px; }
"""

# Swap <main> for a fresh copy every few seconds; skip while the tab is hidden.
_SCRIPT = f"""
setInterval(async () => {{
  if (document.hidden) return;
  try {{
    const r = await fetch(location.href, {{headers: {{"X-Refresh": "1"}}}});
    if (!r.ok) return;
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    const fresh = doc.querySelector("main");
    if (fresh) document.querySelector("main").replaceWith(fresh);
  }} catch (e) {{ /* registry restarting: keep the last view */ }}
}}, {REFRESH_S * 1000});
"""


def _page(title: str, body: str, *, q: str = "") -> HTMLResponse:
    html = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{_CSS}</style></head>
<body><header><h1><a href="/">mesh registry</a></h1>
<form method="get" action="/" role="search">
<input type="search" name="q" value="{escape(q)}" placeholder="Search agents by name, skill or text"
 aria-label="search">
<button type="submit">Search</button></form>
<span class="small muted"><a href="/docs">API</a> · <a href="/v1/prometheus/targets">Prometheus SD</a>
· <a href="/metrics">metrics</a></span></header>
<main>{body}</main>
<script>{_SCRIPT}</script></body></html>"""
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def _ago(ts: float, now: float) -> str:
    if ts <= 0:
        return "never"
    s = max(0, int(now - ts))
    if s < 60:
        text = f"{s}s ago"
    elif s < 3600:
        text = f"{s // 60}m {s % 60}s ago"
    elif s < 86400:
        text = f"{s // 3600}h {s % 3600 // 60}m ago"
    else:
        text = f"{s // 86400}d ago"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f'<span title="{stamp}">{text}</span>'


def _badge(status: str) -> str:
    return f'<span class="badge {escape(status)}">{escape(status)}</span>'


def _counts(view: AgentView) -> str:
    total = len(view.instances)
    cls = (
        "none"
        if total == 0
        else "passing"
        if view.passing == total
        else ("critical" if view.passing == 0 else "warning")
    )
    return f'<span class="badge {cls}" data-up="{view.passing}">{view.passing}/{total} up</span>'


def _skill_chip(s: SkillRecord) -> str:
    href = "/?" + urlencode({"skill": s.id})
    return f'<a class="chip" href="{href}" title="{escape(s.description)}">{escape(s.id)}</a>'


@router.get("/", response_class=HTMLResponse)
async def index(state: State, q: str = "", skill: str = "", tag: str = "") -> HTMLResponse:
    views = await state.catalog.agents(skill=skill or None, tag=tag or None, q=q or None)
    filters = [
        f"text “{escape(q)}”" if q else "",
        f"skill <code>{escape(skill)}</code>" if skill else "",
        f"tag <code>{escape(tag)}</code>" if tag else "",
    ]
    shown = ", ".join(f for f in filters if f)
    head = f'<h2>Agents <span class="muted small">({len(views)})</span></h2>'
    if shown:
        head += f'<p class="small">Filtered by {shown}. <a href="/">Show all</a></p>'
    if not views:
        hint = (
            "No agent matches."
            if shown
            else "No agents registered yet. Start one with "
            "<code>mesh serve MODULE:agent --registry URL-of-this-registry</code>."
        )
        return _page("mesh registry", head + f'<div class="empty">{hint}</div>', q=q)
    rows = []
    for v in views:
        a = v.agent
        tags = "".join(
            f'<a class="chip tag" href="/?{urlencode({"tag": t})}">{escape(t)}</a>' for t in a.tags
        )
        rows.append(
            f'<tr data-agent="{escape(a.name)}"><td><a href="/agents/{escape(a.name)}"><b>'
            f"{escape(a.name)}</b></a></td><td>{escape(a.description)}<div>{tags}</div></td>"
            f"<td>{''.join(_skill_chip(s) for s in a.skills)}</td>"
            f"<td>{escape(a.version)}</td><td>{_counts(v)}</td></tr>"
        )
    table = (
        '<table id="agents"><thead><tr><th>Agent</th><th>Description</th><th>Skills</th>'
        f"<th>Version</th><th>Instances</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return _page("mesh registry", head + table, q=q)


def _fields_table(title: str, schema: dict[str, Any] | None) -> str:
    rows = schema_rows(schema)
    if not rows:
        return f'<p class="small muted">{escape(title)}: no fields.</p>'
    body = "".join(
        f"<tr><td><code>{escape(r.name)}</code></td><td>{escape(r.type)}</td>"
        f"<td>{'yes' if r.required else 'no'}</td><td>{escape(r.description)}</td></tr>"
        for r in rows
    )
    return (
        f'<h4>{escape(title)}</h4><table class="fields"><thead><tr><th>Field</th><th>Type</th>'
        f"<th>Required</th><th>Description</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _skill_card(s: SkillRecord) -> str:
    tags = "".join(f'<span class="chip tag">{escape(t)}</span>' for t in s.tags)
    if s.input_schema is None and s.output_schema is None:
        io = '<p class="small muted">Free text in, free text out.</p>'
    else:
        io = _fields_table("Input", s.input_schema) + _fields_table("Output", s.output_schema)
    return (
        f'<div class="card skill" id="skill-{escape(s.id)}"><h3>{escape(s.name)} '
        f'<code class="muted small">{escape(s.id)}</code></h3>'
        f"<p>{escape(s.description)}</p><div>{tags}</div>{io}</div>"
    )


def _instance_row(i: InstanceRecord, now: float) -> str:
    url = escape(i.url)
    return (
        f'<tr data-instance="{escape(i.instance_id)}"><td><a href="{url}">{url}</a>'
        f'<div class="small muted">{escape(i.instance_id)}</div></td>'
        f"<td>{escape(i.version)}</td><td>{_badge(i.status)}"
        f'<div class="small muted">{escape(i.status_reason)}</div></td>'
        f"<td>{_ago(i.status_changed_at, now)}</td><td>{_ago(i.last_heartbeat_at, now)}</td>"
        f'<td><a href="{url}/introspect">introspect</a> · <a href="{url}/metrics">metrics</a> · '
        f'<a href="{url}/.well-known/agent-card.json">card</a></td></tr>'
    )


@router.get("/agents/{name}", response_class=HTMLResponse)
async def agent_page(name: str, state: State) -> HTMLResponse:
    view = await state.catalog.agent(name)
    if view is None:
        body = (
            f'<div class="empty">No agent named <code>{escape(name)}</code> is registered. '
            '<a href="/">All agents</a></div>'
        )
        response = _page(f"{name}: not found", body)
        response.status_code = 404
        return response
    a, now = view.agent, time.time()
    card = a.card
    interfaces = "".join(
        f"<div><code>{escape(str(i.get('url', '')))}</code> "
        f"<span class='muted small'>{escape(str(i.get('protocolBinding', '')))} "
        f"{escape(str(i.get('protocolVersion', '')))}</span></div>"
        for i in card.get("supportedInterfaces", [])
    )
    caps = card.get("capabilities", {})
    summary = (
        f'<div class="card"><dl><dt>Version</dt><dd>{escape(a.version)}</dd>'
        f"<dt>Instances</dt><dd>{_counts(view)}</dd>"
        f"<dt>Interfaces</dt><dd>{interfaces or '—'}</dd>"
        f"<dt>Streaming</dt><dd>{'yes' if caps.get('streaming') else 'no'}</dd>"
        f"<dt>Input modes</dt><dd>{escape(', '.join(card.get('defaultInputModes', [])))}</dd>"
        f"<dt>Output modes</dt><dd>{escape(', '.join(card.get('defaultOutputModes', [])))}</dd>"
        f"<dt>Tags</dt><dd>{escape(', '.join(a.tags)) or '—'}</dd></dl></div>"
    )
    instances = (
        "<table id='instances'><thead><tr><th>URL</th><th>Version</th><th>Health</th>"
        "<th>Last change</th><th>Last heartbeat</th><th>Links</th></tr></thead><tbody>"
        + "".join(_instance_row(i, now) for i in view.instances)
        + "</tbody></table>"
        if view.instances
        else '<div class="empty">No instances.</div>'
    )
    body = (
        f'<p class="small"><a href="/">← all agents</a></p><h2>{escape(a.name)}</h2>'
        f"<p>{escape(a.description)}</p>{summary}"
        f"<h2>Instances</h2>{instances}"
        f"<h2>Skills</h2>{''.join(_skill_card(s) for s in a.skills)}"
        f"<details><summary>Agent card (JSON)</summary><pre>"
        f"{escape(json.dumps(card, indent=2, sort_keys=True))}</pre></details>"
    )
    return _page(f"{a.name} · mesh registry", body)
