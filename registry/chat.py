"""Chat with an agent from the console: ``mesh chat`` in the browser (docs/console.md).

``/agents/{name}/chat`` is the page. A turn is two requests, because the browser's
``EventSource`` can only GET:

1. ``POST /console/chat`` (the message, the page's contextId, the waiting task it answers) is the
   write: checked like an answer from the inbox (``registry.operator``: session, CSRF token,
   origin) and bounded (``MAX_MESSAGE_CHARS``, ``MAX_STREAMS`` open at once). Nothing is sent
   yet; the registry keeps the turn under a random id, for this session only, ``PENDING_S`` at
   most, and answers with where to stream it.
2. ``GET /console/chat/{turn}`` (the ``EventSource``) sends it: the registry calls the agent's
   ``SendStreamingMessage`` on an instance ``registry.reach`` trusts (never a URL from the page;
   the instance that had the context before, while it is still trusted) and forwards what
   streams in as server-sent events, rendered by ``mesh chat``'s own pieces
   (``mesh._cli.progress``), until the task ends, asks a question, or ``TURN_DEADLINE_S``.

Events: ``progress`` (a line as ``mesh chat`` prints it: a call, another agent's progress,
indented per hop), ``text`` (a piece of the model's answer as it is written), ``answer`` (the
end, with what the task attached), ``question`` (the task waits: the next message answers it),
``problem`` (refused or failed: why), and ``end`` last (the contextId for the next turn).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from mesh._a2a.client import A2APeer
from mesh._a2a.results import TaskResult
from mesh._asks import TASKS_EXTENSION
from mesh._cli.progress import attached_lines, chat_progress_line, turn_answer
from mesh._cli.question import WAITING_STATES, parse_answer, question_lines, questions_of
from mesh._errors import ConfigError, MeshError
from registry.chats import Turn
from registry.console import operator_context, read_form
from registry.page import render
from registry.state import RegistryState, get_state
from registry.store import InstanceRecord

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_STREAMS",
    "PENDING_S",
    "TURN_DEADLINE_S",
    "router",
]

log = logging.getLogger("registry.chat")
router = APIRouter(include_in_schema=False)
State = Annotated[RegistryState, Depends(get_state)]

#: The longest message the page may send (characters).
MAX_MESSAGE_CHARS = 8_000
#: Chat streams open at once on this registry (each holds a call to a node).
MAX_STREAMS = 8
#: One turn's whole stream: past it the page is told, and the task goes on at the node.
TURN_DEADLINE_S = 120.0
#: How long a posted turn waits for its stream to be opened.
PENDING_S = 30.0
#: Ids the page echoes back (contextId, taskId): longer is not one.
_MAX_ID = 200
#: Each answer the node streams, whole, within this many bytes.
_MAX_ANSWER_BYTES = 4_000_000


def _event(name: str, **data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _refused(why: str, status: int) -> JSONResponse:
    return JSONResponse({"error": "refused", "message": why}, status_code=status)


@router.get("/agents/{name}/chat", response_class=HTMLResponse)
async def chat_page(request: Request, name: str, state: State) -> HTMLResponse:
    view = await state.catalog.agent(name)
    context: dict[str, Any] = {
        "title": f"chat with {name} · mesh registry",
        "q": "",
        "name": name,
        "found": view is not None,
        "max_chars": MAX_MESSAGE_CHARS,
        # Swapping the page every few seconds would swap the conversation away.
        "refresh": False,
        **operator_context(request, state),
    }
    return render(request, "chat.html", context, status=200 if view is not None else 404)


@router.post("/console/chat")
async def post_turn(request: Request, state: State) -> Response:
    form = await read_form(request)
    why = state.sessions.refusal(request, form.get("csrf", ""))
    if why is not None:
        log.warning("console chat refused: %s", why)
        return _refused(why, 403)
    agent, text = form.get("agent", "").strip(), form.get("text", "").strip()
    context_id = form.get("context_id", "").strip()[:_MAX_ID] or None
    task_id = form.get("task_id", "").strip()[:_MAX_ID] or None
    if not text:
        return _refused("text: the message is empty", 422)
    if len(text) > MAX_MESSAGE_CHARS:
        return _refused(
            f"text: {len(text)} characters; a chat message has at most {MAX_MESSAGE_CHARS}", 413
        )
    if await state.catalog.agent(agent) is None:
        return _refused(f"agent: no agent named {agent!r} is registered", 404)
    if state.chats.open >= MAX_STREAMS:
        return _refused(
            f"{MAX_STREAMS} chats are streaming on this registry already: try again when one ends",
            429,
        )
    session = state.sessions.of(request)
    assert session is not None  # refusal() checked it
    turn = Turn(agent, text, context_id, task_id, session.csrf, time.monotonic() + PENDING_S)
    turn_id = state.chats.post(turn)
    return JSONResponse({"stream": f"/console/chat/{turn_id}"})


@router.get("/console/chat/{turn_id}")
async def stream_turn(request: Request, turn_id: str, state: State) -> Response:
    session = state.sessions.of(request)
    turn = state.chats.take(turn_id, session.csrf) if session is not None else None
    if turn is None:
        return _refused("no such chat turn for this session (posted once, streamed once)", 404)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(_stream(state, turn), media_type="text/event-stream", headers=headers)


async def _instance(state: RegistryState, turn: Turn) -> InstanceRecord | None:
    """The trusted instance to talk to: the one that had the context, else a passing one."""
    found = [i for i, _ in await state.catalog.instances(agent=turn.agent, status="any")]
    trusted, _ = state.reach.split(found)
    before = state.chats.where(turn.context_id)
    trusted.sort(key=lambda i: (i.url.rstrip("/") != before, i.status != "passing"))
    return trusted[0] if trusted else None


async def _stream(state: RegistryState, turn: Turn) -> AsyncIterator[str]:
    if state.chats.open >= MAX_STREAMS:
        yield _event("problem", text=f"{MAX_STREAMS} chats are streaming already: try again")
        yield _event("end", context_id=turn.context_id or "")
        return
    state.chats.open += 1
    context_id = turn.context_id
    try:
        inst = await _instance(state, turn)
        if inst is None:
            yield _event(
                "problem",
                text=f"no instance of {turn.agent} the registry may talk to (see its page)",
            )
            yield _event("end", context_id=context_id or "")
            return
        reach = state.reach
        peer = A2APeer(
            reach.http, inst.url, headers=reach.headers, max_answer_bytes=_MAX_ANSWER_BYTES
        )
        log.info("console chat: a turn to %s at %s", turn.agent, inst.instance_id)
        events = _turn(peer, turn)
        deadline = asyncio.get_running_loop().time() + TURN_DEADLINE_S
        try:
            while True:
                # The deadline on each wait for the node, not around the yields: the page
                # reading slowly is not the node being late.
                try:
                    async with asyncio.timeout_at(deadline):
                        event = await anext(events)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    yield _event(
                        "problem",
                        text=f"no answer within {TURN_DEADLINE_S:.0f} s: the task goes on at "
                        f"{turn.agent} (see its recent tasks)",
                    )
                    break
                if isinstance(event, _Learnt):  # the next turn goes to the instance that has it
                    context_id = event.context_id
                    state.chats.remember(context_id, inst.url.rstrip("/"))
                else:
                    yield event
        except (MeshError, ValueError) as exc:  # ValueError: the SDK found no interface
            log.warning("console chat with %s failed: %s", turn.agent, exc)
            yield _event("problem", text=f"{turn.agent}: {exc}")
        finally:
            await events.aclose()
            await peer.aclose()
    finally:
        state.chats.open -= 1
    yield _event("end", context_id=context_id or "")


@dataclass(frozen=True)
class _Learnt:
    """The turn's contextId, once known: for the caller to keep, not an event."""

    context_id: str


