"""An A2A node that speaks HTTP+JSON only (no JSON-RPC), under ``/api``, built from a2a-sdk alone:
the echo executor of ``tests.echo_node``, a card whose one interface is HTTP+JSON.

    python -m tests.rest_only_node --port 8123
"""

from __future__ import annotations

import argparse

import uvicorn
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentInterface
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.echo_node import EchoExecutor, build_card


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    card = build_card("rest-echo", url, description="Echoes, over HTTP+JSON only.", skill_id="echo")
    del card.supported_interfaces[:]
    card.supported_interfaces.append(
        AgentInterface(url=url + "/api", protocol_binding="HTTP+JSON", protocol_version="1.0")
    )
    card.capabilities.streaming = True
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )

    async def health(_: object) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    app = Starlette(
        routes=[
            Route("/health", health),
            *create_agent_card_routes(card),
            *create_rest_routes(handler, path_prefix="/api"),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
