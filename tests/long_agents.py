"""Two agents tests/test_delegation_long.py runs, offline (scripted model):

    long-top (LLM)  --long_child_crunch-->  long-child

``long-child``'s ``crunch`` is declared ``long_running``: it appends ``start JOB`` to
``$LONG_TEST_DIR/calls``, waits until the test creates ``$LONG_TEST_DIR/JOB.go`` (at most
``max_s``), reports ``JOB: finishing`` (``ctx.progress``) and appends ``done JOB``; ``grind`` does the same without the declaration (the
coordinator's ``long_after_s`` makes it long after 1 s). ``long-top`` reaches it at ``$LONG_TEST_CHILD_URL`` (the
test's proxy, which can cut a connection under the coordinator); ``long-found-top`` finds
long-child's replicas through the registry, with remote()'s default ``long_after_s`` (5 s).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from pydantic import BaseModel

from mesh import Agent, Call, RetryPolicy, Rule, Script, SkillContext, remote, skill

DIR = Path(os.environ.get("LONG_TEST_DIR", "."))


class Job(BaseModel):
    job: str
    max_s: float = 60.0


class Done(BaseModel):
    job: str


def _note(line: str) -> None:
    # Replicas of long-child name themselves (``$LONG_TEST_REPLICA``) in what they note.
    replica = os.environ.get("LONG_TEST_REPLICA")
    with (DIR / "calls").open("a") as fh:
        fh.write(f"{line} @{replica}\n" if replica else line + "\n")


async def _work(req: Job, ctx: SkillContext) -> Done:
    _note(f"start {req.job}")
    gate, until = DIR / f"{req.job}.go", time.monotonic() + req.max_s
    # The gate is a file another process creates: polled, bounded by max_s.
    while not gate.exists() and time.monotonic() < until:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await ctx.progress(f"{req.job}: finishing")
    _note(f"done {req.job}")
    return Done(job=req.job)


@skill(long_running=True)
async def crunch(req: Job, ctx: SkillContext) -> Done:
    """Work on a job until the test lets it finish."""
    return await _work(req, ctx)


@skill
async def grind(req: Job, ctx: SkillContext) -> Done:
    """The same work, not declared long: the caller's long_after_s makes it long."""
    return await _work(req, ctx)


child = Agent(name="long-child", description="Crunches jobs, slowly.", skills=[crunch, grind])

_POLICY = RetryPolicy(attempts=2, initial_delay=0.05, max_delay=0.1)


def _script(*skills: str) -> Script:
    return Script(
        rules=[
            Rule(
                when=rf"(?i){name} (?P<job>\w+)",
                steps=[[Call(f"long_child_{name}", {"job": "{job}"})]],
                answer=f"top got {{long_child_{name}.job}}",
                on_error="top could not: {error}",
            )
            for name in skills
        ],
        fallback="Ask: crunch JOB",
    )


top = Agent(
    name="long-top",
    instruction="You get jobs crunched by long-child.",
    tools=[
        remote(
            os.environ.get("LONG_TEST_CHILD_URL", "http://127.0.0.1:9"),
            deadline_s=120.0,
            long_after_s=1.0,
            policy=_POLICY,
        )
    ],
    script=_script("crunch", "grind"),
)

# The same coordinator finding long-child's replicas through the registry (``--registry``).
found_top = Agent(
    name="long-found-top",
    instruction="You get jobs crunched by long-child.",
    tools=[remote("long-child", deadline_s=120.0, policy=_POLICY)],  # long_after_s: the default
    script=_script("crunch", "grind"),
)
