"""The LLM agent tests/test_node_llm_ask.py serves: its tools ask (``mesh.Ask``), on the
scripted model (offline). ``chat`` and the typed ``payout`` (``llm_skill``) both reach them.

Each run of ``lookup`` appends a line to ``$NODE_TEST_CALLS`` (``lookup APP-1``): that a tool
that finished before the turn waited is not run again on resume is visible from outside.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel

from mesh import Agent, Ask, Call, Rule, Script, ToolContext, llm_skill, tool


class Approval(BaseModel):
    decision: Literal["approve", "decline"]
    note: str = ""


@tool
def lookup(applicant_id: str, ctx: ToolContext) -> dict[str, Any]:
    """The applicant's profile; counts lookups in session state."""
    path = os.environ.get("NODE_TEST_CALLS")
    if path:
        with open(path, "a") as fh:
            fh.write(f"lookup {applicant_id}\n")
    ctx.state_delta["lookups"] = int(ctx.state.get("lookups", 0)) + 1
    return {"name": "Ann Lee", "income": 5200}


@tool
def approval(applicant_id: str, amount: float) -> Ask | dict[str, Any]:
    """Ask a human to approve amounts above 50,000."""
    if amount > 50_000:
        return Ask(f"Approve {applicant_id} for {amount:,.0f}?", schema=Approval)
    return {"decision": "approve", "note": "small amount"}


class Payout(BaseModel):
    applicant_id: str
    amount: float


class PayoutDecision(BaseModel):
    applicant_id: str
    decision: Literal["approve", "decline"]
    note: str


payout = llm_skill(
    "payout", input=Payout, output=PayoutDecision, description="Decide a payout, asking above 50k."
)

SCRIPT = Script(
    rules=[
        Rule(
            when=r'"applicant_id"',
            steps=[
                Call(
                    "approval",
                    {"applicant_id": "{input.applicant_id}", "amount": "{input.amount}"},
                )
            ],
            answer_data={
                "applicant_id": "{input.applicant_id}",
                "decision": "{approval.decision}",
                "note": "{approval.note}",
            },
        ),
        Rule(
            when=r"(?i)pay (?P<applicant_id>APP-\d+) (?P<amount>[\d,]+)",
            steps=[
                [
                    Call("lookup", {"applicant_id": "{applicant_id}"}),
                    Call(
                        "approval", {"applicant_id": "{applicant_id}", "amount": "{amount|number}"}
                    ),
                ]
            ],
            answer="{lookup.name}: {approval.decision} ({approval.note}); lookups {state.lookups}",
        ),
        Rule(when=r"(?i)hello", answer="hello back"),
    ],
    fallback="?",
)

agent = Agent(
    name="payout-desk",
    description="Pays out, asking a human above 50,000.",
    instruction="You pay out approved claims.",
    tools=[lookup, approval],
    skills=[payout],
    script=SCRIPT,
)
