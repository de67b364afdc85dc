"""``FastPath``: a blocking ``SendMessage`` of a function skill without the SDK's task machinery.

The SDK's ``DefaultRequestHandler`` runs every message through an ``ActiveTask`` (producer and
consumer asyncio tasks, two event queues, a subscriber queue): most of a node's CPU per request
for a skill whose work takes microseconds. This path serves the narrow, hot case directly:

* JSON-RPC ``SendMessage`` with an ``A2A-Version`` the SDK accepts (1.x),
* a new task (no ``message.taskId``), a blocking send (no ``returnImmediately``), no push config,
* whose skill resolves to a typed skill with a Python handler (no model).

Anything else, including any request the SDK would answer with an error (bad JSON-RPC, params
that do not parse or miss a required field, a bad ``historyLength``, an unknown skill), falls
through to the SDK unchanged: ``serve`` returns False before it has sent anything.

What it shares with the SDK path, so both produce the same task: the request is parsed with the
SDK's own ``ParseDict`` and validators, the call context comes from the SDK's context builder,
ids from the handler's request-context builder, the work is ``MeshExecutor.execute`` (metrics,
log line, idempotency key, deadline, REJECTED on invalid input), its events are applied by the
SDK's ``TaskManager`` to the handler's (watched) task store exactly as the ``ActiveTask``
consumer would apply them, duplicates go through the same ``IdempotencyKeys.claim`` and
``IdempotentRequestHandler._replay``, and the response is built like the SDK's JSON-RPC
dispatcher builds it. What it skips: the event queues and the two asyncio tasks per request.

A task served here is not in the SDK's registry of active tasks, so ``FastPathHandler`` keeps
its own record of them: a duplicate send waits for the running task, and ``CancelTask`` stops it,
as they would for a task the SDK runs. This module leans on a2a-sdk internals (the request
handler's builders and watched store, ``TaskManager``): pyproject pins the SDK's minor version
for that reason, and tests/test_node_fastpath.py compares both paths on every upgrade.
Set ``MESH_FASTPATH=0`` to send everything through the SDK (the tests compare both paths).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from a2a.helpers import get_data_parts, get_text_parts
from a2a.server.agent_execution import RequestContext
from a2a.server.agent_execution.active_task import INTERRUPTED_TASK_STATES, TERMINAL_TASK_STATES
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.tasks import TaskManager
from a2a.types import (
    CancelTaskRequest,
    SendMessageRequest,
    SendMessageResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskStatusUpdateEvent,
)
from a2a.utils import constants
from a2a.utils.errors import (
    A2AError,
    InternalError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import validate_history_length
from google.protobuf.json_format import MessageToDict, ParseDict
from jsonrpc.jsonrpc2 import JSONRPC20Response  # type: ignore[import-untyped]
from packaging.version import InvalidVersion, Version
from starlette.requests import Request
from starlette.responses import JSONResponse

from mesh.a2a.idempotency import IdempotentRequestHandler, message_key, send_answer
from mesh.a2a.store import BLOCKING_SEND
from mesh.errors import SkillInputError

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from mesh.a2a.executor import MeshExecutor

__all__ = ["FastPath", "FastPathHandler"]

log = logging.getLogger("mesh.a2a")

_SETTLED = TERMINAL_TASK_STATES | INTERRUPTED_TASK_STATES
_VERSION_HEADER = constants.VERSION_HEADER.lower().encode()


def _version_ok(scope: Scope) -> bool:
    """The SDK's check (``validate_version(1.0)``): same major version. A missing header means
    0.3 to the SDK; such a request falls through and gets the SDK's error."""
    for name, value in scope.get("headers", ()):
        if name == _VERSION_HEADER:
            text = value.decode("latin-1")
            if text == constants.PROTOCOL_VERSION_1_0:
                return True
            try:
                return Version(text).major == 1
            except InvalidVersion:
                return False
    return False


class _DirectQueue:
    """Stands in for the ``EventQueue`` the executor writes to: applies each event at once,
    the way ``a2a.server.agent_execution.active_task.EventConsumer`` does for a new task
    (the executor's first event is the ``Task`` with the message in its history)."""

    def __init__(self, manager: TaskManager) -> None:
        self.manager = manager

    async def enqueue_event(self, event: Any) -> None:
        if isinstance(event, Task):
            # EventConsumer._handle_initial_task: a new task id, nothing stored yet.
            if await self.manager.get_task() is None:
                await self.manager.save_task_event(event)
            return
        if isinstance(event, TaskStatusUpdateEvent | TaskArtifactUpdateEvent):
            # EventConsumer._handle_task_modification_event (message_to_save is already in
            # the history of the initial task).
            await self.manager.ensure_task_id(str(self.manager.task_id), event.context_id)
            self.manager.context_id = event.context_id
            await self.manager.process(event)
            return
        raise TypeError(f"unexpected event {type(event).__name__} from the executor")


@dataclass
class _Running:
    """A task the fast path is running: what a cancel or a waiting duplicate needs."""

    request: asyncio.Task[Any]
    manager: TaskManager
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_requested: bool = False


