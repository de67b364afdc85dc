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
Every non-partial event is appended to the session as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from mesh._agent import Agent
from mesh._errors import ConfigError, MaxModelCallsExceeded, MeshError, ModelError, StoreError
from mesh._events import Event, new_id
from mesh._models.base import Model, ModelRequest, ModelResponse, ToolDeclaration
from mesh._sessions.base import Session, SessionStore
from mesh._tools import (
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

__all__ = ["NullObserver", "RunObserver", "RunResult", "Runner", "SessionLocks"]

log = logging.getLogger("mesh._runner")

TOOL_AUTHOR = "tool"


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

    def turns(self, user_id: str, session_id: str) -> int:
        """Turns of this session running or waiting for it."""
        held = self._held.get((user_id, session_id))
        return held[1][0] if held else 0

    @contextlib.asynccontextmanager
    async def hold(self, user_id: str, session_id: str) -> AsyncIterator[None]:
        key = (user_id, session_id)
        lock, users = self._held.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:  # nobody waits: forget the lock, the dict stays small
                del self._held[key]


@dataclass(frozen=True)
class RunResult:
    """The outcome of one turn.

    ``events`` are those the turn produced after the user's message (model and tool events, no
    partial ones); ``usage`` sums the turn's model responses; ``data`` is the answer parsed as
    JSON when a ``response_schema`` was given (None if it did not parse); streaming consumers
    find the same value in the final event's ``metadata["data"]``.
    """

    text: str
    data: Any
    events: list[Event]
    usage: Usage
    session_id: str


@dataclass
class _Turn:
    events: list[Event] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    final: Event | None = None
    session_id: str = ""


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
        self.locks = locks if locks is not None else SessionLocks()

    async def run(
        self,
        *,
        user_id: str,
        session_id: str | None,
        message: str | Content,
        response_schema: dict[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Run one turn to its final answer (no streaming). ``session_id=None`` starts a new one.

        Raises ``ModelError`` when the model fails, ``MaxModelCallsExceeded`` when the model
        never stops calling tools, ``StoreError`` when the session cannot be stored.
        """
        turn = _Turn()
        steps = self._turn(
            turn, user_id, session_id, message, response_schema, metadata, stream=False
        )
        async with contextlib.aclosing(steps):
            async for _ in steps:
                pass
        return self._result(turn, response_schema)

    async def run_stream(
        self,
        *,
        user_id: str,
        session_id: str | None,
        message: str | Content,
        response_schema: dict[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Event]:
        """Run one turn with a streaming model, yielding events as they happen.

        Partial events (``partial=True``, text as it arrives, no usage, not stored) come before
        the complete model event they belong to. The last event has ``final=True``. A consumer
        that may stop early should close the iterator (``contextlib.aclosing``): the turn is
        abandoned and the session is released.
        """
        turn = _Turn()
        steps = self._turn(
            turn, user_id, session_id, message, response_schema, metadata, stream=True
        )
        # Closing promptly releases the session lock when a consumer stops early.
        async with contextlib.aclosing(steps):
            async for event in steps:
                yield event

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
        *,
        stream: bool,
    ) -> AsyncGenerator[Event, None]:
        content = _user_content(message)
        session_id = session_id or new_id()
        turn.session_id = session_id
        invocation_id = new_id()
        meta = dict(metadata or {})
        async with self.locks.hold(user_id, session_id):
            session = await self._load(user_id, session_id)
            session = await self.sessions.append_event(
                session, Event(invocation_id=invocation_id, author="user", content=content)
            )
            base_ctx = ToolContext(
                agent_name=self.agent.name,
                user_id=user_id,
                session_id=session_id,
                invocation_id=invocation_id,
                session_state=MappingProxyType(session.state),
                metadata=meta,
            )
            tools = await self._tools(base_ctx)
            declarations = tuple(
                ToolDeclaration(name=t.name, description=t.description, parameters=t.parameters)
                for t in tools.values()
            )
            limit = self.agent.max_model_calls
            for _ in range(limit):
                # A store may hand back a new Session object: keep the context's view current.
                base_ctx.session_state = MappingProxyType(session.state)
                request = ModelRequest(
                    system_instruction=self.agent.instruction,
                    contents=_history(session),
                    tools=declarations,
                    response_schema=response_schema,
                    temperature=self.agent.temperature,
                )
                response: ModelResponse | None = None
                async for item in self._call_model(request, base_ctx, stream=stream):
                    if isinstance(item, Event):
                        yield item
                    else:
                        response = item
                assert response is not None  # _call_model always ends with a response
                if response.usage is not None:
                    turn.usage = turn.usage + response.usage
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
                session = await self.sessions.append_event(session, model_event)
                turn.events.append(model_event)
                yield model_event
                if not calls:
                    turn.final = model_event
                    return
                tool_event = await self._run_tools(calls, tools, session, base_ctx)
                session = await self.sessions.append_event(session, tool_event)
                turn.events.append(tool_event)
                yield tool_event
            # The last response still asked for tools. They ran, but the model will not see
            # their results in this turn; the history stays well-formed for the next one.
            raise MaxModelCallsExceeded(
                f"agent {self.agent.name!r} reached max_model_calls={limit} without a final "
                f"answer (it kept calling tools, last: {sorted({c.name for c in calls})}); "
                "raise Agent(max_model_calls=...) or make the tools return what the model needs"
            )

    async def _call_model(
        self, request: ModelRequest, ctx: ToolContext, *, stream: bool
    ) -> AsyncGenerator[Event | ModelResponse, None]:
        """Yield partial events (streaming), then the one complete response."""
        started = time.perf_counter()
        response: ModelResponse | None = None
        try:
            if not stream:
                token = set_current_context(ctx)
                try:
                    response = await self.model.generate(request)
                finally:
                    reset_current_context(token)
            else:
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
            # A model implementation should translate its SDK's errors; this is the backstop.
            self._observe_model(started, None, ok=False)
            raise ModelError(f"model {self.model.name!r} failed: {exc!r}") from exc
        self._observe_model(started, response.usage, ok=True)
        yield response

    async def _run_tools(
        self,
        calls: Sequence[FunctionCall],
        tools: Mapping[str, Tool],
        session: Session,
        base: ToolContext,
    ) -> Event:
        """Run one response's calls concurrently; their results become one event."""

        async def run_one(call: FunctionCall) -> tuple[FunctionResponse, dict[str, Any]]:
            ctx = ToolContext(
                agent_name=base.agent_name,
                user_id=base.user_id,
                session_id=base.session_id,
                invocation_id=base.invocation_id,
                session_state=MappingProxyType(session.state),
                # A copy per call: tools may add keys without seeing each other's.
                metadata=dict(base.metadata),
            )
            target = tools.get(call.name)
            if target is None:
                result: dict[str, Any] = {
                    "error": {
                        "type": "unknown_tool",
                        "message": f"there is no tool named {call.name!r}; "
                        f"available: {sorted(tools) or 'none'}",
                    }
                }
            else:
                result = await invoke_tool(target, dict(call.args), ctx)
            ok = "error" not in result
            # A name the model invented is not a label: the model's input is the caller's.
            self._notify("on_tool_call", call.name if target is not None else "other", ok)
            # A failed tool's writes are dropped: its state change did not happen.
            return FunctionResponse(id=call.id, name=call.name, response=result), (
                ctx.state_delta if ok else {}
            )

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run_one(call)) for call in calls]
        outcomes = [task.result() for task in tasks]
        delta: dict[str, Any] = {}
        for _, tool_delta in outcomes:  # in call order: a later call's key wins
            delta.update(tool_delta)
        return Event(
            invocation_id=base.invocation_id,
            author=TOOL_AUTHOR,
            content=Content(
                role="user", parts=tuple(Part(function_response=r) for r, _ in outcomes)
            ),
            state_delta=jsonable(delta),
        )

    # -- helpers ----------------------------------------------------------------------------

    async def _load(self, user_id: str, session_id: str) -> Session:
        session = await self.sessions.get(user_id, session_id)
        if session is not None:
            return session
        try:
            session = await self.sessions.create(user_id, session_id)
        except StoreError:
            # Created meanwhile by another runner on the same store.
            again = await self.sessions.get(user_id, session_id)
            if again is None:
                raise
            return again
        self._notify("on_session_created")
        return session

    async def _tools(self, ctx: ToolContext) -> dict[str, Tool]:
        tools: dict[str, Tool] = {}
        for item in self._items:
            expanded: Sequence[Tool] = [item] if isinstance(item, Tool) else await item.tools(ctx)
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

    def _result(self, turn: _Turn, response_schema: dict[str, Any] | None) -> RunResult:
        text = turn.final.text if turn.final else ""
        data = (
            turn.final.metadata.get("data") if turn.final and response_schema is not None else None
        )
        return RunResult(
            text=text, data=data, events=turn.events, usage=turn.usage, session_id=turn.session_id
        )


def _user_content(message: str | Content) -> Content:
    if isinstance(message, str):
        return Content.user(message)
    if message.role != "user":
        raise ConfigError(f"a turn starts with a user message, got role {message.role!r}")
    return message


def _history(session: Session) -> tuple[Content, ...]:
    return tuple(
        e.content
        for e in session.events
        if e.content is not None and e.content.parts and not e.partial
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
