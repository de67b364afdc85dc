"""``Runner``: executes an ``Agent``'s turns (the model/tool loop) against a session store.

    runner = Runner(loan_officer, sessions=SqliteSessionStore(db))
    result = await runner.run(user_id="u1", session_id="s1", message="Should we approve APP-612?")
    result.text, result.data, result.events, result.usage

    async for event in runner.run_stream(user_id="u1", session_id="s1", message="..."):
        print(event.author, event.partial, event.text)

One turn: the user's message becomes an event; then the model is called with the instruction,
the session history and the tool declarations. If it asks for tools, they run concurrently and
their results go back as one event; the loop goes on until the model answers without tool calls
(the ``final`` event), or ``agent.max_model_calls`` is reached (``MaxModelCallsExceeded``).
Every non-partial event is appended to the session as it happens, without waiting for its
commit (``durable=False``); the final answer's append waits, so the turn's writes share one
commit and a returned turn is stored.

A tool may return ``mesh.Ask``: the turn then stops with ``TurnSuspended`` (``mesh._pending``)
once the response's other calls finished, and ``resume`` goes on with the answers:

    try:
        result = await runner.run(user_id="u1", session_id="s1", message="Pay out 80,000")
    except TurnSuspended as waiting:
        print(waiting.questions[0].text)            # Pay out 80,000?
        result = await runner.resume(user_id="u1", session_id="s1", turn=waiting.turn,
                                     answers={waiting.questions[0].id: {"decision": "approve"}})
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from mesh._agent import Agent
from mesh._artifacts import ATTACHMENTS, Artifact
from mesh._asks import ChildRef, ChildWaiting, Question, relayed
from mesh._errors import (
    ConfigError,
    MaxModelCallsExceeded,
    MeshError,
    ModelError,
    RemoteError,
    RunError,
    SessionWaiting,
    StoreError,
    ToolError,
)
from mesh._events import Event, new_id
from mesh._models.base import Model, ModelRequest, ModelResponse, ToolDeclaration
from mesh._pending import WAITING_KEY, PendingCall, PendingTurn, TurnSuspended, question_id
from mesh._sessions.base import Session, SessionStore
from mesh._tools import (
    Ask,
    Tool,
    ToolContext,
    Toolset,
    as_tool,
    invoke_tool,
    jsonable,
    reset_current_context,
    set_current_context,
)
from mesh._types import Content, FunctionCall, FunctionResponse, Part, Usage

if TYPE_CHECKING:
    from mesh._settings import ModelSettings

__all__ = ["NullObserver", "RunObserver", "RunResult", "Runner", "SessionLocks", "WaitCheck"]

log = logging.getLogger("mesh._runner")

TOOL_AUTHOR = "tool"
#: The author of the content-less event that marks a session waiting (``WAITING_KEY``).
MESH_AUTHOR = "mesh"
#: Tool declarations a runner keeps built (``Runner._declaration``).
MAX_DECLARED = 256

#: Whether the task a session's ``WAITING_KEY`` names still waits (a node asks its store: a
#: task canceled or ended at its deadline leaves the mark behind).
WaitCheck = Callable[[str], Awaitable[bool]]
#: Whether a turn's model calls stream: always, never, or as a check says before each call.
_Streamed = bool | Callable[[], bool]


class RunObserver(Protocol):
    """Hooks for metrics; the node plugs Prometheus in. Must not raise (errors are logged)."""

    def on_model_call(self, model_name: str, seconds: float, usage: Usage | None, ok: bool) -> None:
        """One model response (streamed or not) finished, or failed (``ok=False``)."""
        ...

    def on_tool_call(self, tool_name: str, ok: bool) -> None:
        """One tool call finished; ``ok`` is False when the model got an error back."""
        ...

    def on_session_created(self) -> None:
        """A turn started a new session."""
        ...


class NullObserver:
    """The default ``RunObserver``: observes nothing."""

    def on_model_call(self, model_name: str, seconds: float, usage: Usage | None, ok: bool) -> None:
        pass

    def on_tool_call(self, tool_name: str, ok: bool) -> None:
        pass

    def on_session_created(self) -> None:
        pass


class SessionLocks:
    """Serialises the turns of each session. Runners that share a session store (a node's chat
    runner and its typed-skill runners) share one, so their turns never interleave events."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        """Sessions with a turn running or waiting."""
        return len(self._held)

    def busy(self, user_id: str, session_id: str) -> bool:
        """A turn of this session is running or waiting for it."""
        return (user_id, session_id) in self._held

    def turns(self, user_id: str, session_id: str) -> int:
        """Turns of this session running or waiting for it."""
        held = self._held.get((user_id, session_id))
        return held[1][0] if held else 0

    def hold(self, user_id: str, session_id: str) -> _Held:
        """``async with locks.hold(user, session):`` the session's turn runs alone."""
        return _Held(self._held, (user_id, session_id))


