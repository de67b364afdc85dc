"""``FastPath``: a blocking ``SendMessage`` of a function skill without the SDK's task machinery.

The SDK's ``DefaultRequestHandler`` runs every message through its active-task machinery
(producer and consumer asyncio tasks, two event queues, a subscriber queue): most of a node's
CPU per request for a skill whose work takes microseconds. ``MeshRequestHandler`` hands this
path the narrow, hot case (``FastPath.takes``):

* a new task (no ``message.taskId``), a blocking send (no ``returnImmediately``), no push config,
* whose skill resolves to a typed skill with a Python handler that never asks (not
  ``asks=True``: such a task goes through the SDK), or to an LLM skill (``chat`` or an
  ``llm_skill``): the turn runs here whatever it does, tools, delegations, attachments, a tool
  that asks (the turn ends INPUT_REQUIRED here as there; the answer, a message naming the task,
  always goes to the SDK's handler, which loads the task from the store).

Anything else goes to the SDK's handler, which answers it (or refuses it) as always. Params
the SDK's handler refuses (a required field missing, a negative ``historyLength``) are refused
here with the same error.

Built only from the SDK's public interfaces, so a minor SDK upgrade needs no change here: the
request context comes from the ``RequestContextBuilder`` the handler built (given the ids its
generators would make), the work is ``MeshExecutor.execute`` (metrics, log line, idempotency
key, deadline, REJECTED on invalid input) in the request's own asyncio task, and its events
reach the store through ``AppliedEvents``: an ``EventQueue`` (the interface the SDK gives
executors) that applies each event at once as the SDK's ``TaskManager.save_task_event`` does
(the manager itself only for what else comes), under the rules the SDK's own consumer enforces
on an agent's events (``InvalidAgentResponseError``). The answer is the task as the last event
left it. A function skill's run (``SINGLE_WRITE``) makes no event while it has not let the loop
go (``mesh._a2a.one_shot``): a run that settles at once has its task built in its final form
and saved once (``AppliedEvents.settle``); one that waits publishes its events then, and saves
an unsettled state once it lets the loop go.

A task run here is outside the SDK's registry of active tasks, so ``FastPath`` keeps its own
record of them: ``CancelTask`` stops one and ``SubscribeToTask`` follows one
(``MeshRequestHandler`` asks here first): the subscriber gets the task as it is, then each
event as it is applied, and the stream ends with the run, as the SDK's does (a turn on this
path can last as long as its model takes). A duplicate
send waits for a running task through ``WatchedTaskStore``, which sees both paths' saves.
Set ``MESH_FASTPATH=0`` to send everything through the SDK (tests/test_node_fastpath.py runs
both and compares them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NoReturn

from a2a.helpers import get_text_parts, new_text_message
from a2a.server.agent_execution import RequestContext, RequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.tasks import TaskManager, TaskStore
from a2a.types import (
    Message,
    Role,
    SendMessageRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    InvalidAgentResponseError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import validate_history_length

from mesh._a2a.executor import NEW_CONTEXT
from mesh._a2a.fastpath_json import SETTLED, WRITES_SETTLED, Settled
from mesh._a2a.fastpath_required import missing_required
from mesh._a2a.idempotency import WatchedTaskStore
from mesh._a2a.ids import uuid4_text
from mesh._a2a.json_text import json_object
from mesh._a2a.one_shot import OneShotQueue, append_artifact
from mesh._a2a.states import SETTLED_STATES, TERMINAL_STATES
from mesh._a2a.store import SINGLE_WRITE, SqliteTaskStore, mark_single_write
from mesh._errors import SkillInputError

if TYPE_CHECKING:
    from mesh._a2a.executor import MeshExecutor

__all__ = ["TAKEN", "AppliedEvents", "FastPath"]

log = logging.getLogger("mesh._a2a")

#: The status message of a task whose run raised (the executor's own failures say more).
FAILED_TEXT = "the agent's run failed with an internal error (details in the node log)"
#: Key of ``ServerCallContext.state``: whether the fast path takes the call's send.
TAKEN = "mesh.fastpath"
#: What a task id generator is told of a new task here: nothing (the SDK's builder tells its
#: own the request's context id, which uuid4 generators ignore).
_NO_IDS = IDGeneratorContext()


class AppliedEvents(OneShotQueue):
    """The ``EventQueue`` an executor writes to on the fast path: each event is applied to its
    task by ``manager`` as it arrives (no queue, no consumer task).

    The rules are those the SDK's consumer enforces on an agent's events: a ``Message`` is the
    whole answer or none of it, a status update needs a task first, a second ``Task`` is
    ignored; ``TaskManager`` itself refuses ids that do not match and appends to an artifact
    that does not exist. A violation raises ``InvalidAgentResponseError`` (an ``A2AError``: the
    caller gets it as the SDK's handler would give it)."""

    def __init__(
        self,
        manager: TaskManager | None,
        store: TaskStore | None = None,
        context: ServerCallContext | None = None,
        *,
        task_id: str = "",
        context_id: str = "",
        initial_message: Message | None = None,
    ) -> None:
        # Given the store and the call context, the task's events are applied here and saved
        # directly (the first ``Task``, then each update by ``_apply_update``): what
        # ``TaskManager.save_task_event`` does with them, without its per-event work; the
        # manager is made only for what else comes (``manager``). Without them, every event
        # goes through ``manager``.
        self._manager = manager
        self._store = store
        self._context = context
        self._task_id = manager.task_id or "" if manager is not None else task_id
        self._context_id = manager.context_id or "" if manager is not None else context_id
        self._initial_message = initial_message
        # A run that writes nothing else before its task settles (``SINGLE_WRITE``): an update
        # that leaves the task unsettled is saved once the run lets the loop go, not at once,
        # so a run that settles without waiting on anything (a function skill's microseconds)
        # saves its task twice, first and last, instead of once per event. Whoever reads the
        # task meanwhile (GetTask, CancelTask, a duplicate) runs only once the run waits.
        self._later = context is not None and context.state.get(SINGLE_WRITE) is True
        self._save_soon: asyncio.Handle | None = None
        self._saving: asyncio.Future[None] | None = None
        self.one_shot = self._later
        # Its settled store takes a settled task's stand-in for it (``settle``): mesh's own
        # (the handler's watch around the SQLite store), which read its id and state from the
        # ``Settled`` in the call's state (a stand-in is an empty task: ``Settled.is_of``).
        self.takes_stand_in = (
            self._later and type(store) is WatchedTaskStore and type(store.inner) is SqliteTaskStore
        )
        self._task: Task | None = None
        # A settled task not parsed yet (``settle``): ``task`` parses it when read.
        self._settled: Settled | None = None
        #: The answer of an executor that answered with a message instead of a task.
        self.message: Message | None = None
        #: The rule violation raised here last (it is the consumer's error, not the agent's).
        self.violation: InvalidAgentResponseError | None = None
        #: Subscribers' queues: each applied event, then None when the run ends.
        self.taps: list[asyncio.Queue[Event | None]] = []

    @classmethod
    def direct(
        cls,
        store: TaskStore,
        context: ServerCallContext,
        *,
        task_id: str,
        context_id: str,
        initial_message: Message | None,
    ) -> AppliedEvents:
        """``AppliedEvents(None, store, context, ...)``: the fast path's, its events saved
        directly. Made as ``EventQueue.__new__`` makes a subclass's instance (its
        ``super().__new__(cls)``), without calling it: that redirect of a bare ``EventQueue()``
        is a Python call taking ``*args, **kwargs`` for every subclass (~6 k instructions a
        task)."""
        events: AppliedEvents = object.__new__(cls)
        events.__init__(  # type: ignore[misc]
            None,
            store,
            context,
            task_id=task_id,
            context_id=context_id,
            initial_message=initial_message,
        )
        return events

    @property
    def manager(self) -> TaskManager:
        """The SDK's ``TaskManager`` of the task (made on first use when not given)."""
        if self._manager is None:
            if self._store is None or self._context is None:
                raise RuntimeError("AppliedEvents needs a TaskManager or a store and a context")
            self._manager = TaskManager(
                task_store=self._store,
                context=self._context,
                task_id=self._task_id,
                context_id=self._context_id or None,
                initial_message=self._initial_message,
            )
        return self._manager

    @property
    def task(self) -> Task | None:
        """The task as the last applied event left it (None until the first task event)."""
        task = self._task
        if task is None and self._settled is not None:
            task = self._task = self._settled.task
        return task

    @task.setter
    def task(self, task: Task | None) -> None:
        self._task = task

    @property
    def settled(self) -> Settled | None:
        """The settled task's values while the task is not parsed (``settle``), else None."""
        return self._settled if self._task is None else None

    @property
    def context_id(self) -> str:
        """The context id of the task's events (the manager's, when there is one)."""
        if self._manager is not None:
            return self._manager.context_id or ""
        return self._context_id

    async def apply(self, event: Event) -> None:
        """Save ``event`` to the task and hand it to the subscribers."""
        store, context, task = self._store, self._context, self.task
        if store is None or context is None:
            self.task = await self.manager.save_task_event(event)
        elif task is None:
            if (
                isinstance(event, Task)
                and event.id == self._task_id
                and (not self.context_id or event.context_id == self.context_id)
            ):
                await store.save(event, context)  # the manager's checks passed, its save
                self.task = event
            else:
                self.task = await self.manager.save_task_event(event)
        elif (
            not isinstance(event, TaskStatusUpdateEvent | TaskArtifactUpdateEvent)
            or event.task_id != self._task_id  # the manager refuses it
        ):
            self.task = await self.manager.save_task_event(event)
        else:
            _apply_update(task, event)
            if self._later and task.status.state not in SETTLED_STATES:
                if self._save_soon is None:
                    loop = asyncio.get_running_loop()
                    self._save_soon = loop.call_soon(self._save_unsettled, store, context)
            else:
                await self._saved_unsettled()
                await store.save(task, context)
        for tap in self.taps:
            tap.put_nowait(event)

    def _save_unsettled(self, store: TaskStore, context: ServerCallContext) -> None:
        """The run let the loop go with an unsettled state not saved yet: save it now."""
        self._save_soon = None
        saving = asyncio.ensure_future(self._save_if_unsettled(store, context, self._saving))
        saving.add_done_callback(_log_failed_save)
        self._saving = saving

    async def _save_if_unsettled(
        self, store: TaskStore, context: ServerCallContext, before: asyncio.Future[None] | None
    ) -> None:
        if before is not None:  # saves of one task in the order of its states
            with contextlib.suppress(Exception):
                await before
        # The state the run left, unless it settled since (its own save writes that one).
        task = self.task
        if task is not None and task.status.state not in SETTLED_STATES:
            await store.save(task, context)

    async def _saved_unsettled(self) -> None:
        """Before a settled state is saved: the unsettled one not saved yet never is; one
        being saved is waited for (its error is the run's, as an at-once save's was)."""
        if self._save_soon is not None:
            self._save_soon.cancel()
            self._save_soon = None
        saving, self._saving = self._saving, None
        if saving is not None:
            await saving

    async def settle(self, task: Task, settled: Settled | None = None) -> None:
        """The task of a run that published no event before (``OneShotUpdater``), in its
        final form: saved once, as its last event's save would have saved it. ``settled`` is
        kept in the call's state for the answer's writer (``FastRoute``). ``task`` may be
        ``settled``'s stand-in (``takes_stand_in``): the store's save reads its id and state
        from ``settled``, and the task itself is parsed from its row when read (``task``)."""
        store, context = self._store, self._context
        if store is None or context is None or self.task is not None or self.message is not None:
            raise RuntimeError("AppliedEvents settles only a new task, with a store and a context")
        if settled is not None:
            context.state[SETTLED] = settled
        if settled is not None and task is settled.stand_in and settled.parsed is None:
            if not self.takes_stand_in:
                raise RuntimeError("AppliedEvents' store does not take a stand-in")
            self._settled = settled
        else:
            self.task = task
        await store.save(task, context)
        for tap in self.taps:
            tap.put_nowait(self.task)

    def close(self) -> None:
        """The run ended: every subscription ends after what it was given."""
        for tap in self.taps:
            tap.put_nowait(None)

    async def enqueue_event(self, event: Event) -> None:
        if isinstance(event, Message):
            if self.task is not None:
                self._refuse(
                    "Received Message object in task mode. Use TaskStatusUpdateEvent or "
                    "TaskArtifactUpdateEvent instead."
                )
            if self.message is not None:
                self._refuse("Multiple Message objects received.")
            self.message = event
            return
        if self.message is not None:
            self._refuse(
                f"Received {type(event).__name__} in message mode. Use Task with "
                "TaskStatusUpdateEvent and TaskArtifactUpdateEvent instead."
            )
        if isinstance(event, Task):
            if self.task is not None:
                log.error("Task %s already exists. Ignoring task replacement.", self.task.id)
                return
        elif self.task is None and isinstance(event, TaskStatusUpdateEvent):
            self._refuse(f"Agent should enqueue Task before {type(event).__name__} event")
        else:
            # The SDK's consumer takes the context of each update (TaskManager checks it).
            self._context_id = event.context_id
            if self._manager is not None:
                self._manager.context_id = event.context_id
        await self.apply(event)

    def _refuse(self, message: str) -> NoReturn:
        self.violation = InvalidAgentResponseError(message)
        raise self.violation

    async def fail(self, task_id: str, *, by_agent: bool) -> None:
        """End the task FAILED after the run raised, as the SDK's consumer does: the task the
        events built, or (``by_agent``: the executor raised before it made one) a new one."""
        failed = TaskStatus(state=TaskState.TASK_STATE_FAILED)
        failed.timestamp.FromDatetime(datetime.now(UTC))
        # What a client shows as the error (the node log has the details).
        failed.message.CopyFrom(
            new_text_message(
                FAILED_TEXT,
                role=Role.ROLE_AGENT,
                task_id=task_id,
                context_id=self.context_id or None,
            )
        )
        task = self.task
        if task is None:
            if not by_agent:
                return
            created = await self.manager.ensure_task_id(task_id, self.context_id)
            task = Task()
            task.CopyFrom(created)
            task.status.CopyFrom(failed)
            await self.apply(task)
            return
        if task.status.state in TERMINAL_STATES:
            return
        await self.apply(
            TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=failed)
        )


