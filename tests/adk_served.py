"""An ADK agent served over A2A with ``to_a2a``, on the fake model (tests/adk_fakes.Recaller):
``uvicorn tests.adk_served:app --port $ADK_PORT`` (the card names http://127.0.0.1:$ADK_PORT).
"""

from __future__ import annotations

import os

from google.adk.a2a.utils.agent_to_a2a import to_a2a
from google.adk.agents import LlmAgent

from tests.adk_fakes import Recaller

helper = LlmAgent(
    name="adk_helper",
    description="Repeats what it heard and what was said before in the conversation.",
    instruction="Repeat what you heard.",
    model=Recaller(),
)

app = to_a2a(helper, host="127.0.0.1", port=int(os.environ.get("ADK_PORT", "8000")))
