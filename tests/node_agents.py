"""Agents the node tests serve: they record each call so tests can count real executions."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from mesh import Agent, Rule, Script, SkillContext, llm_skill, skill


def _record(what: str) -> None:
    path = os.environ.get("NODE_TEST_CALLS")
    if path:
        with Path(path).open("a") as fh:
            fh.write(what + "\n")


class Ping(BaseModel):
    key: str
    n: int = 1


class Pong(BaseModel):
    key: str
    n: int
    doubled: int


class Sleep(BaseModel):
    seconds: float


class Slept(BaseModel):
    seconds: float


@skill
def echo(req: Ping) -> Pong:
    """Echo the key and double n (records every call)."""
    _record(f"echo {req.key}")
    return Pong(key=req.key, n=req.n, doubled=req.n * 2)


@skill
async def slow(req: Sleep, ctx: SkillContext) -> Slept:
    """Sleep, then answer (records start and end)."""
    _record(f"slow start {ctx.task_id}")
    await asyncio.sleep(req.seconds)
    _record(f"slow end {ctx.task_id}")
    return Slept(seconds=req.seconds)


@skill
def broken(req: Ping) -> Pong:
    """Always raises (with a secret in the message that must not leak)."""
    raise RuntimeError("secret-token-1234 exploded")


agent = Agent(name="test-worker", description="Test worker.", skills=[echo, slow, broken])


# -- a skill a test can hold mid-run (crash and shutdown tests) -------------------------------
class Hold(BaseModel):
    key: str


class Held(BaseModel):
    key: str


@skill(tags=["test"])
async def hold(req: Hold) -> Held:
    """Record the start, wait while the file named by $NODE_TEST_HOLD exists (at most 10 min),
    then record that the work ran and answer."""
    _record(f"hold start {req.key}")
    path = os.environ.get("NODE_TEST_HOLD")
    for _ in range(60_000):
        if not path or not os.path.exists(path):  # noqa: ASYNC240 - one stat, test agent
            break
        await asyncio.sleep(0.01)
    _record(f"hold ran {req.key}")
    return Held(key=req.key)


holder = Agent(name="test-holder", description="Holds tasks mid-run.", skills=[hold])


# -- LLM typed skills whose first answer does not validate (the repair path) -----------------
class Draft(BaseModel):
    text: str


class Review(BaseModel):
    verdict: Literal["ok", "redo"]
    notes: str


def _reviewer(name: str, script: Script) -> Agent:
    review = llm_skill("review", input=Draft, output=Review, description="Review a draft.")
    return Agent(name=name, instruction="Review drafts.", skills=[review], script=script)


# First answer has an invalid verdict; the repair message gets a valid one.
reviewer = _reviewer(
    "reviewer",
    Script(
        rules=[
            Rule(when=r"did not validate", answer_data={"verdict": "ok", "notes": "repaired"}),
            Rule(when=r"text", answer_data={"verdict": "maybe", "notes": "first try"}),
        ]
    ),
)

# Never valid, not even after the repair message.
stubborn_reviewer = _reviewer(
    "stubborn-reviewer",
    Script(rules=[Rule(when=r".", answer_data={"verdict": "perhaps", "notes": "{input}"})]),
)
