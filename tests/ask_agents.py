"""The agent tests/test_node_ask.py serves: typed function skills that ask their caller
(``ctx.ask``), and one that never asks (the fast path).

Each run of a skill appends a line to ``$NODE_TEST_CALLS`` (``review run APP-1``,
``review decided APP-1 approve``): what ran, and how often, is visible from outside.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Literal

from pydantic import BaseModel, Field

from mesh import Agent, SkillContext, skill


def _record(what: str) -> None:
    path = os.environ.get("NODE_TEST_CALLS")
    if path:
        with open(path, "a") as fh:
            fh.write(what + "\n")


class Review(BaseModel):
    applicant_id: str
    amount: float


class Approval(BaseModel):
    decision: Literal["approve", "decline"]
    note: str = ""


class Decision(BaseModel):
    applicant_id: str
    decision: str
    note: str
    reviewer: str = ""


@skill(asks=True)
async def review(req: Review, ctx: SkillContext) -> Decision:
    """Ask for an approval, then ask who approved (text), and decide."""
    _record(f"review run {req.applicant_id}")
    ok = await ctx.ask(f"Approve {req.applicant_id} for {req.amount:,.0f}?", schema=Approval)
    reviewer = await ctx.ask("Who approves?") if ok.decision == "approve" else ""
    _record(f"review decided {req.applicant_id} {ok.decision}")
    return Decision(
        applicant_id=req.applicant_id, decision=ok.decision, note=ok.note, reviewer=reviewer
    )


class Consent(BaseModel):
    account: str


class Linked(BaseModel):
    account: str
    code_length: int


@skill(asks=True)
async def link(req: Consent, ctx: SkillContext) -> Linked:
    """Ask for consent (AUTH_REQUIRED): the answer is a one-time code."""
    code = await ctx.ask(
        f"Open https://bank.example/consent?account={req.account} and send the code shown",
        kind="auth",
    )
    return Linked(account=req.account, code_length=len(code))


class Nothing(BaseModel):
    key: str = ""


class Said(BaseModel):
    said: str


@skill(asks=True)
async def fickle(req: Nothing, ctx: SkillContext) -> Said:
    """Asks something that depends on the time: its replay cannot be trusted."""
    said = await ctx.ask(f"What now? (asked at {time.time_ns()})")
    return Said(said=said)


class Count(BaseModel):
    n: int = Field(ge=1, le=5)


class Counted(BaseModel):
    n: int


@skill(asks=True)
async def pick(req: Nothing, ctx: SkillContext) -> Counted:
    """A structured answer whose schema has a bound (1..5)."""
    got = await ctx.ask("How many?", schema=Count)
    return Counted(n=got.n)


class Sleep(BaseModel):
    seconds: float


@skill(asks=True)
async def slow(req: Sleep, ctx: SkillContext) -> Sleep:
    """Work (sleep) before asking: the task is WORKING for that long."""
    await asyncio.sleep(req.seconds)
    await ctx.ask("Done sleeping: go on?")
    return req


class Said2(BaseModel):
    answer: str


@skill(asks=True)
async def careful(req: Nothing, ctx: SkillContext) -> Said2:
    """Asks, then holds while ``$NODE_TEST_HOLD`` exists (a crash can land mid-resume)."""
    answer = await ctx.ask("Go?")
    hold = os.environ.get("NODE_TEST_HOLD", "")
    _record(f"careful holding {answer}")
    for _ in range(600):  # at most 30 s
        if not (hold and os.path.exists(hold)):  # noqa: ASYNC240 - one stat, test agent
            break
        await asyncio.sleep(0.05)
    _record(f"careful done {answer}")
    return Said2(answer=answer)


class Ping(BaseModel):
    key: str


@skill
def echo(req: Ping) -> Ping:
    """Never asks: served by the fast path."""
    return req


agent = Agent(
    name="asker",
    description="Skills that stop and ask their caller.",
    skills=[review, link, fickle, pick, slow, careful, echo],
)
