"""``MeshRequestHandler``: a node's A2A request handler, composed around the SDK's.

It implements the SDK's public ``RequestHandler`` interface and owns a ``DefaultRequestHandler``
built from parts it keeps references to (the executor, the watched task store, the request
context builder), so nothing here reads the SDK handler's private state. It adds two things:

* **idempotent sends**: a repeated message (same owner, caller and ``messageId``: see
  ``mesh._a2a.idempotency``) gets the task it started back, after waiting for it if it still
  runs here, on ``SendMessage`` and ``SendStreamingMessage`` alike;
* **the fast path** (``mesh._a2a.fastpath``): a new blocking send of a function skill or an
  LLM turn is run by ``FastPath`` instead of the SDK's task machinery; ``CancelTask`` of such a
  task stops it there and ``SubscribeToTask`` follows it there.

* **tasks that wait** (``mesh._asks``): a message naming a task (``taskId``) is taken only
  while the task waits for input: the answer is checked against the open question's schema
  first (an invalid one leaves the task waiting, its status naming the field, and runs
  nothing), and a task that is working gets -32004 (the SDK would queue the message and run
  the task again after it ends). A cancel of a waiting task drops its resume point and, when
  the SDK only rewrote the state (a task no longer parked in this process), replaces the
  question with ``canceled by request``. ``resume`` is how the node itself resumes a task
  (after a restart, at a waiting task's deadline): a message through the SDK's handler, so
  subscribers see the run like any other.

* **live progress** (``mesh._a2a.relay``): a ``SendStreamingMessage`` marks its call, and a
  ``SubscribeToTask`` counts as a follower of its task while it lasts, so the run relays its
  progress and its delegations' (a blocking send pays nothing for it).

Everything else is the SDK handler's, unchanged: the route (``create_jsonrpc_routes``) parses,
checks the ``A2A-Version`` and builds the call context for both paths alike.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from a2a.auth.user import User
from a2a.helpers import get_data_parts, get_text_parts, new_text_part
from a2a.server.agent_execution import RequestContext, SimpleRequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler, RequestHandler
from a2a.server.tasks import TaskStore
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import validate_history_length

from mesh._a2a.executor import DIRECT, MESSAGE_KEY, RESUME, MeshExecutor, answers_named
from mesh._a2a.fastpath import FastPath
from mesh._a2a.idempotency import (
    IdempotencyKeys,
    WatchedTaskStore,
    message_key,
    replay,
    send_answer,
)
from mesh._a2a.json_text import json_object
from mesh._a2a.push import PushParts
from mesh._a2a.questions import question_message, question_metadata, questions_of
from mesh._a2a.relay import mark_streamed
from mesh._a2a.states import INTERRUPTED_STATES, SETTLED_STATES, TERMINAL_STATES
from mesh._a2a.store import SqliteTaskStore, mark_blocking_send
from mesh._asks import TASKS_EXTENSION, Question, answer_of
from mesh._errors import SchemaViolation

__all__ = ["INTERRUPTED_TASK_TIMEOUT_S", "MeshRequestHandler"]

log = logging.getLogger("mesh._a2a")

#: Seconds the SDK keeps a waiting task's machinery (two asyncio tasks) in memory; the next
#: message rebuilds it from the store. Bounds what 10,000 waiting tasks cost.
INTERRUPTED_TASK_TIMEOUT_S = 30.0
CANCELED_TEXT = "canceled by request"
# a2a-sdk 1.3 has the parameter; on 1.2.x a waiting task's machinery stays until a restart.
_RELEASE_WAITING: dict[str, Any] = (
    {"interrupted_task_timeout": INTERRUPTED_TASK_TIMEOUT_S}
    if "interrupted_task_timeout" in inspect.signature(DefaultRequestHandler).parameters
    else {}
)


async def _followed(first: Task, states: AsyncIterator[Task]) -> AsyncGenerator[Event, None]:
    """The events of a task another replica runs, after ``first``: what changed from each
    state to the next (``SqliteTaskStore.follow``), its artifacts before its status."""
    before, streaming = first, set[str]()
    async for task in states:
        for event in _changes(before, task, streaming):
            yield event
        before = task


def _changes(before: Task, after: Task, streaming: set[str]) -> list[Event]:
    """The events that make ``before`` into ``after``. An artifact that grew by parts is a
    chunk (``append``, only the new parts). The answer (``AnswerStream``: ``answer-<task>``)
    new is a first chunk and replaced whole its last (``lastChunk``), and one still open
    (``streaming``) when the task settles is sent whole as its last chunk then; any other new
    or replaced artifact is whole (``lastChunk``). Then the status, when it changed: a state
    that settles the task ends with one status update."""
    events: list[Event] = []
    known = {a.artifact_id: a for a in before.artifacts}
    settled = after.status.state in SETTLED_STATES
    answer = f"answer-{after.id}"

    def send(artifact: Artifact, *, append: bool = False, last: bool = True) -> None:
        if last:
            streaming.discard(artifact.artifact_id)
        else:
            streaming.add(artifact.artifact_id)
        events.append(
            TaskArtifactUpdateEvent(
                task_id=after.id,
                context_id=after.context_id,
                artifact=artifact,
                append=append,
                last_chunk=last,
            )
        )

    for artifact in after.artifacts:
        old = known.get(artifact.artifact_id)
        if old is not None and old == artifact:
            if settled and artifact.artifact_id in streaming:
                send(artifact)
            continue
        kept = 0 if old is None else len(old.parts)
        if old is not None and kept < len(artifact.parts) and artifact.parts[:kept] == old.parts:
            added = Artifact()
            added.CopyFrom(artifact)
            del added.parts[:kept]
            send(added, append=True, last=False)
            if settled:
                send(artifact)
            continue
        first_chunk = artifact.artifact_id == answer and old is None and not settled
        send(artifact, last=not first_chunk)
    if after.status != before.status or settled:
        events.append(
            TaskStatusUpdateEvent(
                task_id=after.id, context_id=after.context_id, status=after.status
            )
        )
    return events


class _Owner(User):
    """The owner of a task the node resumes itself (the store scopes tasks by user name)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return bool(self._name)

    @property
    def user_name(self) -> str:
        return self._name


