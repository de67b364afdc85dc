"""The credit bureau: a deterministic specialist with one typed skill, ``score``.

    mesh serve agents.credit_bureau:agent --port 8017
    mesh call http://127.0.0.1:8017 --skill score --json '{"applicant_id": "APP-501", "amount": 250000}'

No model: the score is a pure function of the applicant id (300-900, from a hash), so every run
of the demo and every test sees the same numbers. Only applicants on file (``agents.applicants``)
are scored: any other id is rejected as not on file, like a real bureau with no record.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, Field

from agents.applicants import APPLICANTS, find_applicant
from mesh import Agent, SkillInputError, skill

Tier = Literal["prime", "near-prime", "subprime", "deep-subprime"]


class ScoreRequest(BaseModel):
    applicant_id: str = Field(description="Applicant identifier, e.g. APP-501.", min_length=1)
    amount: float = Field(description="Requested loan amount.", gt=0)


class ScoreReport(BaseModel):
    applicant_id: str
    score: int = Field(ge=300, le=900)
    tier: Tier
    flags: list[str]
    narrative: str


def _score(applicant_id: str) -> int:
    digest = hashlib.sha256(applicant_id.strip().upper().encode()).digest()
    return 300 + int.from_bytes(digest[:4], "big") % 601


def _tier(score: int) -> Tier:
    if score >= 740:
        return "prime"
    if score >= 670:
        return "near-prime"
    if score >= 580:
        return "subprime"
    return "deep-subprime"


@skill(tags=["credit", "risk"], examples=['{"applicant_id": "APP-501", "amount": 250000}'])
def score(req: ScoreRequest) -> ScoreReport:
    """Credit score (300-900), tier and risk flags of an applicant for a requested amount."""
    if find_applicant(req.applicant_id) is None:
        raise SkillInputError(
            f"applicant_id: no applicant {req.applicant_id!r} on file; "
            f"applicants on file: {', '.join(APPLICANTS)}",
            errors=[{"field": "applicant_id", "message": "not on file"}],
        )
    value = _score(req.applicant_id)
    tier = _tier(value)
    flags: list[str] = []
    # The bureau's "capacity" for an applicant grows with the score; above it the amount is high.
    capacity = (value - 250) * 1000
    if req.amount > capacity:
        flags.append("amount_exceeds_capacity")
    if tier in ("subprime", "deep-subprime"):
        flags.append("thin_or_impaired_file")
    if req.amount >= 500_000:
        flags.append("large_exposure")
    # What the flags mean in words; the score and tier are fields of their own (a caller that
    # quotes both would otherwise say the score twice).
    narrative = (
        "No adverse flags."
        if not flags
        else "Flags: " + ", ".join(f.replace("_", " ") for f in flags) + "."
    )
    return ScoreReport(
        applicant_id=req.applicant_id, score=value, tier=tier, flags=flags, narrative=narrative
    )


agent = Agent(
    name="credit-bureau",
    description="Deterministic credit bureau: scores applicants (300-900) with tier and risk flags.",
    skills=[score],
    tags=("credit", "bureau"),
)
