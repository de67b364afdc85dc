"""The credit bureau scores each applicant on file as tests/support.py's BUREAU_SCORES says: the
table the end-to-end tests expect, checked here against the skill itself."""

from __future__ import annotations

import pytest

from agents.applicants import APPLICANTS
from agents.credit_bureau import ScoreRequest, score
from tests.support import BUREAU_SCORES

TIERS = {
    "APP-501": "deep-subprime",
    "APP-612": "deep-subprime",
    "APP-738": "prime",
    "APP-847": "prime",
    "APP-902": "subprime",
}


def test_the_table_covers_every_applicant_on_file() -> None:
    assert set(BUREAU_SCORES) == set(APPLICANTS) == set(TIERS)


@pytest.mark.parametrize("applicant_id", sorted(BUREAU_SCORES))
def test_the_bureau_scores_an_applicant_as_the_table_says(applicant_id: str) -> None:
    report = score(ScoreRequest(applicant_id=applicant_id, amount=100_000))
    assert (report.score, report.tier) == (BUREAU_SCORES[applicant_id], TIERS[applicant_id])
    # The id is read as the bureau reads it: case and surrounding spaces do not change a score.
    again = score(ScoreRequest(applicant_id=f" {applicant_id.lower()} ", amount=100_000))
    assert again.score == BUREAU_SCORES[applicant_id]
