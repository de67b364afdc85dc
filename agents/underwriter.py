"""The underwriter: a person's approval, asked through the mesh.

    mesh serve agents.underwriter:agent --port 8431
    mesh call underwriter --skill review --json '{"applicant_id": "APP-738", "amount": 600000}'

One typed skill, ``review``, declared ``asks=True``: it asks its caller to approve or decline
(``ctx.ask`` with the ``Approval`` schema), so its task waits ``input-required`` until a message
answers it, across restarts of this node. The loan officer consults it for applications above
``UNDERWRITING_THRESHOLD`` that its policy did not decline; the question then waits at the
officer, attributed to this agent, for whoever talks to the officer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mesh import Agent, SkillContext, skill


class Review(BaseModel):
    applicant_id: str = Field(description="Applicant identifier, e.g. APP-738.", min_length=1)
    amount: float = Field(description="Requested loan amount.", gt=0)
    months: int = Field(default=60, description="Tenure in months.", gt=0)
    policy_decision: str = Field(default="", description="What the bank's policy said.")
    policy_reason: str = Field(default="", description="Why the policy said so.")


class Approval(BaseModel):
    decision: Literal["approve", "decline"]
    note: str = ""


class UnderwritingDecision(BaseModel):
    applicant_id: str
    decision: Literal["approve", "decline"]
    note: str
    #: One line for a recommendation that quotes the underwriter.
    summary: str


@skill(asks=True, tags=["underwriting", "approval"])
async def review(req: Review, ctx: SkillContext) -> UnderwritingDecision:
    """A person's approval of a large loan: asks to approve or decline, with a note."""
    question = f"Approve {req.applicant_id} for {req.amount:,.0f} over {req.months} months?"
    if req.policy_decision:
        question += f" Policy: {req.policy_decision}"
        question += f", {req.policy_reason}." if req.policy_reason else "."
    answer = await ctx.ask(question, schema=Approval)
    summary = f"Underwriter: {answer.decision.upper()}" + (
        f" ({answer.note})" if answer.note else ""
    )
    return UnderwritingDecision(
        applicant_id=req.applicant_id,
        decision=answer.decision,
        note=answer.note,
        summary=summary,
    )


agent = Agent(
    name="underwriter",
    description="Underwriter: a person approves or declines large loans (asks its caller).",
    skills=[review],
    tags=("lending", "approval"),
)