async def _turn(peer: A2APeer, turn: Turn) -> AsyncGenerator[str | _Learnt, None]:
    """The SSE events of one turn, as ``mesh chat``'s turn shows it, and its contextId."""
    payload: dict[str, Any] | str = turn.text
    metadata: dict[str, Any] | None = None
    context_id = turn.context_id
    if turn.task_id is not None:  # an answer to the waiting task's first question
        waiting = await peer.get_task(turn.task_id)
        questions = questions_of(waiting)
        if waiting.state not in WAITING_STATES or not questions:
            yield _event("problem", text=f"task {turn.task_id} is {waiting.state}: not waiting")
            return
        question = questions[0]
        try:
            payload = parse_answer(turn.text, question)
        except ConfigError as exc:  # not sent: the same question waits for a better answer
            yield _event("problem", text=str(exc))
            yield _event("question", lines=[], task_id=waiting.task_id, question_id=question.id)
            return
        context_id = waiting.context_id or context_id
        if question.id:
            metadata = {TASKS_EXTENSION: {"answers": question.id}}
    streamed = ""
    task_id = turn.task_id
    stream = peer.stream(
        payload,
        context_id=context_id,
        task_id=turn.task_id,
        metadata=metadata,
        timeout=TURN_DEADLINE_S,
    )
    async for update in stream:
        task_id = update.task_id or task_id
        if update.context_id and update.context_id != context_id:
            context_id = update.context_id
            yield _Learnt(context_id)
        if update.kind == "message":  # a direct reply, no task
            shown = json.dumps(update.data) if update.data is not None else update.text
            yield _event("answer", text=shown, attached=[])
            return
        if update.partial and update.text:
            streamed += update.text
            yield _event("text", chunk=update.text)
        elif (line := chat_progress_line(update)) is not None:
            yield _event("progress", line=line)
    if not task_id:
        yield _event("answer", text="(no answer)", attached=[])
        return
    async for event in _ended(await peer.get_task(task_id), turn.agent, streamed):
        yield event


async def _ended(result: TaskResult, agent: str, streamed: str) -> AsyncIterator[str | _Learnt]:
    if result.context_id:
        yield _Learnt(result.context_id)
    if result.state in WAITING_STATES:
        question = questions_of(result)[0] if questions_of(result) else None
        yield _event(
            "question",
            lines=question_lines(result, agent),
            task_id=result.task_id,
            question_id=question.id if question else "",
        )
        return
    attached = attached_lines(result) if result.ok else []
    yield _event(
        "answer", text=turn_answer(result, streamed), attached=attached, state=result.state
    )
