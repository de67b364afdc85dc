"""Three agents tests/test_delegation_wait.py chains, on the scripted model (offline).

``bottom`` is a typed agent whose skills ask (``review``: a structured approval, ``confirm``: a
text code, ``consent``: an auth code); ``middle`` an LLM agent whose typed ``assess`` (declared ``asks=True``) calls
``bottom``'s ``review`` (and a function skill ``relay`` calls it itself, which mesh refuses:
only an LLM turn relays a question); ``top`` an LLM agent whose chat calls ``middle``'s
``assess``, or ``bottom``'s two skills at once (directly, or through ``middle``'s chat), or (``free ...``) a plain a2a-sdk agent that
asks (tests.asking_node named ``plain``). The nodes find each other at
``$MESH_TEST_MIDDLE_URL``, ``$MESH_TEST_BOTTOM_URL`` and ``$MESH_TEST_PLAIN_URL``.

Each finished ``review`` appends ``review APP-1 approve <note>`` to ``$NODE_TEST_CALLS``: that
the answer sent to the top was used at the bottom is visible from outside (the note ``slow``
makes it take 3 s first, after a ``review started`` line).
"""

from __future__ import annotations

import asyncio
import os
from typing import Literal

from pydantic import BaseModel, field_validator

from mesh import Agent, Call, Rule, Script, SkillContext, ToolContext, llm_skill, remote, skill

MIDDLE_URL = os.environ.get("MESH_TEST_MIDDLE_URL", "http://127.0.0.1:1")
BOTTOM_URL = os.environ.get("MESH_TEST_BOTTOM_URL", "http://127.0.0.1:1")
#: A plain a2a-sdk agent that asks (tests.asking_node, named ``plain``): any A2A child.
PLAIN_URL = os.environ.get("MESH_TEST_PLAIN_URL")


class Review(BaseModel):
    applicant_id: str
    amount: float


class Approval(BaseModel):
    decision: Literal["approve", "decline"]
    note: str = ""

    @field_validator("note")
    @classmethod
    def _said_something(cls, note: str) -> str:
        # A rule the JSON Schema does not carry: only the asker (the bottom) refuses it.
        if note.strip().lower() == "n/a":
            raise ValueError("say why, or leave the note out")
        return note


class Decision(BaseModel):
    applicant_id: str
    decision: Literal["approve", "decline"]
    note: str


class Identity(BaseModel):
    applicant_id: str


class Confirmed(BaseModel):
    applicant_id: str
    code: str


def _note(line: str) -> None:
    path = os.environ.get("NODE_TEST_CALLS")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


@skill(asks=True)
async def review(req: Review, ctx: SkillContext) -> Decision:
    """Ask a person to approve the amount."""
    ok = await ctx.ask(f"Approve {req.applicant_id} for {req.amount:,.0f}?", schema=Approval)
    if ok.note == "slow":  # a forward in flight for a while: a test stops a node meanwhile
        _note(f"review started {req.applicant_id}")
        await asyncio.sleep(3)
    _note(f"review {req.applicant_id} {ok.decision} {ok.note}")
    return Decision(applicant_id=req.applicant_id, decision=ok.decision, note=ok.note)


@skill(asks=True)
async def confirm(req: Identity, ctx: SkillContext) -> Confirmed:
    """Ask a person for the applicant's identity code."""
    code = await ctx.ask(f"Identity code of {req.applicant_id}?")
    return Confirmed(applicant_id=req.applicant_id, code=str(code))


class Consent(BaseModel):
    applicant_id: str
    granted: bool


@skill(asks=True)
async def consent(req: Identity, ctx: SkillContext) -> Consent:
    """Ask the applicant for a one-time consent code (an auth question)."""
    code = await ctx.ask(f"Consent code of {req.applicant_id}?", kind="auth")
    return Consent(applicant_id=req.applicant_id, granted=bool(str(code).strip()))


bottom = Agent(name="bottom", description="Asks people.", skills=[review, confirm, consent])

assess = llm_skill(
    "assess",
    input=Review,
    output=Decision,
    description="Assess an application (asks a reviewer).",
    asks=True,
)

_reviewer = remote(BOTTOM_URL, skill="review")


@skill
async def relay(req: Review) -> Decision:
    """A function skill that calls the asking skill itself: refused (only LLM turns relay)."""
    ctx = ToolContext(agent_name="middle")
    (tool,) = await _reviewer.tools(ctx)
    try:
        return Decision.model_validate(await tool.call(req.model_dump(), ctx))
    finally:
        await _reviewer.aclose()


middle = Agent(
    name="middle",
    description="Assesses applications through the reviewer.",
    instruction="You assess applications.",
    tools=[remote(BOTTOM_URL)],
    skills=[assess, relay],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)both (?P<applicant_id>APP-\d+)",
                steps=[
                    [
                        Call("bottom_review", {"applicant_id": "{applicant_id}", "amount": 70000}),
                        Call("bottom_confirm", {"applicant_id": "{applicant_id}"}),
                    ]
                ],
                answer="{bottom_review.decision} / {bottom_confirm.code}",
                on_error="failed: {error}",
            ),
            Rule(
                when=r'"applicant_id"',
                steps=[
                    Call(
                        "bottom_review",
                        {"applicant_id": "{input.applicant_id}", "amount": "{input.amount}"},
                    )
                ],
                answer_data={
                    "applicant_id": "{input.applicant_id}",
                    "decision": "{bottom_review.decision}",
                    "note": "{bottom_review.note}",
                },
            ),
        ],
        fallback="?",
    ),
)

top = Agent(
    name="top",
    description="Coordinates.",
    instruction="You coordinate.",
    tools=[
        remote(MIDDLE_URL, skill="assess"),
        remote(MIDDLE_URL, skill="chat"),
        remote(BOTTOM_URL),
        *([remote(PLAIN_URL, skill="review")] if PLAIN_URL else []),
    ],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)assess (?P<applicant_id>APP-\d+) (?P<amount>[\d,]+)",
                steps=[
                    Call(
                        "middle_assess",
                        {"applicant_id": "{applicant_id}", "amount": "{amount|number}"},
                    )
                ],
                answer="{middle_assess.applicant_id}: {middle_assess.decision} "
                "({middle_assess.note})",
                on_error="failed: {error}",
            ),
            Rule(
                when=r"(?i)free (?P<ref>\S+)",
                steps=[Call("plain_review", {"text": "free {ref}"})],
                answer="plain answered",
                on_error="failed: {error}",
            ),
            Rule(
                when=r"(?i)deep (?P<applicant_id>APP-\d+)",
                steps=[Call("ask_middle", {"text": "both {applicant_id}"})],
                answer="middle says: {ask_middle}",
                on_error="failed: {error}",
            ),
            Rule(
                when=r"(?i)consent (?P<applicant_id>APP-\d+)",
                steps=[Call("bottom_consent", {"applicant_id": "{applicant_id}"})],
                answer="consent granted: {bottom_consent.granted}",
                on_error="failed: {error}",
            ),
            Rule(
                when=r"(?i)both (?P<applicant_id>APP-\d+)",
                steps=[
                    [
                        Call("bottom_review", {"applicant_id": "{applicant_id}", "amount": 70000}),
                        Call("bottom_confirm", {"applicant_id": "{applicant_id}"}),
                    ]
                ],
                answer="{bottom_review.decision} / {bottom_confirm.code}",
                on_error="failed: {error}",
            ),
        ],
        fallback="?",
    ),
)