class _Held:
    """One hold of a session's lock (``SessionLocks.hold``): a plain async context manager,
    not a generator's, since every turn takes one."""

    __slots__ = ("_held", "_key")

    def __init__(
        self, held: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]], key: tuple[str, str]
    ) -> None:
        self._held = held
        self._key = key

    async def __aenter__(self) -> None:
        lock, users = self._held.setdefault(self._key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            await lock.acquire()
        except BaseException:
            self._leave(users)
            raise

    async def __aexit__(self, *exc: object) -> None:
        lock, users = self._held[self._key]
        lock.release()
        self._leave(users)

    def _leave(self, users: list[int]) -> None:
        users[0] -= 1
        if users[0] == 0:  # nobody waits: forget the lock, the dict stays small
            del self._held[self._key]


@dataclass(frozen=True)
class RunResult:
    """The outcome of one turn.

    ``events`` are those the turn produced after the user's message (model and tool events, no
    partial ones); ``usage`` sums the turn's model responses; ``data`` is the answer parsed as
    JSON when a ``response_schema`` was given (None if it did not parse); streaming consumers
    find the same value in the final event's ``metadata["data"]``. ``artifacts``: what the
    turn's tools attached (``ToolContext.attach``), in order.
    """

    text: str
    data: Any
    events: list[Event]
    usage: Usage
    session_id: str
    artifacts: list[Artifact] = field(default_factory=list)


#: A turn's usage before its first model response (``_plus``: the first one is taken as is).
_NO_USAGE = Usage()


def _plus(total: Usage, usage: Usage) -> Usage:
    """``total + usage``, without building a sum for the first response."""
    return usage if total is _NO_USAGE else total + usage


@dataclass
class _Turn:
    events: list[Event] = field(default_factory=list)
    usage: Usage = _NO_USAGE
    final: Event | None = None
    session_id: str = ""
    attached: list[Artifact] = field(default_factory=list)

    def meta(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        """The turn's metadata; the list its tools attach to is the caller's when it gives
        one (``metadata[ATTACHMENTS]``: a node publishes them), kept out of the tools' view."""
        meta = dict(metadata or {})
        sink = meta.pop(ATTACHMENTS, None)
        if isinstance(sink, list):
            self.attached = sink
        return meta


class Runner:
    """Runs an LLM ``Agent``. One runner serves many users and sessions concurrently.

    ``model`` overrides ``agent.model``; otherwise the agent's model is resolved with
    ``mesh._models.resolve_model(agent, env)``: ``env`` is the model settings (a node passes its
    own), or a mapping of variables, or None for the process environment (read once per
    process: a script is its own edge). ``sessions``
    defaults to an ``InMemorySessionStore``. Turns of the same session are serialised.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        sessions: SessionStore | None = None,
        model: Model | None = None,
        observer: RunObserver | None = None,
        env: ModelSettings | Mapping[str, str] | None = None,
        locks: SessionLocks | None = None,
    ) -> None:
        if not agent.is_llm:
            raise ConfigError(
                f"agent {agent.name!r} has no model or instruction: it has nothing for a Runner "
                "to run (its skills are plain functions)"
            )
        self.agent = agent
        if sessions is None:
            from mesh._sessions.memory import InMemorySessionStore

            sessions = InMemorySessionStore()
        self.sessions: SessionStore = sessions
        if model is None:
            from mesh._models import resolve_model

            model = resolve_model(agent, env)
        self.model = model
        self.observer: RunObserver = observer or NullObserver()
        # Plain functions become FunctionTools now, so a bad signature fails at start-up.
        self._items: list[Tool | Toolset] = [
            item if isinstance(item, Tool | Toolset) else as_tool(item) for item in agent.tools
        ]
        # Which items are tools (the rest expand per turn), decided once: ``isinstance`` on a
        # runtime-checkable Protocol walks its members on every call (~10 us a turn).
        self._expand: list[tuple[Tool] | Toolset] = [
            (item,) if isinstance(item, Tool) else item for item in self._items
        ]
        self.locks = locks if locks is not None else SessionLocks()
        # Tool declarations by the tool's id (``_declaration``), bounded.
        self._declared: dict[int, tuple[Tool, dict[str, Any], ToolDeclaration]] = {}
        from mesh._sessions.memory import InMemorySessionStore

        if isinstance(sessions, InMemorySessionStore) and sessions.in_use is None:
            # Its bounds never evict a session with a turn of this runner in it.
            sessions.in_use = self.locks.busy

    async def run(
        self,
        *,
        user_id: str,
        session_id: str | None,
        message: str | Content,
        response_schema: dict[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        waiting: WaitCheck | None = None,
        new_session: bool = False,
    ) -> RunResult:
        """Run one turn to its final answer (no streaming). ``session_id=None`` starts a new one,
        and so does ``new_session=True`` with the caller's id (see ``run_stream``).

        Raises ``ModelError`` when the model fails, ``MaxModelCallsExceeded`` when the model
        never stops calling tools, ``StoreError`` when the session cannot be stored,
        ``TurnSuspended`` when a tool asked (``resume`` goes on), ``SessionWaiting`` when the
        session's last turn still waits for an answer (``waiting``: see ``run_stream``).
        """
        turn = _Turn()
        steps = self._turn(
            turn,
            user_id,
            session_id,
            message,
            response_schema,
            metadata,
            waiting,
            stream=False,
            new_session=new_session,
        )
        return await self._collect(turn, steps, response_schema)

    def run_stream(
        self,
        *,
        user_id: str,
        session_id: str | None,
        message: str | Content,
        response_schema: dict[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        waiting: WaitCheck | None = None,
        live: Callable[[], bool] | None = None,
        new_session: bool = False,
    ) -> AsyncIterator[Event]:
        """Run one turn with a streaming model, yielding events as they happen.

        Partial events (``partial=True``, text as it arrives, no usage, not stored) come before
        the complete model event they belong to. The last event has ``final=True``. A consumer
        that may stop early should close the iterator (``contextlib.aclosing``): the turn is
        abandoned and the session is released.

        A session whose last turn waits for an answer takes no new turn (``SessionWaiting``,
        nothing stored). ``waiting(task_id)`` says whether the task that turn belongs to still
        waits (a node asks its task store: a task canceled meanwhile does not block its
        context); without it the session's mark alone decides.

        ``live()``, asked before each model call, says whether anyone reads partial events
        now: when it says no, that call's answer is asked for whole (``Model.generate``) and
        yields none (a node passes whether someone follows the task). None: always streamed.

        ``new_session=True``: the caller made ``session_id`` itself just now (a node, for a
        message without a context id), so no session has it: the turn creates it without
        reading the store first (as it does for ``session_id=None``).
        """
        # The turn's own generator: closing it promptly releases the session lock.
        return self._turn(
            _Turn(),
            user_id,
            session_id,
            message,
            response_schema,
            metadata,
            waiting,
            new_session=new_session,
            stream=True if live is None else live,
        )

    async def resume(
        self,
        *,
        user_id: str,
        session_id: str,
        turn: PendingTurn,
        answers: Mapping[str, Any],
        response_schema: dict[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Go on with a turn that stopped with ``TurnSuspended``: each answer (by question id)
        becomes its call's response ``{"result": answer}``; once every call has one, they go
        to the session as one tool event (with the state the tools wrote) and the model loop
        continues where it stopped (``max_model_calls`` counts the turn's calls before it).

        An answer is checked against its question's JSON Schema first (``SchemaViolation``
        naming the field, nothing stored). Questions still without an answer raise
        ``TurnSuspended`` again, with the calls answered so far. A turn whose answers were
        stored already (a node that stopped after that) goes on from the session as it is.
        """
        result = _Turn()
        steps = self._resume(
            result, user_id, session_id, turn, answers, response_schema, metadata, stream=False
        )
        return await self._collect(result, steps, response_schema)

    def resume_stream(
        self,
        *,
        user_id: str,
        session_id: str,
        turn: PendingTurn,
        answers: Mapping[str, Any],
        response_schema: dict[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        live: Callable[[], bool] | None = None,
    ) -> AsyncIterator[Event]:
        """``resume`` with a streaming model, yielding events as ``run_stream`` does (``live``
        as there)."""
        return self._resume(
            _Turn(),
            user_id,
            session_id,
            turn,
            answers,
            response_schema,
            metadata,
            stream=True if live is None else live,
        )

    async def cancel_children(self, turn: PendingTurn) -> None:
        """CancelTask for every child task ``turn`` still waits on (its task was canceled, or
        its deadline passed): concurrently, each bounded by the remote toolset; never raises.
        The children cancel their own children in turn."""

        async def one(child: ChildRef) -> None:
            for item in self._items:
                owns = getattr(item, "owns", None)
                if owns is not None and owns(child):
                    await item.cancel_child(child)  # type: ignore[union-attr]
                    return

        await asyncio.gather(*(one(c) for c in turn.children), return_exceptions=True)

    async def aclose(self) -> None:
        """Close the model's connections (the session store belongs to whoever passed it)."""
        await self.model.aclose()

    # -- the loop ---------------------------------------------------------------------------

    async def _turn(
        self,
        turn: _Turn,
        user_id: str,
        session_id: str | None,
        message: str | Content,
        response_schema: dict[str, Any] | None,
        metadata: Mapping[str, Any] | None,
        waiting: WaitCheck | None,
        *,
        stream: _Streamed,
        new_session: bool = False,
    ) -> AsyncGenerator[Event, None]:
        content = _user_content(message)
        new_session = new_session or not session_id
        session_id = session_id or new_id()
        turn.session_id = session_id
        invocation_id = new_id()
        meta = turn.meta(metadata)
        async with self.locks.hold(user_id, session_id):
            session = await self._load(user_id, session_id, new=new_session)
            try:
                cleared = await self._not_waiting(session, waiting)
                session = await self.sessions.append_event(
                    session,
                    Event(
                        invocation_id=invocation_id,
                        author="user",
                        content=content,
                        state_delta=cleared,
                    ),
                    durable=False,
                )
                task_id = str(meta.get("task_id") or invocation_id)
                steps = self._loop(
                    turn, session, invocation_id, task_id, meta, response_schema, stream
                )
                async with contextlib.aclosing(steps):
                    async for event in steps:
                        yield event
            except BaseException:
                await self._settle(session, failed=True)
                raise
            await self._settle(session, failed=False)

    async def _resume(
        self,
        turn: _Turn,
        user_id: str,
        session_id: str,
        pending: PendingTurn,
        answers: Mapping[str, Any],
        response_schema: dict[str, Any] | None,
        metadata: Mapping[str, Any] | None,
        *,
        stream: _Streamed,
    ) -> AsyncGenerator[Event, None]:
        turn.session_id = session_id
        meta = turn.meta(metadata)
        async with self.locks.hold(user_id, session_id):
            session = await self.sessions.get(user_id, session_id)
            if session is None:
                raise RunError(
                    f"no session {session_id!r} of user {user_id!r}: the turn of task "
                    f"{pending.task_id} cannot go on"
                )
            inv = pending.invocation_id
            if session.state.get(WAITING_KEY) == pending.task_id:
                checked = pending.checked(answers)
                filled = await self._forward(pending.answered(checked), checked, session, meta)
                if filled.waiting:
                    raise TurnSuspended(filled)  # nothing changed in the session
                tool_event = self._tool_event(filled.calls, inv, {WAITING_KEY: None})
                session = await self.sessions.append_event(session, tool_event, durable=False)
                turn.events.append(tool_event)
                yield tool_event
            elif not _answered_in(session, pending):
                raise RunError(
                    f"session {session_id!r} has no turn of task {pending.task_id} waiting: it "
                    "was answered already, or canceled"
                )
            else:
                # The answers were stored before a stop: the session says how far it got.
                done = [e for e in session.events if e.invocation_id == inv and e.final]
                if done:
                    turn.final = done[-1]
                    turn.events.append(done[-1])
                    yield done[-1]
                    return
            steps = self._loop(turn, session, inv, pending.task_id, meta, response_schema, stream)
            try:
                async with contextlib.aclosing(steps):
                    async for event in steps:
                        yield event
            except BaseException:
                await self._settle(session, failed=True)
                raise
            await self._settle(session, failed=False)

    async def _settle(self, session: Session, *, failed: bool) -> None:
        """The turn's queued session writes stored (one wait for all of them, at its end;
        usually its last append waited already). A turn that failed keeps its own error."""
        if not failed:
            await self.sessions.sync(session)
            return
        try:
            await self.sessions.sync(session)
        except Exception:
            log.exception("session %s: storing the failed turn's events failed", session.id)

    async def _not_waiting(self, session: Session, waiting: WaitCheck | None) -> dict[str, Any]:
        """Raise ``SessionWaiting`` when the session's last turn still waits; the state delta
        that clears a mark left behind (its task was canceled, or ended) otherwise."""
        task = session.state.get(WAITING_KEY)
        if not task:
            return {}
        task_id = str(task)
        if waiting is None or await waiting(task_id):
            raise SessionWaiting(
                f"context {session.id} has task {task_id} waiting for input; answer it (a "
                f"message with taskId {task_id}) or cancel it",
                task_id=task_id,
            )
        return {WAITING_KEY: None}

    async def _loop(
        self,
        turn: _Turn,
        session: Session,
        invocation_id: str,
        task_id: str,
        meta: dict[str, Any],
        response_schema: dict[str, Any] | None,
        stream: _Streamed,
    ) -> AsyncGenerator[Event, None]:
        """The model/tool loop of a turn whose session ends with a user message or a tool
        event; the turn's model calls stored so far count against ``max_model_calls``."""
        base_ctx = ToolContext(
            agent_name=self.agent.name,
            user_id=session.user_id,
            session_id=session.id,
            invocation_id=invocation_id,
            session_state=MappingProxyType(session.state),
            metadata=meta,
            attachments=turn.attached,
        )
        tools = await self._tools(base_ctx)
        declarations = tuple(self._declaration(t) for t in tools.values())
        limit = self.agent.max_model_calls
        made = sum(
            1
            for e in session.events
            if e.invocation_id == invocation_id and e.author == self.agent.name
        )
        calls: list[FunctionCall] = []
        # Read from the session once; the loop adds what it appends (well-formed: a response's
        # calls and then their responses).
        history = _history(session)
        while made < limit:
            made += 1
            # A store may hand back a new Session object: keep the context's view current.
            base_ctx.session_state = MappingProxyType(session.state)
            request = ModelRequest(
                system_instruction=self.agent.instruction,
                contents=history,
                tools=declarations,
                response_schema=response_schema,
                temperature=self.agent.temperature,
            )
            response: ModelResponse | None = None
            if stream() if callable(stream) else stream:
                async for item in self._stream_model(request, base_ctx):
                    if isinstance(item, Event):
                        yield item
                    else:
                        response = item
                assert response is not None  # _stream_model always ends with a response
            else:
                response = await self._generate(request, base_ctx)
            if response.usage is not None:
                turn.usage = _plus(turn.usage, response.usage)
            calls = response.content.function_calls
            event_meta: dict[str, Any] = {}
            if response.finish_reason:
                event_meta["finish_reason"] = response.finish_reason
            if not calls and response_schema is not None:
                # Streaming consumers read the structured answer from the final event.
                data = _parse_json(response.content.text)
                if data is not None:
                    event_meta["data"] = data
            model_event = Event(
                invocation_id=invocation_id,
                author=self.agent.name,
                content=response.content,
                usage=response.usage,
                model=response.model_version or self.model.name,
                final=not calls,
                metadata=event_meta,
                state_delta=jsonable(response.state_delta),
            )
            # The final answer waits for the turn's writes (one commit for all of them).
            session = await self.sessions.append_event(session, model_event, durable=not calls)
            turn.events.append(model_event)
            yield model_event
            if not calls:
                turn.final = model_event
                return
            done = await self._run_tools(calls, tools, session, base_ctx)
            if any(c.response is None for c in done):
                if made < limit:
                    # No tool event while a call waits: the mark, then the caller keeps the
                    # rest (a node: in the task's resume point) until the answers come.
                    mark = Event(
                        invocation_id=invocation_id,
                        author=MESH_AUTHOR,
                        state_delta={WAITING_KEY: task_id},
                    )
                    session = await self.sessions.append_event(session, mark)
                    raise TurnSuspended(PendingTurn(task_id, invocation_id, tuple(done)))
                # The model could not read an answer anyway: nobody is asked in vain.
                done = [c.not_asked(limit) if c.response is None else c for c in done]
            tool_event = self._tool_event(done, invocation_id, {})
            session = await self.sessions.append_event(session, tool_event, durable=False)
            turn.events.append(tool_event)
            assert tool_event.content is not None
            history = (*history, response.content, tool_event.content)
            yield tool_event
        # The last response still asked for tools. They ran, but the model will not see
        # their results in this turn; the history stays well-formed for the next one.
        raise MaxModelCallsExceeded(
            f"agent {self.agent.name!r} reached max_model_calls={limit} without a final "
            f"answer (it kept calling tools, last: {sorted({c.name for c in calls})}); "
            "raise Agent(max_model_calls=...) or make the tools return what the model needs"
        )

    async def _generate(self, request: ModelRequest, ctx: ToolContext) -> ModelResponse:
        """One model call nobody reads partial text of (``Model.generate``): a plain await,
        not a generator of one item."""
        started = time.perf_counter()
        try:
            token = set_current_context(ctx)
            try:
                response = await self.model.generate(request)
            finally:
                reset_current_context(token)
        except MeshError:
            self._observe_model(started, None, ok=False)
            raise
        except Exception as exc:
            raise self._model_failed(started, exc) from exc
        self._observe_model(started, response.usage, ok=True)
        return response

    async def _stream_model(
        self, request: ModelRequest, ctx: ToolContext
    ) -> AsyncGenerator[Event | ModelResponse, None]:
        """Yield partial events as the model streams, then the one complete response."""
        started = time.perf_counter()
        response: ModelResponse | None = None
        try:
            chunks = self.model.stream(request)
            try:
                while True:
                    token = set_current_context(ctx)
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    finally:
                        reset_current_context(token)
                    if not chunk.partial:
                        response = chunk
                        break
                    # Partial chunks may carry running usage totals: never counted.
                    yield Event(
                        invocation_id=ctx.invocation_id,
                        author=self.agent.name,
                        content=chunk.content,
                        model=self.model.name,
                        partial=True,
                    )
            finally:
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:
                    await aclose()
            if response is None:
                raise ModelError(
                    f"model {self.model.name!r} ended its stream without a final response"
                )
        except MeshError:
            self._observe_model(started, None, ok=False)
            raise
        except Exception as exc:
            raise self._model_failed(started, exc) from exc
        self._observe_model(started, response.usage, ok=True)
        yield response

    def _model_failed(self, started: float, exc: Exception) -> ModelError:
        """Observe a model call that failed with ``exc`` (not a ``MeshError``): the error to
        raise. A model implementation should translate its SDK's errors; this is the backstop."""
        self._observe_model(started, None, ok=False)
        return ModelError(f"model {self.model.name!r} failed: {exc!r}")

    async def _run_tools(
        self,
        calls: Sequence[FunctionCall],
        tools: Mapping[str, Tool],
        session: Session,
        base: ToolContext,
    ) -> list[PendingCall]:
        """Run one response's calls concurrently. Each comes back answered, or waiting on the
        question its tool asked (``Ask``)."""

        async def run_one(call: FunctionCall) -> PendingCall:
            ctx = ToolContext(
                agent_name=base.agent_name,
                user_id=base.user_id,
                session_id=base.session_id,
                invocation_id=base.invocation_id,
                session_state=MappingProxyType(session.state),
                # A copy per call: tools may add keys without seeing each other's.
                metadata=dict(base.metadata),
                attachments=base.attachments,
            )
            target = tools.get(call.name)
            if target is None:
                result: dict[str, Any] | Ask = {
                    "error": {
                        "type": "unknown_tool",
                        "message": f"there is no tool named {call.name!r}; "
                        f"available: {sorted(tools) or 'none'}",
                    }
                }
            else:
                try:
                    result = await invoke_tool(target, dict(call.args), ctx)
                except ChildWaiting as waiting:
                    # A remote skill's task waits for input: the call waits on its questions.
                    self._notify("on_tool_call", call.name, True)
                    return PendingCall(
                        call.id,
                        call.name,
                        None,
                        ctx.state_delta,
                        child=waiting.child,
                        relayed=relayed(waiting.child, waiting.questions),
                    )
            if isinstance(result, Ask):
                try:
                    question = result.to_question(question_id(base.invocation_id, call.id))
                except Exception as exc:  # a schema pydantic cannot write as JSON Schema
                    result = {"error": {"type": "invalid_ask", "message": f"cannot ask: {exc}"}}
                else:
                    self._notify("on_tool_call", call.name, True)
                    return PendingCall(call.id, call.name, None, ctx.state_delta, question)
            ok = "error" not in result
            # A name the model invented is not a label: the model's input is the caller's.
            self._notify("on_tool_call", call.name if target is not None else "other", ok)
            # A failed tool's writes are dropped: its state change did not happen.
            return PendingCall(call.id, call.name, result, ctx.state_delta if ok else {})

        if len(calls) == 1:
            # One call: nothing runs beside it, so no task of its own (a task, a TaskGroup
            # and a loop iteration less a turn; docs/runtime.md "Tools").
            return [await run_one(calls[0])]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run_one(call)) for call in calls]
        return [task.result() for task in tasks]

    async def _forward(
        self,
        pending: PendingTurn,
        answers: Mapping[str, Any],
        session: Session,
        meta: Mapping[str, Any],
    ) -> PendingTurn:
        """Forward each answer to a question relayed from a child task down to that child
        (the remote tool's ``forward``; several children at once, concurrently), and follow
        each long-running child that asks nothing (the tool's ``follow``). The child's reply
        settles the call: its result, a tool error, or new questions to relay."""
        # One forward per call: a child waiting on several questions (its own children's)
        # takes the answer to one of them at a time, whichever was answered.
        calls: list[tuple[PendingCall, Question | None]] = [
            (c, answered[0])
            for c in pending.calls
            if c.response is None and c.child is not None
            if (answered := [q for q in c.relayed if q.id in answers])
        ]
        # A long-running child asks nothing: it is followed (re-attached after a restart).
        calls += [
            (c, None)
            for c in pending.calls
            if c.response is None and c.child is not None and not c.relayed
        ]
        if not calls:
            return pending
        base = ToolContext(
            agent_name=self.agent.name,
            user_id=session.user_id,
            session_id=session.id,
            invocation_id=pending.invocation_id,
            session_state=MappingProxyType(session.state),
            metadata=dict(meta),
        )
        tools = await self._tools(base)

        async def one(call: PendingCall, question: Question | None) -> PendingCall:
            assert call.child is not None
            forward = getattr(tools.get(call.name), "forward" if question else "follow", None)
            if forward is None:
                return _not_forwarded(call, f"tool {call.name!r} is not declared this turn")
            ctx = ToolContext(
                agent_name=base.agent_name,
                user_id=base.user_id,
                session_id=base.session_id,
                invocation_id=base.invocation_id,
                session_state=base.session_state,
                metadata=dict(meta),
            )
            token = set_current_context(ctx)
            try:
                if question is None:
                    value = await forward(call.child, ctx)
                else:
                    hop = question.path[0] if question.path else {}
                    value = await forward(
                        call.child,
                        hop.get("question", ""),
                        answers[question.id],
                        ctx,
                        call.forwards,
                    )
            except ChildWaiting as waiting:
                again = relayed(waiting.child, waiting.questions)
                return replace(call, child=waiting.child, relayed=again, forwards=call.forwards + 1)
            except RemoteError as exc:
                if exc.reason != "unavailable" or question is None:
                    response = exc.to_result()  # a followed child: its end, or its deadline
                else:  # the child is not lost, only out of reach now: the question stays open
                    return _not_forwarded(call, str(exc))
            except ToolError as exc:
                response = exc.to_result()
            except Exception as exc:
                response = {"error": {"type": type(exc).__name__, "message": str(exc) or repr(exc)}}
            else:
                response = {"result": jsonable(value)}
            finally:
                reset_current_context(token)
            ok = "error" not in response
            self._notify("on_tool_call", call.name, ok)
            delta = {**call.state_delta, **ctx.state_delta} if ok else call.state_delta
            return replace(call, response=response, state_delta=delta)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(c, q)) for c, q in calls]
        for task in tasks:
            pending = pending.replaced(task.result())
        return pending

    @staticmethod
    def _tool_event(
        calls: Sequence[PendingCall], invocation_id: str, extra: Mapping[str, Any]
    ) -> Event:
        """The responses of one model response's calls as one event, in call order, with the
        state they wrote (a later call's key wins) and ``extra``."""
        delta: dict[str, Any] = {}
        for call in calls:
            delta.update(call.state_delta)
        delta.update(extra)
        return Event(
            invocation_id=invocation_id,
            author=TOOL_AUTHOR,
            content=Content(
                role="user",
                parts=tuple(
                    Part(
                        function_response=FunctionResponse(
                            id=c.id, name=c.name, response=c.response or {}
                        )
                    )
                    for c in calls
                ),
            ),
            state_delta=jsonable(delta),
        )

    # -- helpers ----------------------------------------------------------------------------

    async def _load(self, user_id: str, session_id: str, *, new: bool = False) -> Session:
        """The session, created when absent. ``new``: its id was made for this turn, so it is
        known absent without a read (one store round trip less per turn)."""
        session = None if new else await self.sessions.get(user_id, session_id)
        if session is not None:
            return session
        try:
            # Absent a moment ago, under this session's lock: stored with the turn's writes.
            session = await self.sessions.create(user_id, session_id, durable=False)
        except StoreError:
            # Created meanwhile by another runner on the same store.
            again = await self.sessions.get(user_id, session_id)
            if again is None:
                raise
            return again
        self._notify("on_session_created")
        return session

    def _declaration(self, tool: Tool) -> ToolDeclaration:
        """What the model sees of ``tool``: built once while it is the same object with the
        same name, description and parameters (every model call of every turn sends it)."""
        params = tool.parameters
        known = self._declared.get(id(tool))
        if (
            known is not None
            and known[0] is tool  # the cache holds it: no other object has its id
            and known[1] is params
            and known[2].name == tool.name
            and known[2].description == tool.description
        ):
            return known[2]
        declared = ToolDeclaration(name=tool.name, description=tool.description, parameters=params)
        if len(self._declared) >= MAX_DECLARED:
            self._declared.clear()
        self._declared[id(tool)] = (tool, params, declared)
        return declared

    async def _tools(self, ctx: ToolContext) -> dict[str, Tool]:
        tools: dict[str, Tool] = {}
        for item in self._expand:
            expanded = item if isinstance(item, tuple) else await item.tools(ctx)
            for t in expanded:
                if t.name in tools:
                    raise ConfigError(
                        f"agent {self.agent.name!r} has two tools named {t.name!r}; "
                        "rename one (@tool(name=...))"
                    )
                tools[t.name] = t
        return tools

    def _observe_model(self, started: float, usage: Usage | None, *, ok: bool) -> None:
        self._notify("on_model_call", self.model.name, time.perf_counter() - started, usage, ok)

    def _notify(self, hook: str, *args: Any) -> None:
        try:
            getattr(self.observer, hook)(*args)
        except Exception:
            log.exception("run observer %s failed", hook)

    @staticmethod
    async def _collect(
        turn: _Turn, steps: AsyncGenerator[Event, None], response_schema: dict[str, Any] | None
    ) -> RunResult:
        """Run a turn's steps to the end (``run``, ``resume``): its result."""
        async with contextlib.aclosing(steps):
            async for _ in steps:
                pass
        text = turn.final.text if turn.final else ""
        data = (
            turn.final.metadata.get("data") if turn.final and response_schema is not None else None
        )
        return RunResult(
            text=text,
            data=data,
            events=turn.events,
            usage=turn.usage,
            session_id=turn.session_id,
            artifacts=list(turn.attached),
        )


