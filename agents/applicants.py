"""The loan desk's applicants: a small fixed data set, so every run tells the same story.

``declared_monthly_income`` is what the applicant wrote on the form; ``documented_monthly_income``
is what their payslips / tax returns show (the income verifier's source of truth).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["APPLICANTS", "Applicant", "find_applicant"]

Employment = Literal["salaried", "self-employed", "contract"]


@dataclass(frozen=True)
class Applicant:
    applicant_id: str
    name: str
    city: str
    employment: Employment
    employer: str
    years_employed: float
    declared_monthly_income: int
    documented_monthly_income: int | None  # None: no documents on file
    existing_monthly_obligations: int

    def profile(self) -> dict[str, Any]:
        """What the loan officer may see (the documented income is the verifier's business)."""
        data = asdict(self)
        del data["documented_monthly_income"]
        return data


APPLICANTS: dict[str, Applicant] = {
    a.applicant_id: a
    for a in (
        Applicant("APP-501", "Asha Rao", "Pune", "salaried", "Infosys", 6.0, 145_000, 145_000, 12_000),
        Applicant("APP-612", "Rahul Mehta", "Mumbai", "self-employed", "Mehta Traders", 9.5, 210_000, 168_000, 45_000),
        Applicant("APP-738", "Meera Iyer", "Chennai", "salaried", "TCS", 2.0, 88_000, 86_500, 31_000),
        Applicant("APP-847", "Vikram Singh", "Delhi", "contract", "Freelance (design)", 1.0, 120_000, None, 8_000),
        Applicant("APP-902", "Fatima Sheikh", "Hyderabad", "salaried", "Deloitte", 12.0, 260_000, 262_000, 60_000),
    )
}  # fmt: skip


def find_applicant(applicant_id: str) -> Applicant | None:
    """The applicant with this id (case and surrounding spaces ignored), or None."""
    return APPLICANTS.get(applicant_id.strip().upper())
