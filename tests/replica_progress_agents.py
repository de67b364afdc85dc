"""The agent tests/test_replicas_pg_progress.py serves twice, on one PostgreSQL database.

``steps`` reports ``JOB step I`` (``ctx.progress``; from step 2 on followed by ``pad`` dots)
for I = 1..count, each once ``$REPLICA_TEST_DIR/JOB.I`` exists (at most ``max_s`` each), so a
test holds it step by step.
The chat's scripted model calls ``hold`` (which returns once ``$REPLICA_TEST_DIR/<context>.go``
exists, at most 20 s), then writes its answer, streamed in chunks while someone follows.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mesh import Agent, Call, Rule, Script, ScriptedModel, SkillContext, ToolContext, skill, tool

DIR = Path(os.environ.get("REPLICA_TEST_DIR", "."))


class Steps(BaseModel):
    job: str
    count: int = 3
    max_s: float = 10.0
    #: Characters of padding on each report from step 2 on (a state too big for a NOTIFY).
    pad: int = 0


class Stepped(BaseModel):
    job: str
    steps: int


async def _gate(path: Path, max_s: float) -> bool:
    until = time.monotonic() + max_s
    # The gate is a file the test creates: polled, bounded by max_s.
    while not path.exists() and time.monotonic() < until:  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.02)
    return path.exists()  # noqa: ASYNC240 - one stat, a test


@skill
async def steps(req: Steps, ctx: SkillContext) -> Stepped:
    """Report each step once the test lets it happen."""
    for i in range(1, req.count + 1):
        await _gate(DIR / f"{req.job}.{i}", req.max_s)
        await ctx.progress(f"{req.job} step {i}" + ("." * req.pad if i > 1 else ""))
    return Stepped(job=req.job, steps=req.count)


@tool
async def hold(ctx: ToolContext) -> dict[str, Any]:
    """Wait for the test's gate."""
    return {"released": await _gate(DIR / f"{ctx.session_id}.go", 20.0)}


agent = Agent(
    name="replica-progress",
    instruction="Wait for the gate when asked to, else echo.",
    skills=[steps],
    tools=[hold],
    model=ScriptedModel(
        Script(
            rules=[
                Rule(
                    when=r"(?i)wait",
                    steps=[Call("hold", {})],
                    answer="released {hold.released} after the gate",
                )
            ],
            fallback="{input}",
        )
    ),
)