class MeshRequestHandler(RequestHandler):
    """The SDK's ``DefaultRequestHandler`` plus idempotent sends and the fast path.

    ``fastpath=False`` sends every request through the SDK (``MESH_FASTPATH=0``)."""

    def __init__(
        self,
        *,
        executor: MeshExecutor,
        task_store: TaskStore,
        agent_card: AgentCard,
        keys: IdempotencyKeys,
        fastpath: bool = True,
        push: PushParts | None = None,
    ) -> None:
        self.executor = executor
        self.keys = keys
        self._sqlite = task_store if isinstance(task_store, SqliteTaskStore) else None
        #: The store both paths save to: it knows which tasks run here.
        self.task_store = WatchedTaskStore(task_store)
        # The SQLite store generates new task ids itself, so it knows they are not stored yet.
        ids = task_store.id_generator() if isinstance(task_store, SqliteTaskStore) else None
        #: Builds each send's RequestContext (its task and context ids), on both paths.
        self.request_contexts = SimpleRequestContextBuilder(
            should_populate_referred_tasks=False, task_store=None, task_id_generator=ids
        )
        sdk = DefaultRequestHandler(
            agent_executor=executor,
            task_store=self.task_store,
            agent_card=agent_card,
            request_context_builder=self.request_contexts,
            # Push notifications (mesh._a2a.push): the SDK serves the config methods and hands
            # each event to the outbox; sends with a push config never take the fast path.
            push_config_store=push.configs if push is not None else None,
            push_sender=push.outbox if push is not None else None,
            push_url_validator=push.check if push is not None else None,
            **_RELEASE_WAITING,
        )
        self._close_sdk = sdk.aclose
        #: The SDK's handler (used through its interface): all the fast path does not serve.
        self.sdk: RequestHandler = sdk
        #: None when turned off or when the agent has no skill the fast path serves.
        self.fastpath: FastPath | None = None
        skills = executor.dispatcher.agent.all_skills
        if fastpath and any(s.llm or (s.typed and s.handler is not None) for s in skills):
            self.fastpath = FastPath(
                executor, self.task_store, self.request_contexts, ids, plain_contexts=True
            )
        executor.clock.expire = self._expire

    async def aclose(self) -> None:
        """Stop the deadline timers and the node's own resumes, then the SDK's handler
        (cancels the tasks it still runs)."""
        await self.executor.clock.aclose()
        await self._close_sdk()

    # -- tasks that wait ----------------------------------------------------------------------
    async def resume(self, owner: str, task_id: str, context_id: str, why: str) -> None:
        """Run a waiting (or resuming) task again on the node's own account: ``why`` is
        ``"restart"`` (run it with its recorded answers) or ``"deadline"`` (end it FAILED).
        Through the SDK's handler, so the task's subscribers see it; the message is marked in
        the task's history (``metadata["urn:mesh:tasks:v1"]["resume"]``)."""
        message = Message(
            role=Role.ROLE_USER,
            message_id=str(uuid.uuid4()),
            task_id=task_id,
            context_id=context_id,
            parts=[new_text_part(f"(resumed by the node: {why})")],
        )
        message.metadata.update({TASKS_EXTENSION: {"resume": why}})
        call = ServerCallContext(user=_Owner(owner))
        call.state[RESUME] = why
        try:
            await self.sdk.on_message_send(SendMessageRequest(message=message), call)
        except A2AError as exc:  # it ended meanwhile (answered, canceled): nothing to resume
            log.info("task %s: not resumed (%s): %s", task_id, why, exc)

    async def _expire(self, owner: str, task_id: str, context_id: str) -> None:
        task = await self.task_store.get(task_id, ServerCallContext(user=_Owner(owner)))
        if task is not None and task.status.state in INTERRUPTED_STATES:
            await self.resume(owner, task_id, context_id, "deadline")

    async def _follow_up(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | None:
        """Check a message naming a task before the SDK runs it. A task waiting on mesh's
        questions takes a valid answer (None: go on); an invalid answer is answered here with
        the task still waiting. A task that is working gets -32004. Unknown, terminal or
        foreign tasks: None, the SDK answers as usual."""
        message = params.message
        task = await self.task_store.get(message.task_id, context)
        if task is None or task.status.state in TERMINAL_STATES:
            return None
        if message.context_id and message.context_id != task.context_id:
            return None  # the SDK's -32602 names both contexts
        if task.status.state not in INTERRUPTED_STATES:
            state = TaskState.Name(task.status.state).removeprefix("TASK_STATE_").lower()
            raise UnsupportedOperationError(
                message=f"task {task.id} is {state}: it takes a message only while it waits "
                "for input"
            )
        questions = questions_of(task)
        if not questions:
            return None
        named = answers_named(message)
        chosen = [q for q in questions if q.id == named] if named is not None else questions[:1]
        if not chosen:
            raise InvalidParamsError(
                message=f"question {named!r} is not open on task {task.id}: open are "
                + ", ".join(q.id for q in questions)
            )
        question = chosen[0]
        parts = list(message.parts)
        try:
            value = answer_of(
                question, get_data_parts(parts), get_text_parts(parts), json_object(parts)
            )
            if question.schema is not None:
                # Loaded on the first answer: jsonschema costs a node ~3 MB and 50 ms at start.
                from mesh._schema_check import check

                check(value, question.schema)
        except SchemaViolation as exc:
            return await self._invalid(task, questions, question.id, exc.errors, message, context)
        if question.kind == "auth" and self._sqlite is not None:
            self._sqlite.redact(task.id, message.message_id)
        return None

    async def _invalid(
        self,
        task: Task,
        questions: list[Question],
        question_id: str,
        errors: list[dict[str, str]],
        message: Message,
        context: ServerCallContext,
    ) -> Task:
        """The task, still waiting, with the answer in its history and its status naming what
        is wrong with it (nothing runs)."""
        marked = [
            replace(q, invalid=tuple(errors)) if q.id == question_id else q for q in questions
        ]
        updated = Task()
        updated.CopyFrom(task)
        answer = updated.history.add()
        answer.CopyFrom(message)
        answer.task_id, answer.context_id = task.id, task.context_id
        updated.status.message.CopyFrom(question_message(task.id, task.context_id, marked))
        updated.status.timestamp.GetCurrentTime()
        updated.metadata.update(question_metadata(marked))
        await self.task_store.save(updated, context)
        return updated

    # -- sends: idempotent, and the fast path ------------------------------------------------
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        return _answer(await self.on_message_send_unanswered(params, context), params)

    async def on_message_send_unanswered(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """``on_message_send``'s task (or message) before ``send_answer`` trims it: the fast
        route writes the answer from it (``send_answer_cut``) without a copy."""
        message = params.message
        key = message_key(message, context)
        if key is None:
            return await self._send(params, context)
        context.state[MESSAGE_KEY] = (message, key)  # the run's key: read once
        existing = await self.keys.claim(key)
        if existing is not None:
            return await replay(self.task_store, existing, params, context)
        # From here this send owns ``key`` until it ends.
        try:
            return await self._send(params, context)
        finally:
            self.keys.end(key)

    async def _send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        if params.message.task_id:
            early = await self._follow_up(params, context)
            if early is not None:
                return early
        else:  # -32005 for a part the skill does not take (mesh._a2a.artifacts)
            self.executor.check_send(params.message, context)
        if not params.configuration.return_immediately:
            mark_blocking_send(context)
        if self.fastpath is not None and self.fastpath.takes(params, context):
            return await self.fastpath.send(params, context)
        if _direct(params, context):
            return await self._reply(params, context)
        return await self.sdk.on_message_send(params, context)

    async def _reply(self, params: SendMessageRequest, context: ServerCallContext) -> Message:
        """A new send to a ``reply="message"`` skill the fast path does not take (streamed, or
        the fast path off): its one ``Message``, run here in the request's task
        (``MeshExecutor.reply``) after the SDK handler's own checks, in its order (required
        fields, ``historyLength``). Not through the SDK's task machinery, whose producer and
        consumer each log a failure's traceback again (ours is logged once); the FAILED task
        it saved for a failure is saved as it was (``_failed_reply``)."""
        validate_proto_required_fields(params)
        validate_history_length(params.configuration)
        request = await self.request_contexts.build(
            params=params,
            task_id=None,
            context_id=params.message.context_id or None,
            task=None,
            context=context,
        )
        try:
            return await self.executor.reply(request)
        except Exception:
            try:
                await self._failed_reply(request, context)
            except Exception:  # the answer is the run's error all the same, as in the SDK's
                log.exception("direct reply: could not save its FAILED task")
            raise

    async def _failed_reply(self, request: RequestContext, context: ServerCallContext) -> None:
        """What the SDK's task machinery left of a direct reply that raised, kept as it was:
        a task of the send's message saved SUBMITTED, then FAILED (its consumer's
        ``_write_failed_status`` for a request that failed before any task), without its
        log records (docs/node.md, "Direct replies": the one exception to "nothing is
        stored")."""
        history = [request.message] if request.message is not None else []
        task = Task(
            id=str(request.task_id),
            context_id=str(request.context_id),
            status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
            history=history,
        )
        await self.task_store.save(task, context)
        task.status.state = TaskState.TASK_STATE_FAILED
        task.status.timestamp.FromDatetime(datetime.now(UTC))
        await self.task_store.save(task, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        key = message_key(params.message, context)
        existing = await self.keys.claim(key) if key is not None else None
        if existing is not None:
            yield await replay(self.task_store, existing, params, context)
            return
        try:
            early = await self._follow_up(params, context) if params.message.task_id else None
            if early is not None:
                yield early
                return
            if not params.message.task_id:
                self.executor.check_send(params.message, context)
            if _direct(params, context):
                yield await self._reply(params, context)  # its one event (no progress)
                return
            mark_streamed(context)  # the run's progress, and its children's, is relayed
            async for event in self.sdk.on_message_send_stream(params, context):
                yield event
        finally:
            if key is not None:
                self.keys.end(key)

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        if self.fastpath is not None:
            canceled = await self.fastpath.cancel(params.id, context)
            if canceled is not None:
                return canceled
        waits = self.executor.waits
        wait = await waits.load(resolve_user_scope(context), params.id) if waits else None
        if wait is not None and wait.kind == "turn":
            # A turn waiting on child tasks: they are canceled first (and theirs by them).
            await self.executor.cancel_children(wait.turn)
        task = await self.sdk.on_cancel_task(params, context)
        if task is not None:
            self.executor.forget(resolve_user_scope(context), task.id)
            if task.status.state == TaskState.TASK_STATE_CANCELED and questions_of(task):
                # The SDK only rewrote the state (no executor ran: the task waited, and its
                # machinery was released or belongs to a process before a restart).
                task = await self._canceled(task, context)
        return task

    async def _canceled(self, task: Task, context: ServerCallContext) -> Task:
        updated = Task()
        updated.CopyFrom(task)
        updated.history.append(updated.status.message)
        updated.status.message.CopyFrom(
            Message(
                role=Role.ROLE_AGENT,
                message_id=str(uuid.uuid4()),
                task_id=task.id,
                context_id=task.context_id,
                parts=[new_text_part(CANCELED_TEXT)],
            )
        )
        updated.status.timestamp.GetCurrentTime()
        updated.metadata.update(
            {
                "error": {"reason": "canceled", "message": CANCELED_TEXT},
                TASKS_EXTENSION: {"questions": []},
            }
        )
        await self.task_store.save(updated, context)
        return updated

    # -- the rest: the SDK's ----------------------------------------------------------------
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        return await self.sdk.on_get_task(params, context)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        return await self.sdk.on_list_tasks(params, context)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        store = self.task_store.inner
        if (
            isinstance(store, SqliteTaskStore)
            and store.shared
            and not self.task_store.running(params.id)
        ):
            # A shared store, and the task does not run here (another replica runs it, or it
            # waits): followed through the database and the replicas' feed (task_feed).
            states = store.follow(params.id, context)
            try:
                task = await anext(states, None)
                if task is None:
                    raise TaskNotFoundError
                if task.status.state in TERMINAL_STATES:
                    raise UnsupportedOperationError(
                        message=f"Task {task.id} is in terminal state: "
                        f"{TaskState.Name(task.status.state)}"
                    )
                yield task
                async for event in _followed(task, states):
                    yield event
            finally:
                await states.aclose()
            return
        # While someone follows the task, its run relays progress (mesh._a2a.relay).
        followers = self.executor.followers
        followers.add(params.id)
        try:
            if self.fastpath is not None and self.fastpath.runs(params.id):
                # A blocking send the fast path runs (the SDK knows no run of it): followed there.
                async for event in self.fastpath.subscribe(params.id, context):
                    yield event
                return
            async for event in self.sdk.on_subscribe_to_task(params, context):
                yield event
        finally:
            followers.discard(params.id)

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self.sdk.on_create_task_push_notification_config(params, context)

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        return await self.sdk.on_get_task_push_notification_config(params, context)

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        return await self.sdk.on_list_task_push_notification_configs(params, context)

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self.sdk.on_delete_task_push_notification_config(params, context)

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        return await self.sdk.on_get_extended_agent_card(params, context)


def _direct(params: SendMessageRequest, context: ServerCallContext) -> bool:
    """Whether ``params`` is a new send to a ``reply="message"`` skill (``check_send`` kept its
    input) that the handler runs itself. One with a push config goes to the SDK as before
    (which stores the config for its task id)."""
    return DIRECT in context.state and not params.configuration.HasField(
        "task_push_notification_config"
    )


def _answer(result: Task | Message, params: SendMessageRequest) -> Task | Message:
    return send_answer(result, params) if isinstance(result, Task) else result
