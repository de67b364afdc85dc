"""The loan officer: an LLM coordinator that delegates to three specialists.

    mesh up agents/mesh.toml                    # the registry, this agent and its specialists
    mesh chat loan-officer
    > Should we approve APP-612 for 400,000 over 48 months?

Local tools: ``lookup_applicant``, ``calculate_emi``, ``apply_lending_policy``. Remote tools,
found through the registry: the credit bureau's ``score`` and the income verifier's skills,
called in the same model response so they run in parallel, then the underwriter's ``review``:
an application above ``UNDERWRITING_THRESHOLD`` that the policy did not decline waits for a
person's approval, asked by the underwriter and relayed to whoever talks to this agent. With
``GOOGLE_API_KEY`` set the model is Gemini; without, the offline ``LOAN_SCRIPT`` below plays the
same steps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from agents.applicants import APPLICANTS, find_applicant
from mesh import Agent, Call, RemoteAgent, Rule, Script, ToolContext, ToolError, remote

# Seconds each delegation may take, retries included.
DEADLINE_S = float(os.environ.get("LOAN_DESK_DEADLINE_S", "20"))
# Applications above this amount (that the policy did not decline) need the underwriter's
# approval: a person's answer, relayed through this agent.
UNDERWRITING_THRESHOLD = float(os.environ.get("UNDERWRITING_THRESHOLD", "500000"))
DEFAULT_RATE_PCT = 11.5
DEFAULT_MONTHS = 60
Decision = Literal["approve", "refer", "decline"]


def lookup_applicant(applicant_id: str) -> dict[str, Any]:
    """The applicant's profile: name, employment, declared monthly income, existing monthly
    obligations (EMIs already paid)."""
    applicant = find_applicant(applicant_id)
    if applicant is None:
        raise ToolError(
            f"no applicant {applicant_id!r} on file; known applicants: {', '.join(APPLICANTS)}",
            kind="not_found",
        )
    return applicant.profile()


def calculate_emi(
    principal: float, annual_rate_pct: float = DEFAULT_RATE_PCT, months: int | None = None
) -> dict[str, Any]:
    """Monthly instalment (EMI) of a loan: principal, yearly interest rate in percent, tenure in
    months (default 60)."""
    months = months or DEFAULT_MONTHS
    if principal <= 0 or months <= 0 or not 0 <= annual_rate_pct < 100:
        raise ToolError(
            "principal and months must be positive and annual_rate_pct between 0 and 100",
            kind="invalid_arguments",
        )
    r = annual_rate_pct / 12 / 100
    emi = (
        principal / months
        if r == 0
        else principal * r * (1 + r) ** months / ((1 + r) ** months - 1)
    )
    return {
        "principal": round(principal, 2),
        "annual_rate_pct": annual_rate_pct,
        "months": months,
        "emi": round(emi, 2),
        "total_payable": round(emi * months, 2),
        "total_interest": round(emi * months - principal, 2),
    }


def apply_lending_policy(
    score: int,
    declared_monthly_income: float,
    verified_monthly_income: float | None,
    existing_monthly_obligations: float,
    emi: float,
) -> dict[str, Any]:
    """The bank's policy: decision (approve / refer / decline) from the credit score, the
    income to trust (verified when known) and the debt-to-income ratio after the new EMI."""
    income = (
        verified_monthly_income if verified_monthly_income is not None else declared_monthly_income
    )
    if income <= 0:
        raise ToolError("monthly income must be positive", kind="invalid_arguments")
    dti = (existing_monthly_obligations + emi) / income * 100
    reasons: list[str] = []
    decision: Decision = "approve"
    if score < 580:
        decision, reasons = "decline", [f"credit score {score} is below 580"]
    elif dti > 60:
        decision, reasons = "decline", [f"debt-to-income would be {dti:.0f}% (limit 60%)"]
    else:
        if score < 670:
            reasons.append(f"credit score {score} is below 670")
        if dti > 45:
            reasons.append(f"debt-to-income would be {dti:.0f}% (comfort limit 45%)")
        if verified_monthly_income is None:
            reasons.append("income could not be verified")
        if reasons:
            decision = "refer"
    reason = "; ".join(reasons) or "score and affordability within policy"
    return {
        "decision": decision,
        "debt_to_income_pct": round(dti, 1),
        "income_used": income,
        "reason": reason,
    }


class UnderwriterReview(RemoteAgent):
    """The underwriter's ``review`` as a tool that delegates only when a person must decide.

    At or below ``UNDERWRITING_THRESHOLD``, or when the policy declined, the call answers here
    with the policy's decision and no hop, so small applications go as they always went (and
    the underwriter need not be running). Above it, the underwriter asks; its answer's
    ``summary`` comes back as ``line``, one more line of the recommendation.
    """

    async def invoke(
        self, tool: Any, args: Mapping[str, Any], ctx: ToolContext, **resume: Any
    ) -> Any:
        # ``resume``: the runtime's way back to a child it already has (forward an answer,
        # follow a long task); passed on whole, so only a new call is gated.
        decision = str(args.get("policy_decision", ""))
        amount = args.get("amount")
        # An amount that is not a number goes to the underwriter, whose schema names the field.
        small = isinstance(amount, int | float) and amount <= UNDERWRITING_THRESHOLD
        if not any(v is not None for v in resume.values()) and (decision == "decline" or small):
            return {"decision": decision, "note": "", "line": ""}
        answer = await super().invoke(tool, args, ctx, **resume)
        if isinstance(answer, Mapping) and answer.get("summary"):
            return {**answer, "line": f"\n- {answer['summary']}."}
        return answer

    def copy(self) -> UnderwriterReview:
        """The same configuration as a fresh ``UnderwriterReview`` (what a node binds)."""
        return UnderwriterReview(
            self.agent,
            self.skill,
            url=self.url,
            deadline_s=self.deadline_s,
            wait_deadline_s=self.wait_deadline_s,
            policy=self.policy,
            card_ttl_s=self.card_ttl_s,
        )


# What the offline script reads from a message. Each is searched on its own (linear time, any
# order); an amount is a number of 4+ digits that is not part of an applicant id.
_APPLICANT = r"\b(?i:APP)-\d+\b"
_AMOUNT = r"(?<![\w,-])(\d[\d,]{3,})"
_MONTHS = r"\b(\d{1,3})\s*(?i:months?|mo)\b"

_ASSESSMENT_STEPS = [
    [Call("lookup_applicant", {"applicant_id": "{applicant_id|upper}"})],
    # One model response, three calls: the two specialists run in parallel.
    [
        Call(
            "credit_bureau_score",
            {"applicant_id": "{applicant_id|upper}", "amount": "{amount|number}"},
        ),
        Call("income_verifier_verify", {"applicant_id": "{applicant_id|upper}"}),
        Call("calculate_emi", {"principal": "{amount|number}", "months": "{months|int}"}),
    ],
    [
        Call(
            "apply_lending_policy",
            {
                "score": "{credit_bureau_score.score}",
                "declared_monthly_income": "{lookup_applicant.declared_monthly_income}",
                "verified_monthly_income": "{income_verifier_verify.verified_monthly_income}",
                "existing_monthly_obligations": "{lookup_applicant.existing_monthly_obligations}",
                "emi": "{calculate_emi.emi}",
            },
        )
    ],
    # Answers here below the threshold; above it, the underwriter asks a person.
    [
        Call(
            "underwriter_review",
            {
                "applicant_id": "{applicant_id|upper}",
                "amount": "{amount|number}",
                "months": "{calculate_emi.months}",
                "policy_decision": "{apply_lending_policy.decision}",
                "policy_reason": "{apply_lending_policy.reason}",
            },
        )
    ],
]

# A missing applicant is the user's to fix, not an outage: say so, and who is on file.
_NOT_ON_FILE = (
    "{applicant_id|upper} is not on file, so there is nothing to assess. Applicants on file: "
    + ", ".join(APPLICANTS)
    + "."
)

LOAN_SCRIPT = Script(
    rules=[
        Rule(
            # "Should we approve APP-612 for 400,000 over 48 months?", and follow-ups that keep
            # the applicant: "what if the amount were 200000 instead?", "and over 36 months?"
            when=_AMOUNT + "|" + _MONTHS,
            find={"applicant_id": _APPLICANT, "amount": _AMOUNT, "months": _MONTHS},
            remember=["applicant_id", "amount", "months"],
            requires=["applicant_id", "amount"],
            steps=_ASSESSMENT_STEPS,
            answer=(
                "Recommendation for {lookup_applicant.name} ({applicant_id|upper}), loan of "
                "{calculate_emi.principal} over {calculate_emi.months} months: "
                "{underwriter_review.decision|upper}.\n"
                # The bureau's narrative tells the flags; the score and tier are said here once.
                "- Credit bureau: score {credit_bureau_score.score} ({credit_bureau_score.tier}). "
                "{credit_bureau_score.narrative}\n"
                "- Income verifier: {income_verifier_verify.status}. {income_verifier_verify.note}\n"
                "- EMI {calculate_emi.emi} per month at {calculate_emi.annual_rate_pct}%; "
                "debt-to-income {apply_lending_policy.debt_to_income_pct}%."
                # Empty below the underwriting threshold: the answer is as it always was.
                "{underwriter_review.line}\n"
                "Why: {apply_lending_policy.reason}."
            ),
            on_error={
                "not_found": _NOT_ON_FILE,
                "remote_rejected": "The assessment of {applicant_id|upper} was refused: {error}",
                "*": "I can't complete the assessment of {applicant_id|upper} right now: {error}",
            },
        ),
        Rule(
            # An amount, but no applicant yet in this conversation.
            when=_AMOUNT,
            find={"amount": _AMOUNT},
            answer=(
                "Which applicant is that for? Name one, e.g. 'Should we approve APP-612 for "
                "{amount}?'. Applicants on file: " + ", ".join(APPLICANTS) + "."
            ),
        ),
        Rule(
            # "Tell me about APP-501"
            when=_APPLICANT,
            find={"applicant_id": _APPLICANT},
            remember=["applicant_id"],
            steps=[
                [
                    Call("lookup_applicant", {"applicant_id": "{applicant_id|upper}"}),
                    Call("income_verifier_verify", {"applicant_id": "{applicant_id|upper}"}),
                ]
            ],
            answer=(
                "{lookup_applicant.name} ({applicant_id|upper}), {lookup_applicant.employment} at "
                "{lookup_applicant.employer}, {lookup_applicant.city}. Declares "
                "{lookup_applicant.declared_monthly_income} a month; income verifier: "
                "{income_verifier_verify.status}. {income_verifier_verify.note} "
                "Ask about a loan amount for a recommendation."
            ),
            on_error={
                "not_found": "{applicant_id|upper} is not on file. Applicants on file: "
                + ", ".join(APPLICANTS)
                + ".",
                "*": "I can't look up {applicant_id|upper} right now: {error}",
            },
        ),
    ],
    fallback=(
        "I'm the loan officer. Ask me e.g. 'Should we approve APP-612 for 400,000 over 48 "
        "months?'. Applicants on file: " + ", ".join(APPLICANTS) + "."
    ),
)

INSTRUCTION = f"""You are a careful loan officer at a retail bank.
For a loan question: look the applicant up, then in ONE response call the credit bureau's score
tool, the income verifier's verify tool and calculate_emi (they run in parallel), then call
apply_lending_policy with their results, then underwriter_review with the applicant, amount,
months and the policy's decision and reason (above {UNDERWRITING_THRESHOLD:,.0f} it asks a person
to approve or decline; the decision it returns is the recommendation), and answer with the
decision, the score and tier, the income verification status, the EMI and the debt-to-income
ratio, the reason and the underwriter's note when there is one.
If a tool reports an error (for example the credit bureau is unavailable), say so plainly and do
not guess the missing facts. Amounts are in rupees."""

agent = Agent(
    name="loan-officer",
    description="Assesses personal-loan applications with the credit bureau and income verifier.",
    instruction=INSTRUCTION,
    tools=[
        lookup_applicant,
        calculate_emi,
        apply_lending_policy,
        remote("credit-bureau", skill="score", deadline_s=DEADLINE_S),
        remote("income-verifier", deadline_s=DEADLINE_S),
        UnderwriterReview("underwriter", skill="review", deadline_s=DEADLINE_S),
    ],
    script=LOAN_SCRIPT,
    tags=("lending", "coordinator"),
)
