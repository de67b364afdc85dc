"""An LLM agent whose turn waits on a gate (tests/test_node_fastpath_llm.py): its one tool,
``hold``, returns once the file ``$NODE_TEST_GATE`` exists (at most 20 s), so a test can
follow the turn while it runs. Scripted model, offline."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from mesh import Agent, Call, Rule, Script, tool


@tool
async def hold() -> dict[str, Any]:
    """Wait for the test's gate."""
    gate = os.environ["NODE_TEST_GATE"]
    for _ in range(2_000):
        if os.path.exists(gate):  # noqa: ASYNC240 - one stat, test agent
            return {"released": True}
        await asyncio.sleep(0.01)
    return {"released": False}


agent = Agent(
    name="gated-desk",
    description="Answers once its gate opens.",
    instruction="Wait for the gate, then answer.",
    tools=[hold],
    script=Script(
        rules=[Rule(when=r"(?i)wait", steps=[Call("hold", {})], answer="released {hold.released}")],
        fallback="?",
    ),
)
