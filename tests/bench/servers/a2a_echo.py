"""Bare a2a-sdk 1.3: JSON-RPC at ``/``, an executor that echoes the data part back as an
artifact, and the SDK's ``InMemoryTaskStore``. This is what the protocol layer alone costs.

    python -m tests.bench.servers.a2a_echo --port 8002
"""

from __future__ import annotations

import argparse

import uvicorn
from a2a.helpers import get_data_parts, new_data_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    add_a2a_routes_to_fastapi,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)
from fastapi import FastAPI


class EchoExecutor(AgentExecutor):
    """The same task lifecycle a mesh node emits: Task, WORKING, one artifact, COMPLETED."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message, task_id = context.message, context.task_id
        # The handler always builds the context with both; the SDK's types allow None.
        assert message is not None
        assert task_id is not None
        assert context.context_id is not None
        task = context.current_task
        context_id = task.context_id if task else context.context_id
        if task is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[message],
                )
            )
        updater = TaskUpdater(event_queue, task_id, context_id)
        await updater.start_work()
        data = get_data_parts(list(message.parts))
        await updater.add_artifact(
            [new_data_part(data[0] if data else {}, media_type="application/json")],
            name="echo",
            last_chunk=True,
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


def create_app(port: int) -> FastAPI:
    card = AgentCard(
        name="bench-echo",
        description="Echoes its data part (benchmark baseline).",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["application/json"],
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(id="echo", name="Echo", description="Echo the data part.", tags=["echo"])
        ],
    )
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    add_a2a_routes_to_fastapi(
        app,
        agent_card_routes=create_agent_card_routes(card),
        jsonrpc_routes=create_jsonrpc_routes(handler, rpc_url="/"),
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.port),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
