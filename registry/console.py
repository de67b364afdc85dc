"""The console's views of tasks and its write actions (docs/console.md).

``/paths`` shows one request's path (``registry.paths``), from a trace id or a task id (``agent``
narrows where the task is looked for); JSON at ``GET /v1/paths/{trace_id}``. ``/inbox`` lists
every waiting task with a form for its answer (``registry.inbox``). The writes are form posts
under ``/console/`` (``registry.gate`` lets them through without a bearer token): sign in with
the registry's write token, answer, sign out, each checked by ``registry.operator`` (session,
CSRF token, origin). A refused write is a 403 page saying why and what to do; nothing is sent.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from mesh._errors import ConfigError, MeshError
from registry.inbox import form_fields, send_answer, waiting
from registry.operator import same_origin
from registry.page import render
from registry.paths import request_path, trace_of_task
from registry.state import RegistryState, get_state

__all__ = ["may_read", "operator_context", "read_form", "router"]

log = logging.getLogger("registry.console")
router = APIRouter(include_in_schema=False)
State = Annotated[RegistryState, Depends(get_state)]
# A task id or an agent name typed in the path form: longer is not one.
_MAX_ID = 200


def operator_context(request: Request, state: RegistryState) -> dict[str, Any]:
    """What every console page needs to show the sign-in state and post forms."""
    session = state.sessions.of(request)
    return {
        "can_write": state.sessions.enabled,
        "signed_in": session is not None,
        "csrf": session.csrf if session else "",
    }


async def read_form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", errors="replace")
    return dict(parse_qsl(body, keep_blank_values=True))


def _local(next_url: str) -> str:
    # Only a path of this registry: never a redirect to another site.
    return next_url if next_url.startswith("/") and not next_url.startswith("//") else "/inbox"


@router.get("/paths", response_class=HTMLResponse)
async def path_page(
    request: Request, state: State, trace: str = "", task: str = "", agent: str = ""
) -> HTMLResponse:
    if not may_read(request, state):
        return _sign_in(request, state)
    trace, task, agent = trace.strip().lower(), task.strip()[:_MAX_ID], agent.strip()[:_MAX_ID]
    context: dict[str, Any] = {
        "title": "request path · mesh registry",
        "q": "",
        "trace": trace,
        "task": task,
        "agent": agent,
        "path": None,
        "problem": "",
        "refused": [],
        # Every refresh would ask every node again: reload to see a running request move.
        "refresh": False,
    }
    status = 200
    if task and not trace:
        found, refused = await trace_of_task(state, task, agent=agent or None)
        if found is None:
            where = f"the instances of {agent}" if agent else "any instance the registry may ask"
            context["problem"] = f"no task {task} at {where}"
            context["refused"] = refused
            status = 404
        else:
            trace = context["trace"] = found
    if trace:
        try:
            context["path"] = await request_path(state, trace)
        except ValueError as exc:
            context["problem"] = f"trace {trace!r}: {exc}"
            status = 422
    return render(request, "path.html", context, status=status)


@router.get("/v1/paths/{trace_id}", tags=["console"])
async def path_json(request: Request, trace_id: str, state: State) -> JSONResponse:
    """One request's path as JSON (what ``/paths`` shows). With a mesh token, the operator's
    only: the registry's write token as a bearer, or a console session."""
    if not may_read(request, state):
        return JSONResponse(
            {
                "error": "unauthorized",
                "message": "this registry shows tasks to its operator only: send "
                "'Authorization: Bearer <registry write token>'",
            },
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    try:
        path = await request_path(state, trace_id)
    except ValueError as exc:
        return JSONResponse(
            {"error": "invalid_request", "message": f"trace_id: {exc}"}, status_code=422
        )
    return JSONResponse(path.as_dict())


@router.get("/inbox", response_class=HTMLResponse)
async def inbox_page(request: Request, state: State) -> HTMLResponse:
    if not may_read(request, state):
        return _sign_in(request, state)
    return await _inbox(request, state)


async def _inbox(
    request: Request, state: RegistryState, *, done: str = "", problem: str = "", status: int = 200
) -> HTMLResponse:
    context = {
        "title": "inbox · mesh registry",
        "q": "",
        "inbox": await waiting(state),
        "form_fields": form_fields,
        "done": done,
        "problem": problem,
        "refresh": False,  # a form being filled in is not swapped away
        **operator_context(request, state),
    }
    return render(request, "inbox.html", context, status=status)


def may_read(request: Request, state: RegistryState) -> bool:
    return state.sessions.may_read_tasks(request, mesh_token=state.reach.mesh_token is not None)


def _sign_in(request: Request, state: RegistryState) -> HTMLResponse:
    """The sign-in page in place of a task view (401): the operator's credential first."""
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    context = {"title": "sign in · mesh registry", "q": "", "next": here, "refresh": False}
    return render(
        request, "signin.html", {**context, **operator_context(request, state)}, status=401
    )


def _refused(request: Request, why: str) -> HTMLResponse:
    return render(
        request,
        "refused.html",
        {"title": "refused · mesh registry", "q": "", "why": why},
        status=403,
    )


@router.post("/console/login")
async def login(request: Request, state: State) -> Response:
    form = await read_form(request)
    sessions = state.sessions
    if not sessions.enabled:
        return _refused(request, sessions.refusal(request, "") or "")
    if not same_origin(request):
        return _refused(request, "refused: the form was posted from another site")
    if not sessions.check_token(form.get("token", "")):
        log.warning("console sign-in refused: wrong write token")
        return _refused(
            request, "wrong token: give the registry's write token (MESH_REGISTRY_TOKEN)"
        )
    response = RedirectResponse(_local(form.get("next", "/inbox")), status_code=303)
    log.info("console: the operator signed in")
    sessions.open(response, request)
    return response


@router.post("/console/logout")
async def logout(request: Request, state: State) -> Response:
    form = await read_form(request)
    why = state.sessions.refusal(request, form.get("csrf", ""))
    if why is not None:
        return _refused(request, why)
    response = RedirectResponse("/inbox", status_code=303)
    state.sessions.close(request, response)
    return response


@router.post("/console/answer")
async def answer(request: Request, state: State) -> Response:
    form = await read_form(request)
    why = state.sessions.refusal(request, form.get("csrf", ""))
    if why is not None:
        log.warning("console answer refused: %s", why)
        return _refused(request, why)
    agent, task_id, question = form.get("agent", ""), form.get("task", ""), form.get("question", "")
    try:
        done = await send_answer(state, agent, task_id, question, form)
    except ConfigError as exc:
        return await _inbox(request, state, problem=str(exc), status=422)
    except (MeshError, ValueError) as exc:  # ValueError: the SDK found no interface to call
        text = f"{agent} did not take the answer: {exc}"
        return await _inbox(request, state, problem=text, status=502)
    result = done.result
    log.info("console answered task %s at %s: now %s", task_id, agent, result.state)
    text = f"task {result.task_id} at {agent}: {result.state}"
    if result.text:
        text += f". {result.text}"
    return await _inbox(request, state, done=text)