class FastPathHandler(IdempotentRequestHandler):
    """The node's request handler: the SDK's, plus what it must know of the tasks the fast
    path runs outside its ``ActiveTaskRegistry`` (to wait for them and to cancel them)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fast_running: dict[str, _Running] = {}

    async def _replay(
        self, task_id: str, params: SendMessageRequest, context: ServerCallContext
    ) -> Task:
        # A duplicate of a running task waits for it, as for a task in the SDK's registry.
        running = self.fast_running.get(task_id)
        if running is not None and not params.configuration.return_immediately:
            await running.done.wait()
        return await super()._replay(task_id, params, context)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        running = self.fast_running.get(params.id)
        if running is None:
            return await super().on_cancel_task(params, context)  # type: ignore[no-any-return]
        # The SDK's checks first (owner scope, terminal state), then ActiveTask.cancel's work:
        # stop the run, let the executor write CANCELED (see FastPath._run).
        task = await self._watched.get(params.id, context)
        if task is None:
            raise TaskNotFoundError
        if task.status.state in TERMINAL_TASK_STATES:
            raise TaskNotCancelableError
        running.cancel_requested = True
        running.request.cancel()
        await running.done.wait()
        canceled = await running.manager.get_task()
        if canceled is None:
            raise TaskNotFoundError
        return canceled


class FastPath:
    """Serves eligible ``SendMessage`` calls (see the module docstring) for one node."""

    def __init__(self, executor: MeshExecutor, handler: FastPathHandler) -> None:
        self.executor = executor
        self.handler = handler
        self._contexts = DefaultServerCallContextBuilder()

    async def serve(self, body: Any, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer ``body`` (the parsed JSON-RPC request) when eligible; False (nothing sent)
        when the SDK must handle it."""
        prepared = self._prepare(body, scope)
        if prepared is None:
            return False
        request_id, params, context = prepared
        try:
            task = await self._send(params, context)
            result = MessageToDict(SendMessageResponse(task=send_answer(task, params)))
            data = JSONRPC20Response(result=result, _id=request_id).data
        except A2AError as exc:
            data = build_error_response(request_id, exc)
        except Exception as exc:
            # As the SDK's dispatcher does with an unexpected error: JSON-RPC -32603.
            log.exception("SendMessage failed")
            data = build_error_response(request_id, InternalError(message=str(exc)))
        await JSONResponse(data)(scope, receive, send)
        return True

    def _prepare(
        self, body: Any, scope: Scope
    ) -> tuple[str | int | None, SendMessageRequest, ServerCallContext] | None:
        """The request id, parsed params and call context of an eligible request, else None."""
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
            return None
        if body.get("method") != "SendMessage" or not _version_ok(scope):
            return None
        request_id = body.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, str | int):
            return None
        raw = body.get("params")
        if not isinstance(raw, dict):
            return None
        message = raw.get("message")
        config = raw.get("configuration")
        # Cheap rejections before parsing: follow-ups and non-blocking or push sends.
        if not isinstance(message, dict) or message.get("taskId") or message.get("task_id"):
            return None
        if config is not None and not isinstance(config, dict):
            return None
        try:
            params = ParseDict(raw, SendMessageRequest(), ignore_unknown_fields=True)
            validate_proto_required_fields(params)
            validate_history_length(params.configuration)
        except Exception:
            return None  # the SDK answers with its own error
        cfg = params.configuration
        if (
            params.message.task_id
            or cfg.return_immediately
            or cfg.HasField("task_push_notification_config")
            or self.handler._validate_input_modes
            or not self._is_function_skill(params)
        ):
            return None
        context = self._contexts.build(Request(scope))
        context.tenant = params.tenant
        context.state["method"] = "SendMessage"
        context.state["request_id"] = request_id
        return request_id, params, context

    def _is_function_skill(self, params: SendMessageRequest) -> bool:
        """The message's skill is typed with a handler. Requests the executor would reject for
        their metadata or skill name go to the SDK (their REJECTED task is built there)."""
        try:
            req = self.executor.read_request(params.message)
            parts = list(params.message.parts)
            skill = self.executor.dispatcher.resolve(
                req.skill_id or None,
                has_data=bool(get_data_parts(parts)),
                has_text=bool(get_text_parts(parts)),
            )
        except SkillInputError:
            return False
        return skill.typed and skill.handler is not None and not skill.llm

    async def _send(self, params: SendMessageRequest, context: ServerCallContext) -> Task:
        """``IdempotentRequestHandler.on_message_send`` for a new task, without ActiveTask."""
        handler = self.handler
        key = message_key(params.message, context)
        if key is not None:
            existing = await handler.keys.claim(key)
            if existing is not None:
                return await handler._replay(existing, params, context)
        # From here this send owns ``key`` (if any) until it ends.
        token = BLOCKING_SEND.set(True)
        try:
            request = await handler._request_context_builder.build(
                params=params,
                task_id=None,
                context_id=params.message.context_id or None,
                task=None,
                context=context,
            )
            manager = TaskManager(
                task_store=handler._watched,
                context=context,
                task_id=request.task_id,
                context_id=request.context_id,
                initial_message=request.message,
            )
            await self._run(request, manager)
            task = await manager.get_task()
            if task is None or task.status.state not in _SETTLED:
                raise InternalError(message=f"task {request.task_id} did not settle")
            return task
        finally:
            BLOCKING_SEND.reset(token)
            if key is not None:
                handler.keys.end(key)

    async def _run(self, request: RequestContext, manager: TaskManager) -> None:
        """``MeshExecutor.execute`` in the request's own asyncio task (no producer task), and
        on a ``CancelTask`` for it ``MeshExecutor.cancel``, as ``ActiveTask.cancel`` does."""
        queue = cast(EventQueue, _DirectQueue(manager))
        current = asyncio.current_task()
        assert current is not None
        task_id = str(request.task_id)
        running = _Running(current, manager)
        self.handler.fast_running[task_id] = running
        try:
            await self.executor.execute(request, queue)
        except asyncio.CancelledError:
            if not running.cancel_requested:
                raise
            current.uncancel()  # canceled by CancelTask, not by the server: answer normally
            await self.executor.cancel(request, queue)
        finally:
            del self.handler.fast_running[task_id]
            running.done.set()
