"""``bench-coordinator``: an LLM agent on the scripted model whose one rule calls the tool
``score`` once and answers with its result. ``local`` has ``score`` as an in-process function;
``remote_agent`` gets it from the ``bench-bureau`` node over A2A. Same script, same answer.

    MESH_BENCH_PEER=http://127.0.0.1:8101 mesh serve tests.bench.agents.coordinator:remote_agent
"""

from __future__ import annotations

from mesh.agent import Agent
from mesh.models.scripted import Call, Rule, Script
from mesh.tools import tool
from tests.bench.agents.specialist import compute

SCRIPT = Script(
    rules=[
        Rule(
            when=r"score (?P<applicant_id>\S+) for (?P<amount>\d+)",
            steps=[
                [Call("score", {"applicant_id": "{applicant_id}", "amount": "{amount|number}"})]
            ],
            answer="{applicant_id}: {score.score} ({score.tier})",
        )
    ],
    fallback="say: score <applicant> for <amount>",
)

INSTRUCTION = "Score applicants with the score tool and report the result."


@tool
async def score(applicant_id: str, amount: float) -> dict[str, object]:
    """Score an applicant for a loan amount."""
    return compute(applicant_id, amount).model_dump()


local = Agent(
    name="bench-coordinator",
    description="Scores applicants through a tool (benchmark).",
    instruction=INSTRUCTION,
    tools=[score],
    script=SCRIPT,
)
