"""``MeshRequestHandler``: a node's A2A request handler, composed around the SDK's.

It implements the SDK's public ``RequestHandler`` interface and owns a ``DefaultRequestHandler``
built from parts it keeps references to (the executor, the watched task store, the request
context builder), so nothing here reads the SDK handler's private state. It adds two things:

* **idempotent sends**: a repeated message (same owner, caller and ``messageId``: see
  ``mesh._a2a.idempotency``) gets the task it started back, after waiting for it if it still
  runs here, on ``SendMessage`` and ``SendStreamingMessage`` alike;
* **the fast path** (``mesh._a2a.fastpath``): a new blocking send of a function skill is run
  by ``FastPath`` instead of the SDK's task machinery, and ``CancelTask`` of such a task stops
  it there.

Everything else is the SDK handler's, unchanged: the route (``create_jsonrpc_routes``) parses,
checks the ``A2A-Version`` and builds the call context for both paths alike.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from a2a.server.agent_execution import SimpleRequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import DefaultRequestHandler, RequestHandler
from a2a.server.tasks import TaskStore
from a2a.types import (
    AgentCard,
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
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)

from mesh._a2a.executor import MeshExecutor
from mesh._a2a.fastpath import FastPath
from mesh._a2a.idempotency import (
    IdempotencyKeys,
    WatchedTaskStore,
    message_key,
    replay,
    send_answer,
)
from mesh._a2a.store import SqliteTaskStore, mark_blocking_send

__all__ = ["MeshRequestHandler"]


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
    ) -> None:
        self.executor = executor
        self.keys = keys
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
        )
        self._close_sdk = sdk.aclose
        #: The SDK's handler (used through its interface): all the fast path does not serve.
        self.sdk: RequestHandler = sdk
        #: None when turned off or when the agent has no function skill to serve.
        self.fastpath: FastPath | None = None
        skills = executor.dispatcher.agent.all_skills
        if fastpath and any(s.typed and s.handler is not None for s in skills):
            self.fastpath = FastPath(executor, self.task_store, self.request_contexts)

    async def aclose(self) -> None:
        """Stop the SDK's handler (cancels the tasks it still runs)."""
        await self._close_sdk()

    # -- sends: idempotent, and the fast path ------------------------------------------------
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        key = message_key(params.message, context)
        if key is None:
            return _answer(await self._send(params, context), params)
        existing = await self.keys.claim(key)
        if existing is not None:
            return _answer(await replay(self.task_store, existing, params, context), params)
        # From here this send owns ``key`` until it ends.
        try:
            return _answer(await self._send(params, context), params)
        finally:
            self.keys.end(key)

    async def _send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        if not params.configuration.return_immediately:
            mark_blocking_send(context)
        if self.fastpath is not None and self.fastpath.takes(params, context):
            return await self.fastpath.send(params, context)
        return await self.sdk.on_message_send(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        key = message_key(params.message, context)
        existing = await self.keys.claim(key) if key is not None else None
        if existing is not None:
            yield await replay(self.task_store, existing, params, context)
            return
        try:
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
        return await self.sdk.on_cancel_task(params, context)

    # -- the rest: the SDK's ----------------------------------------------------------------
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        return await self.sdk.on_get_task(params, context)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        return await self.sdk.on_list_tasks(params, context)

    def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        return self.sdk.on_subscribe_to_task(params, context)

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


def _answer(result: Task | Message, params: SendMessageRequest) -> Task | Message:
    return send_answer(result, params) if isinstance(result, Task) else result
