"""A small plain a2a-sdk agent whose tasks stop to ask for input, for the CLI's tests of waiting
tasks (``mesh tasks``, ``mesh reply``, ``mesh chat``, ``mesh call``): not a mesh node, so the
commands are shown to work with any A2A agent that uses the standard states.

    python -m tests.asking_node --name alpha --port 8123 --registry http://127.0.0.1:8400

What a first message's text makes the task do:

* ``plain ...``: completes at once (text artifact ``done: ...``);
* ``auth ...``: AUTH_REQUIRED, asking for consent (text);
* ``free ...``: INPUT_REQUIRED with a question taking text;
* anything else: WORKING, then INPUT_REQUIRED asking "Approve APP-738 for 600,000?" with the
  answer's JSON Schema as a data part (``application/schema+json``): ``decision`` (approve or
  decline, required) and ``note``.

An answer (a message naming the waiting task) completes it with a data artifact
``{"answer": ..., "answers": <the urn:mesh:tasks:v1 "answers" id it named, or "">}``; the text
``again`` asks a second question instead. The message metadata ``caller`` and ``callerTask``
become the task's metadata, as a mesh node's delegation sets them. ``--mesh`` adds what a mesh
node says of its questions (``urn:mesh:tasks:v1`` question entries with ids); ``--no-rpc``
serves the card and ``/health`` but no JSON-RPC endpoint (an agent that does not answer A2A).
"""

from __future__ import annotations

import argparse
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from a2a.helpers import get_data_parts, new_data_part, new_text_part
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
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from mesh._discovery import Registrar, Registration, create_backend

EXT = "urn:mesh:tasks:v1"
QUESTION = "Approve APP-738 for 600,000?"
SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "enum": ["approve", "decline"]},
        "note": {"type": "string", "default": ""},
    },
    "required": ["decision"],
}


def build_card(name: str, url: str) -> AgentCard:
    return AgentCard(
        name=name,
        description="Asks before it decides.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["application/json"],
        skills=[
            AgentSkill(
                id="review",
                name="Review",
                description="Asks for approval, then completes with the answer.",
                tags=["asks", "test"],
            )
        ],
    )


class AskingExecutor(AgentExecutor):
    def __init__(self, *, mesh: bool) -> None:
        self.mesh = mesh

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        current = context.current_task
        message = context.message
        assert message is not None
        meta = MessageToDict(message.metadata) if message.metadata else {}
        context_id = current.context_id if current else context.context_id
        if current is None:
            task_meta = Struct()
            task_meta.update({k: meta[k] for k in ("caller", "callerTask") if k in meta})
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[message],
                    metadata=task_meta,
                )
            )
        updater = TaskUpdater(event_queue, context.task_id, context_id)
        text = context.get_user_input().strip()
        if current is None:
            await updater.start_work()
            if text.startswith("plain"):
                await updater.add_artifact([new_text_part(f"done: {text}")], last_chunk=True)
                await updater.complete()
            elif text.startswith("auth"):
                ask = [new_text_part("Open http://127.0.0.1:9/consent and approve the access")]
                await updater.requires_auth(updater.new_agent_message(ask))
            elif text.startswith("free"):
                await self._ask(updater, "What is the reference number?", None)
            else:
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING,
                    message=updater.new_agent_message([new_text_part("looking at the file")]),
                )
                await self._ask(updater, QUESTION, SCHEMA)
            return
        # An answer to the waiting task.
        await updater.start_work()
        if text == "again":
            await self._ask(updater, "And the note for the file?", None, qid="q-1")
            return
        data = get_data_parts(list(message.parts))
        ext = meta.get(EXT) if isinstance(meta.get(EXT), dict) else {}
        answer = {"answer": data[0] if data else text, "answers": str(ext.get("answers") or "")}
        await updater.add_artifact([new_data_part(answer)], name="result", last_chunk=True)
        await updater.complete()

    async def _ask(
        self,
        updater: TaskUpdater,
        text: str,
        schema: dict[str, Any] | None,
        qid: str = "q-0",
    ) -> None:
        parts: list[Part] = [new_text_part(text)]
        if schema is not None:
            part = new_data_part(schema, media_type="application/schema+json")
            if self.mesh:
                part.metadata.update({EXT: {"question": qid}})
            parts.append(part)
        said = updater.new_agent_message(parts)
        if self.mesh:
            entry = {"id": qid, "kind": "input", "text": text, "schema": schema is not None}
            said.metadata.update({EXT: {"questions": [entry]}})
        await updater.requires_input(said)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        current = context.current_task
        context_id = current.context_id if current else context.context_id
        await TaskUpdater(event_queue, context.task_id, context_id).cancel()


def create_app(args: argparse.Namespace) -> FastAPI:
    url = f"http://127.0.0.1:{args.port}"
    card = build_card(args.name, url)
    handler = DefaultRequestHandler(
        agent_executor=AskingExecutor(mesh=args.mesh),
        task_store=InMemoryTaskStore(),
        agent_card=card,
    )
    instance_id = f"{args.name}-{uuid.uuid4().hex[:8]}"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registrar = None
        if args.registry:
            backend = create_backend(args.registry, token=os.environ.get("MESH_REGISTRY_TOKEN"))
            registration = Registration(
                instance_id=instance_id, agent=args.name, url=url, version="1.0.0"
            )
            registrar = Registrar(backend, registration, interval_s=0.5)
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
        return JSONResponse({"status": "ok", "agent": args.name, "instance_id": instance_id})

    add_a2a_routes_to_fastapi(
        app,
        agent_card_routes=create_agent_card_routes(card),
        jsonrpc_routes=[] if args.no_rpc else create_jsonrpc_routes(handler, rpc_url="/"),
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="asker")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--registry", default=None)
    parser.add_argument("--mesh", action="store_true")
    parser.add_argument("--no-rpc", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(args), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
