"""``bench-coordinator``: an LLM agent on the scripted model whose one rule calls the tool
``bench_bureau_score`` once and answers with its result. ``local`` has that tool as an
in-process function; ``remote_agent`` gets it from the ``bench-bureau`` node over A2A (the name
``remote()`` gives the peer's skill). Same script, same answer: the difference is one hop.

    BENCH_PEER_URL=http://127.0.0.1:8101 mesh serve tests.bench.agents.coordinator:remote_agent
"""

from __future__ import annotations

import os

from mesh._agent import Agent
from mesh._models.scripted import Call, Rule, Script
from mesh._remote import remote
from mesh._tools import Tool, tool
from tests.bench.agents.specialist import compute

TOOL = "bench_bureau_score"

SCRIPT = Script(
    rules=[
        Rule(
            when=r"score (?P<applicant_id>\S+) for (?P<amount>\d+)",
            steps=[[Call(TOOL, {"applicant_id": "{applicant_id}", "amount": "{amount|number}"})]],
            answer=f"{{applicant_id}}: score {{{TOOL}.score}} tier {{{TOOL}.tier}}",
        )
    ],
    fallback="say: score <applicant> for <amount>",
)

INSTRUCTION = "Score applicants with the score tool and report the result."


async def _score(applicant_id: str, amount: float) -> dict[str, object]:
    """Score an applicant for a loan amount."""
    return compute(applicant_id, amount).model_dump()


score: Tool = tool(_score, name=TOOL)


local = Agent(
    name="bench-coordinator",
    description="Scores applicants through a tool (benchmark).",
    instruction=INSTRUCTION,
    tools=[score],
    script=SCRIPT,
)

# The bench starts the specialist first and passes its URL; no registry in the loop.
remote_agent = Agent(
    name="bench-coordinator",
    description="Scores applicants through a remote specialist (benchmark).",
    instruction=INSTRUCTION,
    tools=[
        remote(
            "bench-bureau",
            skill="score",
            url=os.environ.get("BENCH_PEER_URL", "http://127.0.0.1:8101"),
        )
    ],
    script=SCRIPT,
)
