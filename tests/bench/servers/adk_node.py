"""An ADK agent served over A2A with ``to_a2a`` (tests/bench/agents/adk.py) by uvicorn with the
bench's settings (as the other rows: no access log):

    python -m tests.bench.servers.adk_node local --port 8003
    python -m tests.bench.servers.adk_node remote --port 8004 --peer http://127.0.0.1:8003

It has no ``/health``: the bench waits for its card.
"""

from __future__ import annotations

import argparse
import os

import uvicorn


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.servers.adk_node")
    parser.add_argument("kind", choices=("local", "remote"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--peer", default="", help="the mesh node's URL (remote)")
    args = parser.parse_args()
    # ADK's experimental-feature notice, once per request otherwise: its own switch.
    os.environ.setdefault("ADK_SUPPRESS_A2A_EXPERIMENTAL_FEATURE_WARNINGS", "true")
    from google.adk.a2a.utils.agent_to_a2a import to_a2a

    from tests.bench.agents import adk

    if args.kind == "remote" and not args.peer:
        parser.error("remote needs --peer URL")
    agent = adk.local() if args.kind == "local" else adk.remote(args.peer)
    app = to_a2a(agent, host="127.0.0.1", port=args.port)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
