"""The mesh agents the ADK interop tests (tests/test_interop_adk*.py) serve with ``mesh serve``.

``quotes``: one typed skill, so a text-only client's JSON object selects it without naming it.
``chatter``: an LLM agent on the scripted model. ``coordinator``: an LLM agent whose one remote
tool is the ADK ``to_a2a`` agent at ``$ADK_AGENT_URL`` (tests/adk_served.py).
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from mesh import Agent, Call, Rule, Script, remote, skill


class Convert(BaseModel):
    amount: float
    currency: str


class Converted(BaseModel):
    amount: float
    currency: str
    eur: float


RATES = {"USD": 0.5, "GBP": 2.0}


@skill
def convert(req: Convert) -> Converted:
    """Convert an amount to euros (USD at 0.5, GBP at 2.0)."""
    return Converted(amount=req.amount, currency=req.currency, eur=req.amount * RATES[req.currency])


quotes = Agent(name="quotes", description="Converts amounts to euros.", skills=[convert])

chatter = Agent(
    name="chatter",
    description="Answers greetings.",
    instruction="Greet people.",
    script=Script(
        rules=[Rule(when=r"(?i)hello,? (?P<who>\w+)", answer="Hello {who}, from the mesh.")],
        fallback="I only answer greetings.",
    ),
)

# The ADK agent's card names its one skill after the agent ("adk_helper"); remote(url) makes it
# the tool "<card name>_<skill id>".
ADK_TOOL = "adk_helper_adk_helper"

coordinator = Agent(
    name="coordinator",
    description="Asks the ADK helper.",
    instruction="Ask the helper.",
    tools=[remote(os.environ.get("ADK_AGENT_URL", "http://127.0.0.1:1"))],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)ask the helper: (?P<q>.+)",
                steps=[Call(ADK_TOOL, {"text": "{q}"})],
                answer="helper answered: {" + ADK_TOOL + "}",
            )
        ]
    ),
)
