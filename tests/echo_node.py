"""A tiny real A2A node for discovery tests (until ``mesh serve`` is the one to use).

    python -m tests.echo_node --name echo --port 8123 --registry http://127.0.0.1:8400

Serves a real a2a-sdk card (with the ``urn:mesh:skill-schemas:v1`` extension) and JSON-RPC
endpoint with an echo executor, ``/health`` (503 while the file ``--unhealthy-file`` exists),
``/metrics`` and ``/introspect``, and runs a ``Registrar`` in its lifespan like a node does.
"""

from __future__ import annotations

import argparse
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

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
    AgentExtension,
    AgentInterface,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from google.protobuf.struct_pb2 import Struct

from mesh._discovery import Registrar, Registration, create_backend

ECHO_INPUT = {
    "type": "object",
    "title": "EchoRequest",
    "properties": {
        "text": {"type": "string", "description": "What to echo back."},
        "times": {"type": "integer", "minimum": 1, "default": 1, "description": "Repeats."},
        "shout": {"anyOf": [{"type": "boolean"}, {"type": "null"}], "default": None},
    },
    "required": ["text"],
}
ECHO_OUTPUT = {
    "type": "object",
    "title": "EchoReply",
    "properties": {"echo": {"type": "string", "description": "The echoed text."}},
    "required": ["echo"],
}


def build_card(name: str, url: str, *, description: str, skill_id: str) -> AgentCard:
    params = Struct()
    params.update({"skills": {skill_id: {"input": ECHO_INPUT, "output": ECHO_OUTPUT}}})
    return AgentCard(
        name=name,
        description=description,
        version="1.2.3",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(
            streaming=False,
            extensions=[
                AgentExtension(uri="urn:mesh:skill-schemas:v1", required=False, params=params)
            ],
        ),
        default_input_modes=["application/json"],
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(
                id=skill_id,
                name=skill_id.capitalize(),
                description=f"Echo the text back ({name}).",
                tags=["echo", "test"],
                input_modes=["application/json"],
                output_modes=["application/json"],
            )
        ],
    )


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        ctx_id = task.context_id if task else context.context_id
        if task is None:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=ctx_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        updater = TaskUpdater(event_queue, context.task_id, ctx_id)
        data = get_data_parts(list(context.message.parts)) if context.message else []
        text = str(data[0].get("text", "")) if data else context.get_user_input()
        await updater.add_artifact([new_data_part({"echo": text})], name="echo", last_chunk=True)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def create_app(args: argparse.Namespace) -> FastAPI:
    url = f"http://127.0.0.1:{args.port}"
    card = build_card(args.name, url, description=args.description, skill_id=args.skill)
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    unhealthy = Path(args.unhealthy_file) if args.unhealthy_file else None
    # Named in /health, as a node does: the registry lets a restart at the same URL replace
    # its old instance only when the URL answers with the new id.
    instance_id = args.instance_id or f"{args.name}-{uuid.uuid4().hex[:8]}"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registrar = None
        if args.registry:
            backend = create_backend(args.registry, token=os.environ.get("MESH_REGISTRY_TOKEN"))
            registration = Registration(
                instance_id=instance_id,
                agent=args.name,
                url=url,
                version="1.2.3",
            )
            registrar = Registrar(backend, registration, interval_s=args.heartbeat)
            await registrar.start()
        try:
            yield
        finally:
            if registrar is not None:
                await registrar.aclose()
                await registrar.backend.aclose()
            await handler.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> JSONResponse:
        if unhealthy is not None and unhealthy.exists():
            body = {"status": "failing", "agent": args.name, "instance_id": instance_id}
            return JSONResponse(body, status_code=503)
        return JSONResponse(
            {"status": "ok", "agent": args.name, "version": "1.2.3", "instance_id": instance_id}
        )

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("# echo node\n")

    @app.get("/introspect")
    async def introspect() -> JSONResponse:
        return JSONResponse({"agent": {"name": args.name}, "runtime": {}, "peers": []})

    add_a2a_routes_to_fastapi(
        app,
        agent_card_routes=create_agent_card_routes(card),
        jsonrpc_routes=create_jsonrpc_routes(handler, rpc_url="/"),
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="echo")
    parser.add_argument("--description", default="Echoes typed requests back.")
    parser.add_argument("--skill", default="echo")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--registry", default=None)
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--unhealthy-file", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    uvicorn.run(create_app(args), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
