"""Many registrable instances behind one port, as a flood of junk registrations would use.

    python -m tests.flood_node --port 8123 --health-delay 3

``/i/<n>`` is an instance: its card (``/i/<n>/.well-known/agent-card.json``, served after
``--card-delay`` seconds) names the agent ``--name``, or ``<name>-<n>`` with
``--distinct-names``; its ``/health`` answers 200 after ``--health-delay`` seconds (slower than
the registry's probe timeout: every probe is cancelled by its deadline). It registers nowhere:
the test registers its instances. ``/ready`` answers at once.
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn
from a2a.types import AgentCard
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.echo_node import build_card


def create_app(
    name: str, port: int, delay_s: float, distinct: bool, card_delay_s: float = 0.0
) -> Starlette:
    cards: dict[str, dict[str, object]] = {}

    def card(n: str) -> dict[str, object]:
        agent = f"{name}-{n}" if distinct else name
        if agent not in cards:
            built: AgentCard = build_card(
                agent, f"http://127.0.0.1:{port}/i/{n}", description="Junk.", skill_id="echo"
            )
            cards[agent] = MessageToDict(built)
        return cards[agent]

    async def card_route(request: Request) -> Response:
        await asyncio.sleep(card_delay_s)
        return JSONResponse(card(request.path_params["n"]))

    async def health_route(request: Request) -> Response:
        await asyncio.sleep(delay_s)
        return JSONResponse({"status": "ok"})

    async def ready_route(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/ready", ready_route),
            Route("/i/{n}/.well-known/agent-card.json", card_route),
            Route("/i/{n}/health", health_route),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="junk")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--health-delay", type=float, default=0.0)
    parser.add_argument("--card-delay", type=float, default=0.0)
    parser.add_argument("--distinct-names", action="store_true")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.name, args.port, args.health_delay, args.distinct_names, args.card_delay),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        backlog=2048,
    )


if __name__ == "__main__":
    main()
