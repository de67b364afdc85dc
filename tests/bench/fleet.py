"""A simulated fleet for the console's gathering bench: many mesh-like instances on one port.

    python -m tests.bench.fleet --port 8123 --agents 20 [--no-stats]

``/i/<n>`` is instance ``fleet-<n>`` of agent ``agent-<n % agents>``: its card names that agent;
its ``/health`` names the instance id, a pid and an uptime like a node's, and with
``?stats=1`` adds window stats as ``mesh._stats`` makes them (each agent calls the next two
agents' ``echo`` skill; one skill; one priced model), unless ``--no-stats``; after
``--health-delay`` seconds (a slow but alive fleet). It registers
nowhere: the bench registers its instances. ``/ready`` answers at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from a2a.types import AgentCard
from google.protobuf.json_format import MessageToDict
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mesh._metrics import NodeMetrics
from mesh._stats import NodeStats
from mesh._types import Usage
from tests.echo_node import build_card


def agent_stats(k: int, agents: int) -> dict[str, object]:
    """What an instance of agent ``k`` reports: real NodeStats over traffic made up here."""
    metrics = NodeMetrics(CollectorRegistry(), f"agent-{k}", process_collectors=False)
    for i in range(40):
        metrics.task_started()
        metrics.task_done("echo", "completed" if i % 10 else "failed", 0.004 * (i % 7 + 1))
        for peer in ((k + 1) % agents, (k + 2) % agents):
            metrics.delegation(f"agent-{peer}", "echo", "ok", 0.002 * (i % 5 + 1))
    metrics.on_model_call("model-x", 0.5, Usage(input_tokens=1200, output_tokens=300), True)
    peers = [f"agent-{(k + 1) % agents}", f"agent-{(k + 2) % agents}"]
    for name in peers:
        metrics.breaker_states(name, {f"http://10.0.0.{k}:8000": "closed"})
    return NodeStats(metrics, prices={"model-x": (0.3, 2.5)}).report(peers=peers)


def create_app(port: int, agents: int, stats: bool, health_delay_s: float = 0.0) -> Starlette:
    cards: dict[str, dict[str, object]] = {}
    reports = [agent_stats(k, agents) for k in range(agents)]

    def card(n: int) -> dict[str, object]:
        agent = f"agent-{n % agents}"
        if agent not in cards:
            built: AgentCard = build_card(
                agent, f"http://127.0.0.1:{port}/i/{n}", description="Simulated.", skill_id="echo"
            )
            cards[agent] = MessageToDict(built)
        return cards[agent]

    async def card_route(request: Request) -> Response:
        return JSONResponse(card(int(request.path_params["n"])))

    async def health_route(request: Request) -> Response:
        n = int(request.path_params["n"])
        if health_delay_s:  # slow but alive: a busy node answers late
            await asyncio.sleep(health_delay_s)
        body: dict[str, object] = {
            "status": "ok",
            "agent": f"agent-{n % agents}",
            "instance_id": f"fleet-{n}",
            "pid": 10_000 + n,
            "uptime_s": 123.4,
            "checks": {"database": {"ok": True, "detail": "node.db"}},
        }
        if stats and request.query_params.get("stats") == "1":
            body["stats"] = reports[n % agents]
        return Response(json.dumps(body), media_type="application/json")

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
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--no-stats", action="store_true")
    parser.add_argument("--health-delay", type=float, default=0.0, metavar="S")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.port, args.agents, not args.no_stats, args.health_delay),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        backlog=2048,
    )


if __name__ == "__main__":
    main()
