"""``MeshExecutor``: the A2A ``AgentExecutor`` of a node; turns one message into one task.

Order of work for a message: record the idempotency key, read the metadata (skill, caller,
traceparent, deadline), pick and validate the skill's input (invalid -> REJECTED naming the
field, before any work), refuse a deadline already past, then run the skill under
its deadline (``mesh._timeouts.timeout_at``: ``asyncio.timeout_at`` without a loop timer each)
and publish the validated output as an artifact (a data part for typed skills, a text part for
chat). Every failure ends the task cleanly (FAILED with a message and
``metadata.error = {reason, message}``): no exception text reaches the caller as -32603.

A skill declared ``asks=True`` may ``ctx.ask`` (``mesh._asks``): the run then stops with
``Suspend``, the task's resume point is written (``mesh._a2a.waits``) and only then the task
goes INPUT_REQUIRED (AUTH_REQUIRED) with the question as its status message
(``mesh._a2a.questions``). A message to that task (the request handler checked the answer)
records the answer and runs the skill again from its first message, each ``ask`` returning
its recorded answer; the node itself resumes a task the same way after a restart (rule 4 of
the recovery) or at its deadline (``RESUME`` in the call context's state). An LLM skill (typed
or ``chat``) whose tool returned ``mesh.Ask`` stops with ``TurnSuspended`` the same way: its
resume point holds the ``PendingTurn`` (kind ``turn``), and the answer goes to the runner's
``resume`` instead of a replay. A new turn in a context whose task waits is REJECTED.

``stop()`` (a shutdown whose drain grace ran out) cuts every skill still running, and each of
those tasks ends FAILED with reason ``shutdown`` through the same event path, so its callers
get that task as the answer (blocking) or final event (streaming); its message id is released
(see ``mesh._a2a.idempotency``) so the caller's retry runs the work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from a2a.helpers import get_data_parts, get_text_parts, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus
from a2a.utils.errors import ContentTypeNotSupportedError, InternalError, InvalidParamsError
from pydantic import BaseModel, RootModel

from mesh import _timeouts
from mesh._a2a.after_answer import AFTER_ANSWER, AfterAnswer, later
from mesh._a2a.artifacts import (
    AnswerStream,
    answer_parts,
    artifact_parts,
    files_of,
    media_type,
    refused_types,
)
from mesh._a2a.dispatcher import Outcome, SkillDispatcher, WaitCheck
from mesh._a2a.fastpath_json import RAW_MESSAGE, UNREAD, handed_values, to_json
from mesh._a2a.idempotency import IdempotencyKeys, MessageKey, message_key
from mesh._a2a.json_text import json_object
from mesh._a2a.metadata_keys import CALLER_TASK, CHILDREN_USAGE, TOOL_CALLS, USAGE, read, usage_json
from mesh._a2a.one_shot import OneShotQueue, OneShotUpdater, stepped
from mesh._a2a.questions import question_message, question_metadata, waiting_state
from mesh._a2a.relay import STREAMED, Followers, Relay
from mesh._a2a.states import COMPLETED, INTERRUPTED_STATES, WORKING
from mesh._a2a.store import (
    DEADLINE,
    SHUTDOWN,
    WAIT_DEADLINE_TEXT,
    mark_first_save_held,
    queue_first_save,
    stopped_text,
)
from mesh._a2a.updater import MeshTaskUpdater
from mesh._a2a.waits import CHILDREN, WAITING, WaitClock, WaitStore
from mesh._artifacts import ATTACHMENTS, File
from mesh._asks import TASKS_EXTENSION, ChildWaiting, Question, Recorded, Suspend, answer_of
from mesh._errors import MeshError, SchemaViolation, SessionWaiting, SkillInputError
from mesh._events import Event
from mesh._inflight import InFlight
from mesh._metrics import NodeMetrics, TaskOutcome
from mesh._pending import PendingTurn, TurnSuspended
from mesh._settings import NodeSettings
from mesh._skills import Skill, SkillContext
from mesh._tracing import traceparent_text

__all__ = [
    "ANSWER",
    "DIRECT",
    "LOGGED_FAILURE",
    "MESSAGE_KEY",
    "NEW_CONTEXT",
    "REQUEST",
    "RESUME",
    "MeshExecutor",
    "answers_named",
]

log = logging.getLogger("mesh.task")
#: The one line per task operators grep for (docs/node.md "Logs").
_TASK_LINE = "task agent=%s skill=%s task=%s outcome=%s duration_ms=%.1f traceparent=%s"


def _log_task(
    agent: str, skill_id: str, task_id: str, outcome: str, seconds: float, traceparent: str
) -> None:
    """Log the task's line. Called, not inlined in ``MeshExecutor.execute``: a record's line
    number is found by scanning its function's line table up to the call, and that of
    ``execute``'s ``finally`` cost ~31,000 instructions per task (here: a few hundred)."""
    log.info(_TASK_LINE, agent, skill_id, task_id, outcome, seconds * 1000, traceparent)


_MAX_SKILL_ID = 128

#: Key of ``ServerCallContext.state``: a run the node started itself on a task that waited,
#: and why (``"restart"``: run it again with its recorded answers; ``"deadline"``: end it).
RESUME = "mesh.resume"
#: The resume of a waiting task by a message from its caller (the answer).
ANSWER = "answer"
#: Key of ``ServerCallContext.state``: the checked input of a skill that replies with a
#: message (``check_send``), for its run.
DIRECT = "mesh.direct"
#: The answer's text of a direct reply's failure this request logged already, with its
#: traceback (``_reply``): the SDK's routes log the error they answer with again, as a line of
#: their own, which ``mesh._a2a.server`` drops for that text only (a failure logged once).
#: Set in the request's own asyncio task (the handler runs a direct reply there).
LOGGED_FAILURE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mesh.logged_failure", default=None
)
#: Key of ``ServerCallContext.state``: the context id made for this request (its message
#: named none), so no session has it and the turn need not read one (``FastPath.send``).
NEW_CONTEXT = "mesh.new_context"
#: Key of ``ServerCallContext.state``: a message's facts as ``read_request`` read them, with
#: the message (``FastPath.takes`` reads them first; the run does not read them again).
REQUEST = "mesh.request"
#: Key of ``ServerCallContext.state``: a message's idempotency key as the request handler read
#: it, with the message (the run does not read it again).
MESSAGE_KEY = "mesh.message_key"


