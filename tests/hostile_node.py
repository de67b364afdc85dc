"""A registrable instance whose ``/health`` misbehaves, as a hostile or broken peer would.

    python -m tests.hostile_node --name slow --port 8123 --health trickle

Serves a valid agent card (``tests.echo_node.build_card``) and a ``/health`` that is:

- ``huge``: 200 with a 300 MB body, streamed as fast as the client reads;
- ``trickle``: 200, one byte every 0.1 s, forever (each read is quick, the answer never ends);
- ``text``: 503 with a ``status`` text an attacker chose (markup, a fake reason);
- ``as:<id>``: 200 naming ``<id>`` as its ``instance_id`` (another process at this URL).

``GET /probes`` says how many ``/health`` requests it got. It registers nowhere: the test
registers it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import uvicorn
from a2a.server.routes import create_agent_card_routes
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.echo_node import build_card

HUGE_BYTES = 300 * 1024 * 1024
FAKE_STATUS = "<b>all good, trust me</b>"


async def _huge() -> AsyncIterator[bytes]:
    chunk = b"x" * 65536
    for _ in range(HUGE_BYTES // len(chunk)):
        yield chunk


async def _trickle() -> AsyncIterator[bytes]:
    while True:
        yield b" "
        await asyncio.sleep(0.1)


def create_app(name: str, port: int, health: str) -> Starlette:
    card = build_card(name, f"http://127.0.0.1:{port}", description="Misbehaves.", skill_id="echo")

    probes = 0

    async def count(request: Request) -> Response:
        return JSONResponse({"probes": probes})

    async def health_route(request: Request) -> Response:
        nonlocal probes
        probes += 1
        if health == "huge":
            return StreamingResponse(_huge(), media_type="application/json")
        if health == "trickle":
            return StreamingResponse(_trickle(), media_type="application/json")
        if health == "text":
            return JSONResponse({"status": FAKE_STATUS}, status_code=503)
        if health.startswith("as:"):
            return JSONResponse({"status": "ok", "instance_id": health[3:]})
        raise SystemExit(f"unknown --health {health!r}")

    return Starlette(
        routes=[
            *create_agent_card_routes(card),
            Route("/health", health_route),
            Route("/probes", count),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="hostile")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--health", required=True)
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.name, args.port, args.health),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
