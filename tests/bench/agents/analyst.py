"""The LLM specialist hop (issue 19 item 2: "an LLM specialist at most its own turn plus 1.0 ms").

``agent`` (``bench-analyst``) is an LLM specialist on the scripted model: its own small turn
calls one in-process tool (the bureau's score) and answers in a sentence, the coordinator's
turn under another name. ``bench-lead`` is a coordinator on the scripted model whose one rule
asks a tool ``ask_bench_analyst`` and answers with what it said:

- ``remote_lead`` gets that tool from the ``bench-analyst`` node over A2A (``remote()`` of its
  text skill ``chat``: the model's text in, the specialist's answer out);
- ``local_lead`` has it in process: the specialist's work (the score and its sentence) done by a
  function, without the specialist's model turn, its node or the hop.

Same script, same answer ("a-1001: score 396 tier D"). ``remote_lead - local_lead`` (p50) is the
hop plus the specialist's own turn; the specialist served alone gives that turn as a caller sees
it (docs/performance.md "The rows").

    BENCH_PEER_URL=http://127.0.0.1:8102 mesh serve tests.bench.agents.analyst:remote_lead
"""

from __future__ import annotations

import os
import re

from mesh._agent import Agent
from mesh._models.scripted import Call, Rule, Script
from mesh._remote import remote
from mesh._tools import tool
from tests.bench.agents.coordinator import SCRIPT as SPECIALIST_SCRIPT
from tests.bench.agents.coordinator import score
from tests.bench.agents.specialist import compute

ASK = "ask_bench_analyst"
WHEN = r"score (?P<applicant_id>\S+) for (?P<amount>\d+)"

agent = Agent(
    name="bench-analyst",
    description="Scores applicants with its own model turn and one tool (benchmark).",
    instruction="Score applicants with the score tool and report the result.",
    tools=[score],
    script=SPECIALIST_SCRIPT,
)

LEAD_SCRIPT = Script(
    rules=[
        Rule(
            when=WHEN,
            steps=[[Call(ASK, {"text": "score {applicant_id} for {amount}"})]],
            answer=f"{{{ASK}}}",
        )
    ],
    fallback="say: score <applicant> for <amount>",
)

LEAD_INSTRUCTION = "Ask the analyst to score applicants and pass its answer on."


async def _ask(text: str) -> str:
    """Ask the analyst (here: its work, in process)."""
    found = re.search(WHEN, text)
    if found is None:
        return "say: score <applicant> for <amount>"
    report = compute(found["applicant_id"], float(found["amount"]))
    return f"{report.applicant_id}: score {report.score} tier {report.tier}"


local_lead = Agent(
    name="bench-lead",
    description="Asks an analyst to score applicants, in process (benchmark).",
    instruction=LEAD_INSTRUCTION,
    tools=[tool(_ask, name=ASK)],
    script=LEAD_SCRIPT,
)

# The bench starts the specialist first and passes its URL; no registry in the loop.
remote_lead = Agent(
    name="bench-lead",
    description="Asks a remote LLM analyst to score applicants (benchmark).",
    instruction=LEAD_INSTRUCTION,
    tools=[
        remote(
            "bench-analyst",
            skill="chat",
            url=os.environ.get("BENCH_PEER_URL", "http://127.0.0.1:8102"),
        )
    ],
    script=LEAD_SCRIPT,
)
