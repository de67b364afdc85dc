"""``python -m tests.bench.node_retained``: what a node keeps per task, found with tracemalloc
(issue 19 item 3: the LLM node's RSS grew 2.1 KiB per task, the typed node's 0.35).

    python -m tests.bench.node_retained                  # both nodes, 2,000 tasks after warm-up
    python -m tests.bench.node_retained --node llm --tasks 5000 --top 20

The node runs in this process (its real app and lifespan, its SQLite file in a temp dir), sent
the bench's own SendMessage bodies through httpx's ASGI transport, one at a time, every answer
checked. After a warm-up (caches filled, lazy imports done) a tracemalloc snapshot is taken, then
``--tasks`` more tasks, a full collection and a second snapshot: what grew between the two, by
the line that allocated it (``--frames`` deep), divided by the task count, is what the node keeps
per task. Python allocations only (not SQLite's page cache, which is bounded by its settings).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import tempfile
import tracemalloc
import uuid
from pathlib import Path

import httpx

from tests.bench.load import Target
from tests.bench.procstat import rss_bytes
from tests.bench.scenarios import (
    A2A_HEADERS,
    COMPLETED,
    SCORE_PARTS,
    SCORE_TEXT,
    SCORED,
    send_message_body,
)

NODES = {
    # name: (agent, request body, what a good answer contains)
    "llm": ("tests.bench.agents.coordinator:local", send_message_body(SCORE_TEXT, None), SCORED),
    "typed": (
        "tests.bench.agents.specialist:agent",
        send_message_body(SCORE_PARTS, "score"),
        COMPLETED,
    ),
}
WARMUP = 300


def _files_kib(folder: Path, pattern: str) -> float:
    return sum(f.stat().st_size for f in folder.rglob(pattern)) / 1024


async def measure(node_name: str, tasks: int, top: int, frames: int) -> str:
    from mesh._node import Node
    from mesh._settings import NodeSettings

    ref, body, expect = NODES[node_name]
    module, _, attr = ref.partition(":")
    agent = getattr(__import__(module, fromlist=[attr]), attr)
    target = Target(url="http://node/", body=body, expect=expect, headers=A2A_HEADERS)
    with tempfile.TemporaryDirectory(prefix="mesh-retained-") as tmp:
        node = Node(agent, NodeSettings(data_dir=Path(tmp), registry=None))
        async with node.app.router.lifespan_context(node.app):
            transport = httpx.ASGITransport(app=node.app)
            async with httpx.AsyncClient(transport=transport, timeout=30) as client:
                run = uuid.uuid4().hex[:8]

                async def send(n: int, tag: str) -> None:
                    for i in range(n):
                        r = await client.post(
                            target.url,
                            content=target.render(f"{run}-{tag}-{i}"),
                            headers={**target.headers, "Content-Type": "application/json"},
                        )
                        if r.status_code != 200 or expect not in r.text:
                            raise SystemExit(f"bad answer ({r.status_code}): {r.text[:300]}")

                await send(WARMUP, "warm")
                gc.collect()
                tracemalloc.start(frames)
                before = tracemalloc.take_snapshot()
                # RSS at quarters of the run (less tracemalloc's own memory): a cache that
                # fills grows early and stops; a leak grows the same in every quarter.
                rss = [rss_bytes(os.getpid()) - tracemalloc.get_tracemalloc_memory()]
                for q in range(4):
                    await send(tasks // 4, f"measured{q}")
                    rss.append(rss_bytes(os.getpid()) - tracemalloc.get_tracemalloc_memory())
                gc.collect()
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
                db_kib = _files_kib(Path(tmp), "*.db*")
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "traceback")
    grown = sum(s.size_diff for s in stats)
    lines = [
        f"{node_name} node ({ref}): {tasks} tasks after {WARMUP} warm-up; Python heap "
        f"{grown / 1024:+.1f} KiB, {grown / tasks:+.0f} B/task",
        "  RSS growth per task by quarter of the run (B): "
        + ", ".join(f"{(b - a) / (tasks // 4):+.0f}" for a, b in itertools.pairwise(rss))
        + f"; SQLite files at the end {db_kib:,.0f} KiB",
        f"  {'B/task':>8} {'objs/task':>9}  allocated at (innermost last)",
    ]
    for stat in sorted(stats, key=lambda s: -s.size_diff)[:top]:
        if stat.size_diff <= 0:
            break
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(stat.traceback))
        lines.append(f"  {stat.size_diff / tasks:>8.1f} {stat.count_diff / tasks:>9.2f}  {where}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", choices=[*NODES, "both"], default="both")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--frames", type=int, default=6)
    args = parser.parse_args()
    if not 1 <= args.tasks <= 100_000:
        parser.error("--tasks: 1 to 100,000")
    for name in NODES if args.node == "both" else [args.node]:
        print(asyncio.run(measure(name, args.tasks, args.top, args.frames)))
        print()


if __name__ == "__main__":
    main()