def _log_failed_save(saving: asyncio.Future[None]) -> None:
    if not saving.cancelled() and saving.exception() is not None:
        log.warning("could not save a running task's state: %s", saving.exception())


def _apply_update(task: Task, event: TaskStatusUpdateEvent | TaskArtifactUpdateEvent) -> None:
    """Apply an update to ``task`` in place, as ``TaskManager.save_task_event`` does to its
    current task before it saves it."""
    if isinstance(event, TaskStatusUpdateEvent):
        if task.status.HasField("message"):
            task.history.append(task.status.message)
        if event.metadata:
            task.metadata.MergeFrom(event.metadata)
        task.status.CopyFrom(event.status)
    else:
        append_artifact(task, event.artifact, append=event.append)


class _Running:
    """A task the fast path is running: what a ``CancelTask`` for it needs. (A class with
    slots, its ``asyncio.Event`` made only for a cancel that waits for the run's end: ~3 k
    instructions a task less than a dataclass with one made each time.)"""

    __slots__ = ("_ended", "cancel_requested", "ended", "events", "request")

    def __init__(self, request: asyncio.Task[object], events: AppliedEvents) -> None:
        self.request = request
        self.events = events
        self.cancel_requested = False
        #: Whether the run has ended.
        self.ended = False
        self._ended: asyncio.Event | None = None

    def end(self) -> None:
        """The run has ended: whoever waits for it goes on."""
        self.ended = True
        if self._ended is not None:
            self._ended.set()

    async def wait(self) -> None:
        """Until the run has ended."""
        if self.ended:
            return
        if self._ended is None:
            self._ended = asyncio.Event()
        await self._ended.wait()


