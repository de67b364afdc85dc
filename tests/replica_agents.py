"""One agent that tests/test_replicas_pg.py serves twice, on one PostgreSQL database.

``crunch`` appends ``start JOB PID`` to ``$REPLICA_TEST_DIR/calls`` (so a test counts the runs
and sees which replica ran them), waits until ``$REPLICA_TEST_DIR/JOB.go`` exists (at most
``max_s``), appends ``done JOB PID``. The chat (scripted model) remembers a name in the
session's state: "my name is X", then "who am I?" answers from the session alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from pydantic import BaseModel

from mesh import Agent, Rule, Script, SkillContext, skill

DIR = Path(os.environ.get("REPLICA_TEST_DIR", "."))


class Job(BaseModel):
    job: str
    max_s: float = 30.0


class Done(BaseModel):
    job: str
    pid: int


def _note(line: str) -> None:
    with (DIR / "calls").open("a") as fh:
        fh.write(f"{line} {os.getpid()}\n")


@skill
async def crunch(req: Job, ctx: SkillContext) -> Done:
    """Work on a job until the test lets it finish."""
    _note(f"start {req.job}")
    gate, until = DIR / f"{req.job}.go", time.monotonic() + req.max_s
    # The gate is a file the test creates: polled, bounded by max_s.
    while not gate.exists() and time.monotonic() < until:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    _note(f"done {req.job}")
    return Done(job=req.job, pid=os.getpid())


agent = Agent(
    name="replica",
    instruction="Remember who you talk to.",
    skills=[crunch],
    script=Script(
        rules=[
            Rule(when=r"(?i)my name is (?P<name>\w+)", remember=["name"], answer="Noted, {name}."),
            Rule(
                when=r"(?i)who am i", remember=["name"], requires=["name"], answer="You are {name}."
            ),
        ],
        fallback="I do not know you yet.",
    ),
)
