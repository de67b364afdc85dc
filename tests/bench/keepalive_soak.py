"""``python -m tests.bench.keepalive_soak``: 64 connections kept alive against a mesh node for a
bounded time, counting every failed request (issue 19 item 4).

    python -m tests.bench.keepalive_soak                   # 120 s, mesh's keep-alive (65 s)
    python -m tests.bench.keepalive_soak --duration 30 --server-keep-alive 5   # the race

The clients are what a user would write: one ``httpx.AsyncClient`` (its default idle expiry,
5 s) with 64 connections, and mesh's own client (``A2APeer`` on ``mesh._pool``). Half the
workers send back to back; the other half pause about 5 s between requests, so their
connection sits idle just as long as the client keeps it: with a server keep-alive of 5 s
(uvicorn's default) the client now and then reuses a connection the server is closing, and the
request fails with "Server disconnected" (``RemoteProtocolError``) or a reset. Every answer is
checked (a completed task). Writes ``bench-results/keepalive-soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from mesh._a2a.client import A2APeer
from mesh._pool import create_transport
from tests.bench.harness import spawn
from tests.bench.scenarios import A2A_HEADERS, SCORE_PARTS, Ctx, ServerSpec, _mesh_serve
from tests.support import ROOT, free_port

DEFAULT_JSON = ROOT / "bench-results" / "keepalive-soak.json"
CONNECTIONS = 64


def _body() -> bytes:
    message = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "parts": SCORE_PARTS,
        "metadata": {"skill": "score"},
    }
    params = {"message": message, "configuration": {"historyLength": 0}}
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    ).encode()


async def _worker(
    send: Any, deadline: float, paced: bool, counts: collections.Counter[str], rng: random.Random
) -> None:
    while time.monotonic() < deadline:
        try:
            ok = await send()
            counts["ok" if ok else "bad answer"] += 1
        except Exception as exc:  # every failure is counted by type: the point of the soak
            counts[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
        if paced:
            # Right at the idle expiry of both clients (5 s), where the race lives.
            await asyncio.sleep(rng.uniform(4.99, 5.01))


async def soak(url: str, duration_s: float) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    plain = httpx.AsyncClient(limits=limits, timeout=30.0, headers=A2A_HEADERS)
    meshed = httpx.AsyncClient(
        transport=create_transport(limits=limits), timeout=30.0, headers=A2A_HEADERS
    )
    peer = A2APeer(meshed, url)

    async def send_plain() -> bool:
        response = await plain.post(url + "/", content=_body())
        return response.status_code == 200 and b"TASK_STATE_COMPLETED" in response.content

    async def send_mesh() -> bool:
        result = await peer.send(dict(SCORE_PARTS[0]["data"]), skill="score")  # type: ignore[call-overload]
        return result.state == "completed"

    by_client: dict[str, collections.Counter[str]] = {
        "httpx": collections.Counter(),
        "mesh A2APeer": collections.Counter(),
    }
    rng = random.Random(19)
    deadline = time.monotonic() + duration_s
    half = CONNECTIONS // 2
    workers = [
        _worker(send_plain, deadline, i % 2 == 1, by_client["httpx"], rng) for i in range(half)
    ] + [
        _worker(send_mesh, deadline, i % 2 == 1, by_client["mesh A2APeer"], rng)
        for i in range(half)
    ]
    try:
        await asyncio.gather(*workers)
    finally:
        await peer.aclose()
        await plain.aclose()
        await meshed.aclose()
    return {name: dict(counts) for name, counts in by_client.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.keepalive_soak")
    parser.add_argument("--duration", type=float, default=120.0, metavar="S")
    parser.add_argument(
        "--server-keep-alive",
        type=int,
        default=None,
        metavar="S",
        help="serve the node with this keep-alive instead of mesh's (5: uvicorn's default)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 3600:
        parser.error("--duration: 1 to 3600 seconds")
    with tempfile.TemporaryDirectory(prefix="mesh-soak-") as tmp:
        ctx = Ctx(ports={"bureau": free_port()}, tmp=Path(tmp))
        extra = {"BENCH_KEEP_ALIVE": str(args.server_keep_alive)} if args.server_keep_alive else {}
        spec = ServerSpec(
            "bureau",
            _mesh_serve("tests.bench.agents.specialist:agent", "bureau"),
            env=lambda ctx: extra,
        )
        proc, _ = spawn(spec, ctx, 60.0)
        try:
            counts = asyncio.run(soak(ctx.url("bureau"), args.duration))
        finally:
            proc.terminate()
    errors = {
        client: sum(n for what, n in c.items() if what != "ok") for client, c in counts.items()
    }
    result = {
        "duration_s": args.duration,
        "connections": CONNECTIONS,
        "server_keep_alive_s": args.server_keep_alive or "mesh default",
        "counts": counts,
        "errors": errors,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    for client, c in counts.items():
        print(f"{client:>13}: {c.get('ok', 0)} ok, {errors[client]} errors {dict(c)}")
    print(f"wrote {args.json}")
    return 1 if any(errors.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