class FastPath:
    """Runs eligible blocking sends (see the module docstring) for one node's handler."""

    def __init__(
        self,
        executor: MeshExecutor,
        store: TaskStore,
        contexts: RequestContextBuilder,
        ids: IDGenerator | None = None,
        *,
        plain_contexts: bool = False,
    ) -> None:
        self.executor = executor
        self.store = store
        self.contexts = contexts
        #: The task id generator ``contexts`` was given (None: the SDK's default, uuid4).
        self.ids = ids
        #: Whether ``contexts`` is a ``SimpleRequestContextBuilder`` given ``ids``, no context
        #: id generator and no task store (it reads no referred task): its ``build`` is then
        #: ``RequestContext(...)`` of its arguments, made here without the coroutine.
        self.plain_contexts = plain_contexts
        #: Tasks running here now, by id.
        self.running: dict[str, _Running] = {}

    def takes(self, params: SendMessageRequest, context: ServerCallContext | None = None) -> bool:
        """Whether ``params`` is a new blocking send of a function skill. Requests the executor
        would reject for their metadata or skill name go to the SDK (their REJECTED task is
        built there). Decided once per call: with ``context`` the answer is kept in its state
        (``FastRoute`` decides before the handler runs)."""
        if context is not None:
            decided = context.state.get(TAKEN)
            if isinstance(decided, bool):
                return decided
        taken = self._takes(params, context)
        if context is not None:
            context.state[TAKEN] = taken
        return taken

    def _takes(self, params: SendMessageRequest, context: ServerCallContext | None) -> bool:
        config = params.configuration
        if (
            params.message.task_id
            or config.return_immediately
            or config.HasField("task_push_notification_config")
        ):
            return False
        try:
            req = self.executor.read_request(params.message, context)
            resolve = self.executor.dispatcher.resolve
            if req.skill_id:
                # A skill named is found by its name alone: the parts are not read for it.
                skill = resolve(req.skill_id, has_data=False, has_text=False)
            else:
                # ``[:]``: a repeated field's items as a list at once; ``list()`` (and
                # ``for``) index it until an IndexError, made and dropped (~2 us).
                parts = params.message.parts[:]
                # Whether there is one, not its value (get_data_parts converts each to Python).
                has_data = any(part.HasField("data") for part in parts)
                # A typed skill's input as a JSON object in text takes this path too.
                as_text = None if has_data else json_object(parts)
                skill = resolve(
                    None,
                    has_data=has_data,
                    has_text=bool(get_text_parts(parts)),
                    text_object=as_text,
                )
        except SkillInputError:
            return False
        if skill.llm:
            # An LLM turn: its tools may ask or delegate; a turn that stops waiting ends
            # INPUT_REQUIRED here as on the SDK's path (the answer, a message naming the task,
            # goes to the SDK's handler, which loads the task from the store either way).
            return True
        # A function skill that may ask (``ctx.ask``) goes through the SDK.
        taken = skill.typed and skill.handler is not None and not skill.asks
        if taken and context is not None:
            # Its run writes no resume point and no session: the store may write its task's
            # first state with its last.
            mark_single_write(context)
        return taken

    async def send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        """Run the new task of ``params`` to its end; the task (or the executor's message).
        Params the SDK's handler would refuse raise its error here."""
        if missing_required(params):
            validate_proto_required_fields(params)  # raises the SDK's own error
        validate_history_length(params.configuration)
        named_context = params.message.context_id
        # The ids the builder would make (its generators are given none of the request:
        # ``IDGeneratorContext``, a pydantic model, made once here, not twice per request).
        ids = self.ids
        task_id = ids.generate(_NO_IDS) if ids is not None else uuid4_text()
        if self.plain_contexts:
            request = RequestContext(
                call_context=context,
                request=params,
                task_id=task_id,
                context_id=named_context or uuid4_text(),
                task_id_generator=ids,
            )
        else:
            request = await self.contexts.build(
                context=context,
                params=params,
                task_id=task_id,
                context_id=named_context or uuid4_text(),
                task=None,
            )
        if not named_context:
            # Made for this request just now: no session has it (the turn need not read one).
            context.state[NEW_CONTEXT] = request.context_id
        events = AppliedEvents.direct(
            self.store,
            context,
            task_id=task_id,
            context_id=str(request.context_id),
            initial_message=request.message,
        )
        await self._run(request, events)
        if events.message is not None:
            return events.message
        settled = events.settled
        if settled is not None and context.state.get(WRITES_SETTLED) is True:
            # The caller writes the answer from ``settled`` (``FastRoute``): its stand-in
            # names it (``Settled.is_of``), and the task is not parsed.
            assert settled.stand_in is not None
            return settled.stand_in
        if events.task is None:
            raise InvalidAgentResponseError(f"Agent made no task or message for task {task_id}")
        return events.task

    async def _run(self, request: RequestContext, events: AppliedEvents) -> None:
        """``MeshExecutor.execute`` in the request's own asyncio task, and on a ``CancelTask``
        for it ``MeshExecutor.cancel``."""
        current = asyncio.current_task()
        assert current is not None
        task_id = str(request.task_id)
        running = _Running(current, events)
        self.running[task_id] = running
        try:
            await self.executor.execute(request, events)
        except asyncio.CancelledError:
            if not running.cancel_requested:
                raise
            current.uncancel()  # canceled by CancelTask, not by the server: answer normally
            await self.executor.cancel(request, events)
            if events.task is not None and events.task.status.state not in TERMINAL_STATES:
                # An executor whose cancel wrote no end: the task is CANCELED all the same.
                canceled = TaskStatus(state=TaskState.TASK_STATE_CANCELED)
                await events.apply(
                    TaskStatusUpdateEvent(
                        task_id=task_id, context_id=events.task.context_id, status=canceled
                    )
                )
        except Exception as exc:
            try:
                # An A2A error the executor raised before any task (a direct reply's failure)
                # is the whole answer: no task is made for it.
                made = not isinstance(exc, A2AError) and exc is not events.violation
                await events.fail(task_id, by_agent=made)
            except Exception:
                log.exception("task %s: could not record its failure", task_id)
            raise
        finally:
            del self.running[task_id]
            running.end()
            events.close()

    def runs(self, task_id: str) -> bool:
        """Whether task ``task_id`` runs here now."""
        return task_id in self.running

    async def subscribe(
        self, task_id: str, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        """Follow task ``task_id``, which runs here (``runs``): the task as it is now, then
        each event applied to it, until the run ends. The SDK's checks first: the caller's own
        task (owner scope)."""
        running = self.running.get(task_id)
        if running is None or await self.store.get(task_id, context) is None:
            raise TaskNotFoundError
        events = running.events
        # No await from here to the tap: nothing applied in between is missed or repeated.
        if running.ended:
            if events.task is not None:
                yield events.task
            return
        tap: asyncio.Queue[Event | None] = asyncio.Queue()
        events.taps.append(tap)
        try:
            if events.task is not None:
                yield events.task
            while (event := await tap.get()) is not None:
                yield event
        finally:
            events.taps.remove(tap)

    async def cancel(self, task_id: str, context: ServerCallContext) -> Task | None:
        """Stop task ``task_id`` and return it CANCELED; None when it is not (or no longer)
        running here (the SDK's handler answers then). The SDK's checks first: the caller's
        own task (owner scope), not terminal."""
        running = self.running.get(task_id)
        if running is None:
            return None
        task = await self.store.get(task_id, context)
        if task is None:
            raise TaskNotFoundError
        if running.ended:
            return None  # it ended while we read it
        if task.status.state in TERMINAL_STATES:
            raise TaskNotCancelableError
        if not running.cancel_requested:
            # Once: a second CancelTask must not cut the first one's CANCELED write.
            running.cancel_requested = True
            running.request.cancel()
        await running.wait()
        canceled = running.events.task
        if canceled is None:
            raise TaskNotFoundError
        return canceled
