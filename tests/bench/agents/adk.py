"""The Google ADK agents of the bench (``make bench``'s ``adk`` and ``adk-coord-remote`` rows),
served with ADK's own ``to_a2a`` under uvicorn (``tests.bench.servers.adk_node``): what a user
would pick instead of mesh. google-adk is a dev dependency; the runtime never imports it.

Both are an ``LlmAgent`` on a fake ``BaseLlm`` (no network) whose turn is the same as the mesh
coordinator's scripted one (tests/bench/agents/coordinator.py): call one tool with the
applicant and amount, then answer ``"a-1001: score N tier T"`` from what it returned.

``local()``: the tool is an in-process function (the same CRC32 as the bench's specialist).
``remote(url)``: the tool is an ``AgentTool`` over a ``RemoteA2aAgent`` reaching the mesh typed
node at ``url`` (the ``mesh-node`` setup): ADK's delegation hop, against the same tool in process.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
from google.adk.models import BaseLlm, LlmCapabilities
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools.agent_tool import AgentTool
from google.genai import types

from tests.bench.agents.specialist import compute

__all__ = ["local", "remote"]

_ASK = re.compile(r"score (?P<id>[\w-]+) for (?P<amount>\d+)")
# The score in the tool's result as JSON: an object (the local tool) or a JSON string inside
# one (an AgentTool's {"result": "<the remote answer's text>"}, its quotes escaped).
_FOUND = re.compile(r'score\\*"\s*:\s*(?P<score>\d+).*?tier\\*"\s*:\s*\\*"(?P<tier>\w)', re.S)


def bench_bureau_score(applicant_id: str, amount: float) -> dict[str, Any]:
    """Score an applicant for a loan amount (deterministic)."""
    return compute(applicant_id, amount).model_dump()


def _answer(part: types.Part) -> LlmResponse:
    # Usage counted as a real model's answer has it (ADK logs a line per turn without it).
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=1, candidates_token_count=1, total_token_count=2
    )
    return LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


class ScoreCaller(BaseLlm):
    """First response: call ``tool`` with the applicant and amount the user named (``request``
    a JSON object, for an ``AgentTool``); next: the answer read from the tool's result."""

    model: str = "fake-bench-model"
    tool: str
    as_request: bool = False

    @property
    def capabilities(self) -> LlmCapabilities:
        # Declared outright: the name-based fallback would warn (a FutureWarning).
        return LlmCapabilities(output_schema_and_tools=True)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1] if llm_request.contents else None
        parts = list(last.parts or ()) if last else []
        results = [p.function_response.response for p in parts if p.function_response]
        if results:
            found = _FOUND.search(json.dumps(results[-1]))
            text = (
                f"a-1001: score {found['score']} tier {found['tier']}"
                if found
                else f"no score in the tool's answer: {json.dumps(results[-1])[:200]}"
            )
            yield _answer(types.Part(text=text))
            return
        said = " ".join(p.text for p in parts if p.text)
        ask = _ASK.search(said)
        args: dict[str, Any] = (
            {"applicant_id": ask["id"], "amount": float(ask["amount"])} if ask else {}
        )
        if self.as_request:
            args = {"request": json.dumps(args)}
        call = types.FunctionCall(name=self.tool, args=args)
        yield _answer(types.Part(function_call=call))


def local() -> LlmAgent:
    return LlmAgent(
        name="adk_coordinator",
        description="Scores applicants with an in-process tool.",
        instruction="Score the applicant.",
        model=ScoreCaller(tool="bench_bureau_score"),
        tools=[bench_bureau_score],
    )


def remote(url: str) -> LlmAgent:
    bureau = RemoteA2aAgent(
        name="bench_bureau",
        description="Scores an applicant for a loan amount.",
        agent_card=url.rstrip("/") + "/.well-known/agent-card.json",
    )
    return LlmAgent(
        name="adk_coordinator",
        description="Scores applicants through a mesh node.",
        instruction="Score the applicant.",
        model=ScoreCaller(tool="bench_bureau", as_request=True),
        tools=[AgentTool(agent=bureau)],
    )
