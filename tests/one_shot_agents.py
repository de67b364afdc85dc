"""A function-skill agent whose skills end every way a run in one shot can (mesh._a2a.one_shot):
at once or after an await, with an answer, an attachment, a raise, a refusal, bad output."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from mesh import Agent, SkillContext, skill
from mesh._errors import SkillInputError, ToolError


class Item(BaseModel):
    key: str
    n: int = 1


class Done(BaseModel):
    key: str
    twice: int


@skill
async def quick(req: Item) -> Done:
    """An async handler that never awaits: it ends in its first step."""
    return Done(key=req.key, twice=req.n * 2)


@skill
async def napping(req: Item) -> Done:
    """Lets the loop run once, then answers."""
    await asyncio.sleep(0)
    return Done(key=req.key, twice=req.n * 2)


@skill
async def attaching(req: Item, ctx: SkillContext) -> Done:
    """Reports progress (nobody follows) and attaches a second artifact, without awaiting."""
    await ctx.progress(f"working on {req.key}")
    ctx.attach({"key": req.key}, f"note on {req.key}", name="note", description="a note")
    return Done(key=req.key, twice=req.n * 2)


def _record(what: str) -> None:
    path = os.environ.get("ONE_SHOT_CALLS")
    if path:
        with Path(path).open("a") as fh:
            fh.write(what + "\n")


class Nap(BaseModel):
    key: str
    seconds: float


@skill
async def dozing(req: Nap) -> Done:
    """Sleeps, then answers (records each run in the file $ONE_SHOT_CALLS names)."""
    _record(f"dozing {req.key}")
    await asyncio.sleep(req.seconds)
    return Done(key=req.key, twice=0)


@skill
async def raising(req: Item) -> Done:
    """Raises at once (the message must not leak)."""
    raise RuntimeError(f"secret-{req.key} exploded")


@skill
async def napping_raise(req: Item) -> Done:
    """Raises after the loop ran."""
    await asyncio.sleep(0)
    raise RuntimeError(f"secret-{req.key} exploded later")


@skill
async def refusing(req: Item) -> Done:
    """Refuses its input itself: the task is REJECTED."""
    raise SkillInputError(f"skill 'refusing' will not take key {req.key!r}")


@skill
async def tool_failing(req: Item) -> Done:
    """Fails with a mesh error: its message is the task's."""
    raise ToolError(f"the tool for {req.key} is down")


@skill
async def bad_output(req: Item) -> Done:
    """Answers with output that does not validate."""
    return Done.model_construct(key=req.key, twice="many")


agent = Agent(
    name="one-shot",
    description="Function skills that end every way.",
    skills=[
        quick,
        napping,
        dozing,
        attaching,
        raising,
        napping_raise,
        refusing,
        tool_failing,
        bad_output,
    ],
)