@dataclass(frozen=True)
class _Direct:
    """A send to a ``reply="message"`` skill, its input validated before the run."""

    req: _Request
    skill: Skill
    payload: BaseModel | str
    files: list[File]


@dataclass
class _Resumed:
    """A waiting task's run again: its first message's facts, and the replay log."""

    req: _Request
    skill: Skill
    payload: BaseModel | str
    replay: list[Recorded]
    request: bytes
    #: An LLM turn's calls (a tool asked), and the answers recorded by question id.
    turn: PendingTurn | None = None
    answers: dict[str, Any] | None = None


def answers_named(message: Message | None) -> str | None:
    """The question id a resume message names (``metadata["urn:mesh:tasks:v1"]["answers"]``),
    None when it names none."""
    ext = _message_metadata(message).get(TASKS_EXTENSION)
    named = ext.get("answers") if isinstance(ext, dict) else None
    return named if isinstance(named, str) else None


@dataclass
class _Request:
    """The facts of one message, read once."""

    skill_id: str
    caller: str
    traceparent: str | None
    deadline: float | None
    metadata: dict[str, Any]
    #: The idempotency key the task was recorded under (released if a shutdown ends it).
    key: MessageKey | None = None


def _handed(message: Message | None, call: ServerCallContext, what: str) -> Any:
    """What the gate's parse of ``message`` holds (``fastpath_json.RAW_MESSAGE``, kept when
    ``send_request`` built the message from it), as reading ``message`` back gives it but
    for an object's members' order (``handed_values``, flat objects only): ``"metadata"``,
    its metadata's dict; ``"data"``, its data parts' values. ``UNREAD`` when the message is
    another, or a value is one to read back."""
    kept = call.state.get(RAW_MESSAGE)
    if message is None or type(kept) is not tuple or kept[0] is not message:
        return UNREAD
    raw = kept[1]
    if what == "metadata":
        # Flat too: read by key, but a value is also written as text (``str`` of a ``caller``
        # sent as an object would show its members' order).
        metadata = raw.get("metadata")
        return {} if not metadata else handed_values(metadata, flat=True)
    values = []
    for part in raw.get("parts", ()):
        if "data" in part:
            value = handed_values(part["data"], flat=True)
            if value is UNREAD:
                return UNREAD
            values.append(value)
    return values


def _data_parts(parts: list[Part]) -> list[Part]:
    return [part for part in parts if part.HasField("data")]


#: Whether a skill's input model sees its input's members' order, by model (``_order_free``).
_ORDER_FREE: dict[type[BaseModel], bool] = {}


def _order_free(model: type[BaseModel] | None) -> bool:
    """Whether validating a flat object with ``model`` gives the same model whatever the
    order of its members: each member goes to its own field (a field's validators see its
    value only). Not when the model keeps extra members (``extra="allow"``: in their order),
    is a root model (the object is its value), or has a model validator (it may see the
    object whole)."""
    if model is None:
        return False
    free = _ORDER_FREE.get(model)
    if free is None:
        decorators = getattr(model, "__pydantic_decorators__", None)
        free = (
            model.model_config.get("extra") != "allow"
            and not issubclass(model, RootModel)
            and decorators is not None
            and not decorators.model_validators
            and not decorators.root_validators
        )
        if len(_ORDER_FREE) < 1024:
            _ORDER_FREE[model] = free
    return free


def _message_metadata(message: Message | None) -> dict[str, Any]:
    if message is None or not message.metadata:
        return {}
    # json_format's rules without its descriptor walk (MessageToDict's error for a NaN).
    return dict(to_json(message.metadata))


