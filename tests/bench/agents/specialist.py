"""``bench-bureau``: one typed, deterministic skill ``score`` and nothing else (no model).

Its work is a hash, microseconds, so a row serving it measures the node, not the skill.
"""

from __future__ import annotations

import zlib

from pydantic import BaseModel

from mesh._agent import Agent
from mesh._skills import Skill, skill


class ScoreRequest(BaseModel):
    applicant_id: str
    amount: float


class ScoreReport(BaseModel):
    applicant_id: str
    score: int
    tier: str


def compute(applicant_id: str, amount: float) -> ScoreReport:
    """The same answer for the same applicant and amount, every time."""
    value = 300 + zlib.crc32(f"{applicant_id}:{amount:.2f}".encode()) % 551
    tier = "A" if value >= 740 else "B" if value >= 670 else "C" if value >= 580 else "D"
    return ScoreReport(applicant_id=applicant_id, score=value, tier=tier)


async def _score(req: ScoreRequest) -> ScoreReport:
    """Score an applicant for a loan amount (deterministic)."""
    return compute(req.applicant_id, req.amount)


score: Skill = skill(_score, id="score", tags=["credit"])


agent = Agent(
    name="bench-bureau",
    description="Deterministic credit scores for benchmarks.",
    skills=[score],
)