def _not_forwarded(call: PendingCall, why: str) -> PendingCall:
    """The call still waits, its questions open again saying why the answer did not reach the
    child (the caller sends it again; the re-sent answer is forwarded with the same id)."""
    problem = {
        "field": "(answer)",
        "message": f"not forwarded to the task that asks: {why}; send the answer again later",
    }
    questions = tuple(replace(q, invalid=(problem,)) for q in call.relayed)
    return replace(call, relayed=questions, forwards=call.forwards + 1)


def _user_content(message: str | Content) -> Content:
    if isinstance(message, str):
        return Content.user(message)
    if message.role != "user":
        raise ConfigError(f"a turn starts with a user message, got role {message.role!r}")
    return message


def _history(session: Session) -> tuple[Content, ...]:
    contents = [
        e.content
        for e in session.events
        if e.content is not None and e.content.parts and not e.partial
    ]
    # Calls whose responses never came (their task was canceled while a tool asked, or the
    # node stopped mid-call) are left out: a model refuses a call without its response.
    return tuple(
        c
        for i, c in enumerate(contents)
        if not c.function_calls or (i + 1 < len(contents) and contents[i + 1].function_responses)
    )


def _answered_in(session: Session, pending: PendingTurn) -> bool:
    """Whether the session holds the responses of the turn's calls (stored by a resume)."""
    ids = {c.id for c in pending.calls}
    return any(
        e.invocation_id == pending.invocation_id and ids <= {r.id for r in e.function_responses}
        for e in session.events
    )


def _parse_json(text: str) -> Any:
    body = text.strip()
    if body.startswith("```"):
        # Models sometimes fence JSON even when asked for JSON only.
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    try:
        return json.loads(body)
    except ValueError:
        return None