def _deadline(value: Any) -> float | None:
    """Epoch seconds, from a number or a numeric string. Not ``nan`` or ``inf`` (strings that
    ``float()`` takes): NaN broke the skill's timer (the task FAILED "internal error"), and
    infinity silently meant no deadline."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SkillInputError(
            "metadata field 'deadline' must be epoch seconds (a finite number), "
            f"got {type(value).__name__}"
        )
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        seconds = math.nan
    if not math.isfinite(seconds):
        shown = value if len(str(value)) <= 40 else f"{str(value)[:40]}..."
        raise SkillInputError(
            f"metadata field 'deadline' must be epoch seconds (a finite number), got {shown!r}"
        )
    return seconds


class MeshExecutor(AgentExecutor):
    """Runs the skills of ``dispatcher.agent`` for A2A requests."""

    def __init__(
        self,
        dispatcher: SkillDispatcher,
        *,
        keys: IdempotencyKeys | None = None,
        metrics: NodeMetrics | None = None,
        max_text_bytes: int = NodeSettings.max_text_bytes,
        waits: WaitStore | None = None,
        clock: WaitClock | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.keys = keys
        self.metrics = metrics
        #: Resume points of waiting tasks (None: this node's tasks cannot wait, store=memory).
        self.waits = waits
        #: The deadlines of waiting tasks.
        self.clock = clock or WaitClock()
        #: Largest text turn (a chat message, an LLM skill's input as JSON), UTF-8 bytes.
        self.max_text_bytes = max_text_bytes
        #: The tasks running now.
        self.running = InFlight()
        #: The tasks someone subscribed to (the request handler counts them).
        self.followers = Followers()
        #: True once ``stop()`` was called: no skill starts any more.
        self.stopping = False
        # The deadline scope of every skill running now: ``stop()`` expires them.
        self._running: set[_timeouts.timeout] = set()
        # Tasks running here whose long-running children are kept in a resume point.
        self._kept: set[str] = set()
        skills = dispatcher.agent.all_skills
        # The media types every skill takes (a message of only those needs no skill lookup to
        # check), and those some skill takes.
        self._common = set.intersection(*(set(s.input_modes) for s in skills)) if skills else set()
        self._some = sorted({m for s in skills for m in s.input_modes})
        self._replies = any(s.reply == "message" for s in skills)

    @property
    def in_flight(self) -> int:
        return self.running.count

    async def wait_idle(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) until no task runs. True when idle."""
        return await self.running.wait_idle(seconds)

    def stop(self) -> int:
        """Cut every running skill: each of those tasks ends FAILED with reason ``shutdown``
        (``wait_idle`` tells when they have); a skill about to start ends so at once.
        Returns how many skills were running."""
        self.stopping = True
        now = asyncio.get_running_loop().time()
        for scope in self._running:
            if not scope.expired():
                scope.reschedule(now)
        return len(self._running)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        task_id = str(context.task_id)
        current = context.current_task
        # A follow-up naming a task but no context gets a fresh context id from the SDK.
        context_id = current.context_id if current is not None else str(context.context_id)
        resume = self._resume_kind(context, current)
        call = context.call_context
        direct = call.state.get(DIRECT) if call is not None and current is None else None
        if isinstance(direct, _Direct):
            await self._reply(direct, context_id, event_queue.enqueue_event, call)
            return
        key = None
        if self.keys is not None and message is not None:
            known = call.state.get(MESSAGE_KEY) if call is not None else None
            if type(known) is tuple and known[0] is message:
                key = known[1]  # the handler's (``MeshRequestHandler``)
            else:
                key = message_key(message, call)
        updater: MeshTaskUpdater
        if current is None and isinstance(event_queue, OneShotQueue) and event_queue.one_shot:
            # A function skill's new task on the fast path: its events are held until it
            # settles or lets the loop run (mesh._a2a.one_shot); its key goes with its first
            # save, as below.
            keys = self.keys
            record = functools.partial(keys.record, key, task_id) if keys and key else None
            updater = OneShotUpdater(event_queue, task_id, context_id, message, record)
        else:
            if current is None and call is not None and isinstance(event_queue, OneShotQueue):
                # An LLM turn on the fast path (a new blocking send): before its task settles
                # it writes its session, and a resume point only after queue_first_save, so
                # its first save may wait for its final one (one row write instead of two).
                mark_first_save_held(call)
            if current is None:
                await event_queue.enqueue_event(
                    Task(
                        id=task_id,
                        context_id=context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                        history=[message] if message is not None else [],
                    )
                )
            updater = MeshTaskUpdater(event_queue, task_id, context_id)
            if self.keys is not None and key is not None:
                await self.keys.record(key, task_id)

        started = time.monotonic()
        self.running.begin()
        if self.metrics:
            self.metrics.task_started()
        outcome: TaskOutcome = "failed"
        skill_id = "unknown"
        req: _Request | None = None
        resumed: _Resumed | None = None
        try:
            try:
                if resume is not None:
                    resumed = await self._prepare_resume(resume, context, updater, task_id)
                    if resumed is None:
                        return
                    req, skill, payload = resumed.req, resumed.skill, resumed.payload
                else:
                    req = self.read_request(message, context.call_context)
                    skill_id = req.skill_id or "unknown"
                    skill, payload = self._validate(req, message, context.call_context)
                skill_id = skill.id
            except SkillInputError as exc:
                outcome = "rejected"
                if req is not None and req.skill_id:
                    skill_id = req.skill_id
                await self._end(updater, TaskState.TASK_STATE_REJECTED, "rejected", str(exc), req)
                return
            req.key = key
            outcome = await self._run(
                skill, payload, req, context, updater, task_id, context_id, resumed
            )
        except asyncio.CancelledError:
            outcome = "canceled"
            raise
        finally:
            kept = task_id in self._kept
            if (resumed is not None or kept) and outcome != "waiting":
                self.forget(_owner(context.call_context), task_id)
            if kept:
                self._kept.discard(task_id)
            seconds = time.monotonic() - started
            traceparent = (req.traceparent if req else None) or "-"
            # Once the answer is sent when a route sends it (mesh._a2a.after_answer): the
            # answer does not need them. ``later``'s test inline: once a task.
            after = call.state.get(AFTER_ANSWER) if call is not None else None
            if type(after) is AfterAnswer:
                after.append(
                    functools.partial(
                        self._finished, skill_id, task_id, outcome, seconds, traceparent
                    )
                )
            else:
                self._finished(skill_id, task_id, outcome, seconds, traceparent)

    def _finished(
        self, skill_id: str, task_id: str, outcome: TaskOutcome, seconds: float, traceparent: str
    ) -> None:
        """A task's run ended: it is no longer in flight, its metrics and its log line (written
        even when the metrics raise)."""
        self.running.end()
        try:
            if self.metrics:
                self.metrics.task_done(skill_id, outcome, seconds)
        finally:
            _log_task(self.dispatcher.agent.name, skill_id, task_id, outcome, seconds, traceparent)

    def _resume_kind(self, context: RequestContext, current: Task | None) -> str | None:
        """How this run resumes a task that waited (``RESUME``'s values, or ``ANSWER``); None
        for a new task."""
        if current is None or self.waits is None:
            return None
        call = context.call_context
        internal = call.state.get(RESUME) if call is not None else None
        if isinstance(internal, str):
            return internal
        return ANSWER if current.status.state in INTERRUPTED_STATES else None

    async def _prepare_resume(
        self, kind: str, context: RequestContext, updater: TaskUpdater, task_id: str
    ) -> _Resumed | None:
        """Read the task's resume point; record the answer a caller's message carries. None
        when the task ended here instead (its deadline, or no resume point)."""
        assert self.waits is not None
        owner = _owner(context.call_context)
        wait = await self.waits.load(owner, task_id)
        if wait is None:
            await self._end(
                updater,
                TaskState.TASK_STATE_FAILED,
                "interrupted",
                "this task has no resume point on this node, so it cannot go on: send its "
                "first message again with a new messageId to start over",
                None,
            )
            return None
        first = Message()
        first.ParseFromString(wait.request)
        req = self.read_request(first)
        if kind == "deadline":
            self.forget(owner, task_id)
            if wait.kind == "turn":  # the children it waits on go with it
                await self.cancel_children(wait.turn)
            await self._end(updater, TaskState.TASK_STATE_FAILED, DEADLINE, WAIT_DEADLINE_TEXT, req)
            return None
        if kind == ANSWER:
            open_questions = wait.open_questions()
            named = answers_named(context.message)
            chosen = [q for q in open_questions if q.id == named] or open_questions[:1]
            if chosen:
                parts = list(context.message.parts) if context.message is not None else []
                try:
                    value = answer_of(
                        chosen[0], get_data_parts(parts), get_text_parts(parts), json_object(parts)
                    )
                except SchemaViolation:
                    value = None  # the handler checked it; the replay asks again
                if value is not None:
                    await self.waits.answer(owner, task_id, chosen[0].id, value)
                    wait.questions = [
                        (q, seq, "answered", value) if q.id == chosen[0].id else (q, seq, st, a)
                        for q, seq, st, a in wait.questions
                    ]
        skill, payload = self._validate(req, first)
        if wait.kind == "turn":
            turn = PendingTurn.from_json(wait.turn)
            return _Resumed(req, skill, payload, [], wait.request, turn, wait.answers())
        return _Resumed(req, skill, payload, wait.replay(), wait.request)

    async def cancel_children(self, turn_json: str) -> None:
        """CancelTask for the child tasks a waiting turn (its stored JSON) relays questions
        of: bounded and shielded (the caller may be canceled itself); never raises."""
        try:
            turn = PendingTurn.from_json(turn_json)
        except ValueError:
            return
        if not turn.children:
            return
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.dispatcher.cancel_children(turn)), 10.0)

    def forget(self, owner: str, task_id: str) -> None:
        """The task no longer waits: drop its resume point and deadline timer."""
        self.clock.disarm(task_id)
        if self.waits is not None:
            self.waits.finish(owner, task_id)

    def check_send(self, message: Message, call: ServerCallContext) -> None:
        """Refuse a new message before any task exists when its parts are of a media type
        its skill does not take (``ContentTypeNotSupportedError``, -32005; the skill named in
        metadata, else any skill of the agent). For a ``reply="message"`` skill, invalid input
        is ``InvalidParamsError`` naming the field (no task to reject), and the checked input
        is kept in ``call.state`` for the run."""
        # ``[:]``: the parts as a list at once (iterating a repeated field indexes it until an
        # IndexError, made and dropped).
        parts = message.parts[:]
        # One part (the common send): its type alone, no set made for it.
        if len(parts) == 1 and not self._replies and media_type(parts[0]) in self._common:
            return
        types = {media_type(p) for p in parts}
        if types <= self._common and not self._replies:
            return
        try:
            req = self.read_request(message)
        except SkillInputError:
            return  # the run rejects it, saying what is wrong
        named = self.dispatcher.agent.skill(req.skill_id) if req.skill_id else None
        modes = named.input_modes if named is not None else self._some
        refused = refused_types(types, modes)
        if refused:
            who = f"skill '{named.id}'" if named is not None else self.dispatcher.agent.name
            raise ContentTypeNotSupportedError(
                message=f"{who} does not take parts of type {', '.join(refused)}; it takes "
                + ", ".join(modes)
            )
        if not self._replies or (named is not None and named.reply != "message"):
            return
        try:
            skill, payload = self._validate(req, message)
        except SkillInputError as exc:
            if named is not None:
                raise InvalidParamsError(message=str(exc)) from None
            return
        if skill.reply == "message":
            files = files_of(message.parts, skill.accepts) if skill.accepts else []
            call.state[DIRECT] = _Direct(req, skill, payload, files)

    async def reply(self, context: RequestContext) -> Message:
        """The answer of a ``reply="message"`` skill (``check_send`` kept its input in the call's
        state), run by the handler in the request's task for a send the fast path does not
        take (streamed, or with the fast path off), instead of through the SDK's task
        machinery: its producer and consumer would log a failure's traceback twice more.
        Raises as ``_reply``."""
        call = context.call_context
        direct = call.state.get(DIRECT) if call is not None else None
        if not isinstance(direct, _Direct):
            raise InternalError(message="no direct reply to run")
        answer: list[Message] = []

        async def keep(message: Message) -> None:
            answer.append(message)

        await self._reply(direct, str(context.context_id), keep, call)
        return answer[0]

    async def _reply(
        self,
        direct: _Direct,
        context_id: str,
        send: Callable[[Message], Awaitable[None]],
        call: ServerCallContext | None = None,
    ) -> None:
        """Run a ``reply="message"`` skill and answer with one agent ``Message``: the result's
        parts, then those of what it attached. No task: a failure is the JSON-RPC error
        -32603 saying what failed, a ``SkillInputError`` the skill raised -32602 (the input
        was checked by ``check_send``)."""
        skill, req = direct.skill, direct.req
        started = time.monotonic()
        self.running.begin()
        if self.metrics:
            self.metrics.task_started()
        outcome: TaskOutcome = "failed"
        ctx = SkillContext(
            skill_id=skill.id,
            context_id=context_id,
            deadline=req.deadline,
            traceparent=req.traceparent,
            metadata={"caller": req.caller, ATTACHMENTS: []} if req.caller else {ATTACHMENTS: []},
            files=direct.files,
        )
        loop = asyncio.get_running_loop()
        when = None if req.deadline is None else loop.time() + (req.deadline - time.time())
        try:
            if self.stopping:
                raise InternalError(message=stopped_text(SHUTDOWN))
            try:
                with _timeouts.timeout_at(when) as scope:
                    self._running.add(scope)
                    try:
                        result = await self.dispatcher.run(
                            skill, direct.payload, ctx, user_id=req.caller or "a2a"
                        )
                    finally:
                        self._running.discard(scope)
            except TimeoutError:
                raise InternalError(message=f"skill '{skill.id}': deadline exceeded") from None
            except SkillInputError as exc:  # the skill rejected its input: the caller's to fix
                raise InvalidParamsError(message=str(exc)) from None
            except MeshError as exc:
                raise InternalError(message=str(exc)) from None
            except Exception:
                log.exception("skill %r raised", skill.id)
                text = f"skill '{skill.id}' failed with an internal error (details in the node log)"
                LOGGED_FAILURE.set(text)
                raise InternalError(message=text) from None
            parts = answer_parts(result.data, result.text, typed=skill.typed)
            for artifact in ctx.metadata[ATTACHMENTS]:
                parts.extend(artifact_parts(artifact))
            reply = Message(
                role=Role.ROLE_AGENT,
                message_id=uuid.uuid4().hex,
                context_id=context_id,
                parts=parts,
            )
            reply.metadata.update(self._task_metadata(req))
            await send(reply)
            outcome = "completed"
        finally:
            seconds = time.monotonic() - started
            after = later(call)
            if after is None:
                self._replied(skill.id, outcome, seconds, req.traceparent or "-")
            else:  # once the answer is sent (mesh._a2a.after_answer)
                after.append(
                    functools.partial(
                        self._replied, skill.id, outcome, seconds, req.traceparent or "-"
                    )
                )

    def _replied(self, skill_id: str, outcome: TaskOutcome, seconds: float, trace: str) -> None:
        """A direct reply's run ended: as ``_finished``, its line a message's."""
        self.running.end()
        try:
            if self.metrics:
                self.metrics.task_done(skill_id, outcome, seconds)
        finally:
            log.info(
                "message agent=%s skill=%s outcome=%s duration_ms=%.1f traceparent=%s",
                self.dispatcher.agent.name,
                skill_id,
                outcome,
                seconds * 1000,
                trace,
            )

    def read_request(
        self, message: Message | None, call: ServerCallContext | None = None
    ) -> _Request:
        """The skill, caller, trace and deadline a message's metadata names
        (``SkillInputError`` for a malformed one). With ``call``, read once per message of the
        call (kept in its state: the fast path reads them to decide, the run uses them)."""
        if call is not None:
            known = call.state.get(REQUEST)
            if isinstance(known, tuple) and known[0] is message:
                read_before: _Request = known[1]
                return read_before
            req = self._read_request(message, _handed(message, call, "metadata"))
            call.state[REQUEST] = (message, req)
            return req
        return self._read_request(message, UNREAD)

    def _read_request(self, message: Message | None, handed: Any) -> _Request:
        """``read_request`` of ``message``, its metadata as ``handed`` (the gate's parse of
        it, ``_handed``: read by key only, so its members' order is nobody's to see) unless
        that is ``UNREAD``."""
        meta = _message_metadata(message) if handed is UNREAD else handed
        skill = meta.get("skill")
        if skill is not None and not isinstance(skill, str):
            raise SkillInputError("metadata field 'skill' must be a string (a skill id)")
        if skill is not None and len(skill) > _MAX_SKILL_ID:
            # Not a skill of any agent; and it would land in every log line of the task.
            raise SkillInputError(
                f"metadata field 'skill' must be a skill id (at most {_MAX_SKILL_ID} characters)"
            )
        traceparent = meta.get("traceparent")
        return _Request(
            skill_id=skill or "",
            caller=str(meta.get("caller") or ""),
            # Every task gets a trace: the caller's when it sent a valid one, a new one otherwise,
            # so the task's log line and its delegations can always be correlated.
            traceparent=traceparent_text(traceparent if isinstance(traceparent, str) else None),
            deadline=_deadline(meta.get("deadline")),
            metadata=meta,
        )

    def _validate(
        self, req: _Request, message: Message | None, call: ServerCallContext | None = None
    ) -> tuple[Skill, BaseModel | str]:
        parts = message.parts[:] if message is not None else []  # (``[:]``: see check_send)
        # The data parts' values as the gate parsed them (``_handed``), when they are what
        # reading them back gives but for an object's members' order: a flat object's order
        # only an order-aware input model sees, or the error of one that refuses it.
        handed = _handed(message, call, "data") if call is not None else UNREAD
        if handed is UNREAD:
            # get_data_parts' values by json_format's rules without its descriptor walk.
            data = [to_json(part.data) for part in parts if part.HasField("data")]
        else:
            data = handed
        # Text-only clients send a typed skill's input as a JSON object in text.
        as_text = None if data else json_object(parts)
        texts: list[str] | None = None
        if req.skill_id:  # found by its name alone (``resolve`` reads nothing else then)
            skill = self.dispatcher.resolve(req.skill_id, has_data=False, has_text=False)
        else:
            texts = get_text_parts(parts)
            skill = self.dispatcher.resolve(
                None,
                has_data=bool(data),
                has_text=bool(texts) or as_text is not None,
                text_object=as_text,
            )
        req.skill_id = skill.id
        if skill.typed:
            if not data and as_text is not None and as_text.value is not None:
                value: Any = as_text.value
                handed = UNREAD  # the text's object, parsed here
            elif len(data) != 1:
                why = f"got {len(data)} data parts"
                if not data:
                    why = as_text.problem if as_text is not None else "got no data part"
                raise SkillInputError(
                    f"skill '{skill.id}' expects exactly one data part (application/json), or "
                    f"one text part holding a JSON object, matching its input schema: {why}"
                )
            else:
                value = data[0]
            if handed is not UNREAD and not _order_free(skill.input_model):
                handed, value = UNREAD, to_json(_data_parts(parts)[0].data)
            try:
                payload = self.dispatcher.validate_input(skill, value)
            except SkillInputError:
                if handed is UNREAD:
                    raise
                # Refused: the error as of the values read back (it may name members in
                # their order), so the caller gets the same words.
                value = to_json(_data_parts(parts)[0].data)
                payload = self.dispatcher.validate_input(skill, value)
            if skill.llm:
                # The model's turn is the input as JSON: bounded like a chat message.
                self._check_turn(skill, payload.model_dump_json())
            return skill, payload
        text = "\n".join(get_text_parts(parts) if texts is None else texts).strip()
        if not text:
            raise SkillInputError(f"skill '{skill.id}' expects a text part, got none")
        self._check_turn(skill, text)
        return skill, text

    def _check_turn(self, skill: Skill, text: str) -> None:
        """A text turn over ``max_text_bytes`` is refused before any model work: the cost of a
        model turn (and of any matching on it) grows with its length."""
        limit = self.max_text_bytes
        if len(text) * 4 <= limit:  # UTF-8 needs at most 4 bytes a character
            return
        size = len(text.encode())
        if size > limit:
            raise SkillInputError(
                f"skill '{skill.id}': the text turn is {size} bytes, over this node's limit of "
                f"{limit} bytes (MESH_MAX_TEXT_BYTES); send a shorter text"
            )

    async def _run(
        self,
        skill: Skill,
        payload: BaseModel | str,
        req: _Request,
        context: RequestContext,
        updater: TaskUpdater,
        task_id: str,
        context_id: str,
        resumed: _Resumed | None,
    ) -> TaskOutcome:
        if req.deadline is not None and req.deadline <= time.time():
            if resumed is not None:  # the deadline counts the wait: it passed while waiting
                await self._end(
                    updater, TaskState.TASK_STATE_FAILED, DEADLINE, WAIT_DEADLINE_TEXT, req
                )
                return "failed"
            await self._end(
                updater, TaskState.TASK_STATE_REJECTED, "deadline", "deadline exceeded", req
            )
            return "rejected"
        if resumed is None and isinstance(updater, OneShotUpdater):
            # The same status, its message held as its fields (built in the final task).
            await updater.work(f"running skill '{skill.id}'")
        elif resumed is None:
            # ``start_work``'s status, its state read once (``mesh._a2a.states``).
            await updater.update_status(
                WORKING,
                message=updater.new_agent_message([new_text_part(f"running skill '{skill.id}'")]),
            )
        else:
            await updater.update_status(
                TaskState.TASK_STATE_WORKING,
                message=updater.new_agent_message([new_text_part(f"resuming skill '{skill.id}'")]),
                metadata={TASKS_EXTENSION: {"questions": []}},
            )
        loop = asyncio.get_running_loop()
        when = None if req.deadline is None else loop.time() + (req.deadline - time.time())
        if (
            isinstance(updater, OneShotUpdater)
            and updater.held
            and not skill.llm
            and not skill.takes_context
        ):
            return await self._run_held(skill, payload, req, context, updater, task_id, when)
        ctx = SkillContext(
            skill_id=skill.id,
            task_id=task_id,
            context_id=context_id,
            deadline=req.deadline,
            traceparent=req.traceparent,
            metadata={"caller": req.caller} if req.caller else {},
            may_ask=skill.asks,
            replay=resumed.replay if resumed is not None else [],
        )
        # Remote tools report each child task's usage here (see mesh._remote).
        children: list[dict[str, int]] = []
        ctx.metadata["usage_sink"] = children
        # Progress for whoever follows the task live; remote tools stream their children then.
        call = context.call_context
        relay = Relay(
            updater,
            streamed=call is not None and bool(call.state.get(STREAMED)),
            followers=self.followers,
        )
        ctx.reporter = relay.say
        ctx.metadata["relay"] = relay
        # What the skill and its tools attach (published with the answer, see _attachments).
        ctx.metadata[ATTACHMENTS] = []
        if skill.accepts:
            # The files of the task's first message (a resumed run reads it from the point).
            sent = context.message
            if resumed is not None:
                sent = Message()
                sent.ParseFromString(resumed.request)
            ctx.files = files_of(sent.parts, skill.accepts) if sent is not None else []
        answer = AnswerStream(updater, skill.id, lambda: relay.live)
        if self.waits is not None and skill.llm:
            # A long-running remote call is kept in the resume point (``_keep_children``).
            ctx.metadata["durable_children"] = True
        owner = resolve_user_scope(context.call_context) if context.call_context else ""
        user_id = owner or req.caller or "a2a"

        async def progress(event: Event) -> None:
            await self._progress(updater, answer, event)

        # No await between this check and registering the scope: stop() sees every skill.
        if self.stopping:
            if isinstance(updater, OneShotUpdater):
                await updater.release()  # its key is recorded before it is released
            await self._end_shutdown(updater, task_id, req)
            return "failed"
        # Without a task store no task waits: a session's mark is left by a failed run.
        waiting = self._waiting_check(context) if skill.llm else None
        new_context = (
            resumed is None and call is not None and call.state.get(NEW_CONTEXT) == context_id
        )
        try:
            with _timeouts.timeout_at(when) as scope:
                self._running.add(scope)
                pending = resumed.turn if resumed is not None else None
                answers = (resumed.answers or {}) if resumed is not None else {}
                try:
                    while True:
                        try:
                            if pending is not None:
                                result = await self.dispatcher.resume(
                                    skill, pending, answers, ctx, user_id=user_id, progress=progress
                                )
                            else:
                                run = self.dispatcher.run(
                                    skill,
                                    payload,
                                    ctx,
                                    user_id=user_id,
                                    progress=progress,
                                    waiting=waiting,
                                    new_session=new_context,
                                )
                                if isinstance(updater, OneShotUpdater) and updater.held:
                                    # Its events go out before the loop runs, if it does.
                                    result = await stepped(run, updater.release)
                                else:
                                    result = await run
                            break
                        except TurnSuspended as paused:
                            if paused.questions or self.waits is None:
                                raise
                            # Only long-running children to follow: kept in the resume point
                            # first, then followed at once by the runner's resume.
                            request = resumed.request if resumed is not None else None
                            await self._keep_children(
                                paused, skill, req, context, updater, request, user_id
                            )
                            pending, answers = paused.turn, {}
                finally:
                    self._running.discard(scope)
        except (Suspend, TurnSuspended, ChildWaiting, Exception) as exc:
            return await self._ended_by(exc, skill, req, context, updater, task_id, resumed, ctx)
        await self._attachments(updater, ctx)
        await self._publish(updater, answer, skill, result, req, _sum_usage(children))
        return "completed"

    async def _run_held(
        self,
        skill: Skill,
        payload: BaseModel | str,
        req: _Request,
        context: RequestContext,
        updater: OneShotUpdater,
        task_id: str,
        when: float | None,
    ) -> TaskOutcome:
        """``_run``'s rest for a function skill whose handler takes no context, on a task
        whose events are held (``mesh._a2a.one_shot``): no context, relay or deadline scope is
        made for a handler that ends in its first step; one that waits is released first and
        goes on under its deadline, as in ``_run``."""
        if self.stopping:
            await updater.release()  # its key is recorded before it is released
            await self._end_shutdown(updater, task_id, req)
            return "failed"
        try:
            result = await stepped(
                self.dispatcher.call(skill, payload),
                updater.release,
                functools.partial(self._under_deadline, when=when),
            )
        except (Suspend, TurnSuspended, ChildWaiting, Exception) as exc:
            return await self._ended_by(exc, skill, req, context, updater, task_id, None, None)
        answer = AnswerStream(updater, skill.id, _not_live)
        await self._publish(updater, answer, skill, result, req, {})
        return "completed"

    async def _under_deadline(self, rest: Awaitable[Outcome], when: float | None) -> Outcome:
        """``rest`` of a run under its deadline scope, cut by ``stop()`` like any run's (at
        once when it was called since the run started)."""
        with _timeouts.timeout_at(when) as scope:
            if self.stopping:
                scope.reschedule(asyncio.get_running_loop().time())
            self._running.add(scope)
            try:
                return await rest
            finally:
                self._running.discard(scope)

    async def _ended_by(
        self,
        exc: BaseException,
        skill: Skill,
        req: _Request,
        context: RequestContext,
        updater: TaskUpdater,
        task_id: str,
        resumed: _Resumed | None,
        ctx: SkillContext | None,
    ) -> TaskOutcome:
        """End the run whose skill raised ``exc`` (its deadline, a question, an error): the
        task's last state, published through ``updater`` (``ctx``: the skill's context,
        None when its handler takes none)."""
        if isinstance(exc, Suspend):
            request = resumed.request if resumed is not None else None
            return await self._suspend(exc, skill, req, context, updater, request)
        if isinstance(exc, TurnSuspended):
            request = resumed.request if resumed is not None else None
            # Its tools do not run again on the resume: what they attached goes out now.
            await self._attachments(updater, ctx)
            user_id = _owner(context.call_context) or req.caller or "a2a"
            return await self._suspend_turn(exc, skill, req, context, updater, request, user_id)
        if isinstance(exc, ChildWaiting):
            waiting = exc
            # A function skill called a remote skill that asks: only an LLM turn relays the
            # question (its remote tool's call waits); the child is not left waiting in vain.
            if waiting.cancel is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(waiting.cancel()), 10.0)
            child = waiting.child
            first = waiting.questions[0].text if waiting.questions else "(no text)"
            await self._end(
                updater,
                TaskState.TASK_STATE_FAILED,
                "failed",
                f"skill '{skill.id}' called {child.peer}'s skill '{child.skill}', whose task "
                f"{child.task} waits for input ({first!r}; canceled now): a function skill "
                "cannot relay a question. Either call that skill from an LLM agent's remote() "
                f"tool (tools=[remote({child.peer!r})]), whose turn relays the question to its "
                "caller and forwards the answer; or ask your caller first (@skill(asks=True), "
                f"answer = await ctx.ask(...)) and send {child.peer} what it asked for in the "
                "call's arguments, so its skill has nothing to ask",
                req,
            )
            return "failed"
        if isinstance(exc, TimeoutError):
            if self.stopping:
                await self._end_shutdown(updater, task_id, req)
                return "failed"
            await self._end(
                updater, TaskState.TASK_STATE_FAILED, "deadline", "deadline exceeded", req
            )
            return "failed"
        if isinstance(exc, SkillInputError | SessionWaiting):
            await self._end(updater, TaskState.TASK_STATE_REJECTED, "rejected", str(exc), req)
            return "rejected"
        if isinstance(exc, MeshError):
            await self._end(updater, TaskState.TASK_STATE_FAILED, "failed", str(exc), req)
            return "failed"
        log.error("skill %r raised", skill.id, exc_info=exc)
        await self._end(
            updater,
            TaskState.TASK_STATE_FAILED,
            "failed",
            f"skill '{skill.id}' failed with an internal error (details in the node log)",
            req,
        )
        return "failed"

    async def _suspend(
        self,
        asked: Suspend,
        skill: Skill,
        req: _Request,
        context: RequestContext,
        updater: TaskUpdater,
        request: bytes | None,
    ) -> TaskOutcome:
        """End the run waiting on ``asked.question``: the resume point first (one
        transaction), then the waiting state (the store commits it before answering)."""
        if self.waits is None:
            return await self._cannot_wait(updater, req, f"skill '{skill.id}'")
        owner = _owner(context.call_context)
        if context.call_context is not None:  # the task's first row goes before its point
            queue_first_save(context.call_context)
        await self.waits.suspend(
            owner=owner,
            task_id=updater.task_id,
            context_id=updater.context_id,
            skill=skill.id,
            request=_first_request(context, request),
            deadline=req.deadline,
            question=asked.question,
            seq=asked.seq,
            caller=req.caller,
            traceparent=req.traceparent or "",
        )
        return await self._waiting(owner, updater, req, [asked.question])

    async def _cannot_wait(self, updater: TaskUpdater, req: _Request, who: str) -> TaskOutcome:
        """``who`` asked, but without a task store no task can wait: the task FAILS."""
        await self._end(
            updater,
            TaskState.TASK_STATE_FAILED,
            "failed",
            f"{who} asked for input, but this node keeps no tasks (store=memory): serve it "
            "with the SQLite store",
            req,
        )
        return "failed"

    async def _waiting(
        self, owner: str, updater: TaskUpdater, req: _Request, questions: list[Question]
    ) -> TaskOutcome:
        """The resume point is written: arm the deadline and publish the waiting state."""
        self.clock.arm(owner, updater.task_id, updater.context_id, req.deadline)
        await updater.update_status(
            waiting_state(questions),
            message=question_message(updater.task_id, updater.context_id, questions),
            metadata={**self._task_metadata(req), **question_metadata(questions)},
        )
        return "waiting"

    def _waiting_check(self, context: RequestContext) -> WaitCheck:
        """Whether a task of this call's owner still waits (a turn's check of its session)."""
        if self.waits is None:  # no task store, no waiting task: a mark is a failed run's
            return _never
        return functools.partial(self.waits.waiting, _owner(context.call_context))

    async def _keep_children(
        self,
        paused: TurnSuspended,
        skill: Skill,
        req: _Request,
        context: RequestContext,
        updater: TaskUpdater,
        request: bytes | None,
        user_id: str,
    ) -> None:
        """A turn whose pending calls are long-running children only (no question): its
        resume point (state ``children``, the ``PendingTurn`` with each child's task id) is
        written before anyone waits on them. The task stays WORKING; after a stop, recovery
        rule 4 runs it again and the runner re-attaches to the children by task id."""
        await self._write_turn(paused, skill, req, context, updater, request, user_id, CHILDREN)
        self._kept.add(updater.task_id)

    async def _suspend_turn(
        self,
        paused: TurnSuspended,
        skill: Skill,
        req: _Request,
        context: RequestContext,
        updater: TaskUpdater,
        request: bytes | None,
        user_id: str,
    ) -> TaskOutcome:
        """End an LLM turn's run waiting on its tools' questions: the resume point with the
        ``PendingTurn`` first (one transaction), then the waiting state, as ``_suspend``."""
        if self.waits is None:
            return await self._cannot_wait(updater, req, f"a tool of skill '{skill.id}'")
        owner = await self._write_turn(
            paused, skill, req, context, updater, request, user_id, WAITING
        )
        return await self._waiting(owner, updater, req, paused.questions)

    async def _write_turn(
        self,
        paused: TurnSuspended,
        skill: Skill,
        req: _Request,
        context: RequestContext,
        updater: TaskUpdater,
        request: bytes | None,
        user_id: str,
        state: str,
    ) -> str:
        """Write a stopped LLM turn's resume point (the ``PendingTurn``, its questions, in
        ``state``: ``waiting`` on them or following ``children``); the owner it is under."""
        assert self.waits is not None
        owner = _owner(context.call_context)
        if context.call_context is not None:  # the task's first row goes before its point
            queue_first_save(context.call_context)
        await self.waits.suspend_turn(
            owner=owner,
            task_id=updater.task_id,
            context_id=updater.context_id,
            skill=skill.id,
            request=_first_request(context, request),
            deadline=req.deadline,
            user_id=user_id,
            session_id=updater.context_id,
            turn=paused.turn.to_json(),
            questions=paused.questions,
            caller=req.caller,
            traceparent=req.traceparent or "",
            state=state,
        )
        return owner

    async def _progress(self, updater: TaskUpdater, answer: AnswerStream, event: Event) -> None:
        """Forward a runner event: partial text as a chunk of the answer artifact (while
        someone follows the task), a tool call as a WORKING status update."""
        if event.partial and event.text:
            await answer.chunk(event.text)
            return
        if event.function_calls:
            names = ", ".join(c.name for c in event.function_calls)
            parts, meta = [new_text_part(f"calling {names}")], {TOOL_CALLS: True}
        else:
            return
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, message=updater.new_agent_message(parts, meta)
        )

    async def _attachments(self, updater: TaskUpdater, ctx: SkillContext | None) -> None:
        """Publish what the run attached (``ctx.attach``, a tool's ``ctx.attach``), one
        artifact each, and empty the list (nothing without a context)."""
        if ctx is None:
            return
        attached = ctx.metadata.get(ATTACHMENTS) or []
        for artifact in attached:
            await updater.add_artifact(
                artifact_parts(artifact),
                name=artifact.name,
                metadata={"description": artifact.description} if artifact.description else None,
                last_chunk=True,
            )
        attached.clear()

    async def _publish(
        self,
        updater: TaskUpdater,
        answer: AnswerStream,
        skill: Skill,
        result: Outcome,
        req: _Request,
        children_usage: dict[str, int],
    ) -> None:
        await answer.close(answer_parts(result.data, result.text, typed=skill.typed))
        await updater.update_status(
            COMPLETED,
            metadata={
                **self._task_metadata(req),
                USAGE: usage_json(result.usage),
                CHILDREN_USAGE: children_usage,
            },
        )

    def _task_metadata(self, req: _Request | None) -> dict[str, Any]:
        if req is None:
            return {}
        meta: dict[str, Any] = {"skill": req.skill_id}
        if req.caller:
            meta["caller"] = req.caller
        if req.traceparent:
            meta["traceparent"] = req.traceparent
        caller_task = read(req.metadata, CALLER_TASK)
        if isinstance(caller_task, str) and caller_task:
            meta[CALLER_TASK] = caller_task  # the task above this one in a chain
        return meta

    async def _end(
        self,
        updater: TaskUpdater,
        state: TaskState,
        reason: str,
        text: str,
        req: _Request | None,
    ) -> None:
        meta = {**self._task_metadata(req), "error": {"reason": reason, "message": text}}
        await updater.update_status(
            state, message=updater.new_agent_message([new_text_part(text)]), metadata=meta
        )

    async def _end_shutdown(self, updater: TaskUpdater, task_id: str, req: _Request) -> None:
        # The key first: its delete is queued before (or committed with) the final save.
        if self.keys is not None and req.key is not None:
            self.keys.release(req.key, task_id)
        await self._end(updater, TaskState.TASK_STATE_FAILED, SHUTDOWN, stopped_text(SHUTDOWN), req)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        context_id = task.context_id if task is not None else str(context.context_id)
        updater = MeshTaskUpdater(event_queue, str(context.task_id), context_id)
        self.forget(_owner(context.call_context), str(context.task_id))
        await updater.update_status(
            TaskState.TASK_STATE_CANCELED,
            message=updater.new_agent_message([new_text_part("canceled by request")]),
            metadata={"error": {"reason": "canceled", "message": "canceled by request"}},
        )


async def _never(task_id: str) -> bool:
    return False


def _not_live() -> bool:
    return False


def _first_request(context: RequestContext, request: bytes | None) -> bytes:
    """The task's first message as stored in its resume point: ``request`` when the run
    resumed (read from the point), else the message that started it."""
    if request is not None:
        return request
    assert context.message is not None
    first: bytes = context.message.SerializeToString()
    return first


def _owner(call: ServerCallContext | None) -> str:
    """The owner scope of a call's tasks (the store's, see ``resolve_user_scope``)."""
    return resolve_user_scope(call) if call is not None else ""


def _sum_usage(reports: list[dict[str, int]]) -> dict[str, int]:
    """Token usage of the child tasks of one turn, added up by kind."""
    total: dict[str, int] = {}
    for report in reports:
        for kind, count in report.items():
            total[kind] = total.get(kind, 0) + count
    return total
