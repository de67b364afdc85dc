"""The income verifier: a deterministic specialist with one typed skill, ``verify``.

    mesh serve agents.income_verifier:agent --port 8421
    mesh call http://127.0.0.1:8421 --skill verify --json '{"applicant_id": "APP-612"}'

It compares the income an applicant declared with what their documents show (the fixed data in
``agents.applicants``). ``INCOME_VERIFIER_LATENCY_MS`` adds a pause, standing in for a slow
records system (the demo and tests use it to show parallel delegation).
"""

from __future__ import annotations

import asyncio
import os
from typing import Literal

from pydantic import BaseModel, Field

from agents.applicants import find_applicant
from mesh import Agent, SkillContext, SkillInputError, skill

Status = Literal["verified", "discrepancy", "unverifiable"]

# A declared income within this fraction of the documented one counts as verified.
TOLERANCE = 0.05


class VerifyRequest(BaseModel):
    applicant_id: str = Field(description="Applicant identifier, e.g. APP-612.", min_length=1)


class IncomeReport(BaseModel):
    applicant_id: str
    status: Status
    verified: bool
    declared_monthly_income: int
    verified_monthly_income: int | None = Field(
        description="Documented monthly income; None when there are no documents."
    )
    discrepancy_pct: float | None = Field(
        description="How much the declared income exceeds the documented one, in percent."
    )
    source: str
    note: str


def _latency() -> float:
    # Read per call so a test can start the node with a latency; bad values mean none.
    try:
        return max(0.0, float(os.environ.get("INCOME_VERIFIER_LATENCY_MS", "0")) / 1000)
    except ValueError:
        return 0.0


@skill(tags=["income", "kyc"], examples=['{"applicant_id": "APP-612"}'])
async def verify(req: VerifyRequest, ctx: SkillContext) -> IncomeReport:
    """Verify an applicant's declared monthly income against payslips and tax records."""
    applicant = find_applicant(req.applicant_id)
    if applicant is None:
        raise SkillInputError(
            f"applicant_id: no applicant {req.applicant_id!r} on file",
            errors=[{"field": "applicant_id", "message": "unknown applicant"}],
        )
    delay = _latency()
    if delay:
        await asyncio.sleep(delay)
    declared = applicant.declared_monthly_income
    documented = applicant.documented_monthly_income
    source = "payslips" if applicant.employment == "salaried" else "tax returns"
    if documented is None:
        return IncomeReport(
            applicant_id=applicant.applicant_id,
            status="unverifiable",
            verified=False,
            declared_monthly_income=declared,
            verified_monthly_income=None,
            discrepancy_pct=None,
            source="none",
            note=f"No income documents on file for {applicant.name}; ask for 6 months of statements.",
        )
    gap = round((declared - documented) / documented * 100, 1)
    ok = gap <= TOLERANCE * 100
    note = (
        f"Declared income matches {source} (within {TOLERANCE:.0%})."
        if ok
        else f"Declared income is {gap}% above {source}; use the documented figure."
    )
    return IncomeReport(
        applicant_id=applicant.applicant_id,
        status="verified" if ok else "discrepancy",
        verified=ok,
        declared_monthly_income=declared,
        verified_monthly_income=documented,
        discrepancy_pct=gap,
        source=source,
        note=note,
    )


agent = Agent(
    name="income-verifier",
    description="Verifies applicants' declared monthly income against documents on file.",
    skills=[verify],
    tags=("income", "kyc"),
)
