"""An LLM agent whose model says how it was asked (tests/test_node_llm_stream.py): each model
call appends ``stream`` or ``generate`` to ``$NODE_TEST_DIR/<context id>.calls``. Its one tool,
``hold``, returns once ``$NODE_TEST_DIR/<context id>.go`` exists (at most 20 s), so a test can
follow a turn while it runs. Scripted model, offline."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mesh import (
    Agent,
    Call,
    ModelRequest,
    ModelResponse,
    Rule,
    Script,
    ScriptedModel,
    ToolContext,
    current_context,
    tool,
)


def _file(context_id: str, suffix: str) -> Path:
    return Path(os.environ["NODE_TEST_DIR"]) / f"{context_id}{suffix}"


@tool
async def hold(ctx: ToolContext) -> dict[str, Any]:
    """Wait for the test's gate."""
    gate = _file(ctx.session_id, ".go")
    for _ in range(2_000):
        if gate.exists():
            return {"released": True}
        await asyncio.sleep(0.01)
    return {"released": False}


class Recording(ScriptedModel):
    """The scripted model, writing down which way each call asked for its answer."""

    def _record(self, how: str) -> None:
        ctx = current_context()
        assert ctx is not None
        with _file(ctx.session_id, ".calls").open("a") as out:
            out.write(how + "\n")

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self._record("generate")
        return await super().generate(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelResponse]:
        self._record("stream")
        async for response in super().stream(request):
            yield response


agent = Agent(
    name="streamed-desk",
    description="Answers whole unless someone follows.",
    instruction="Wait for the gate when asked to, else echo.",
    tools=[hold],
    model=Recording(
        Script(
            rules=[
                Rule(
                    when=r"(?i)wait",
                    steps=[Call("hold", {})],
                    answer="released {hold.released} after the gate",
                )
            ],
            fallback="{input}",
        )
    ),
)
