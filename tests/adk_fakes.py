"""A fake Google ADK model (``BaseLlm``) for the interop tests: no network, no key.

``ToolCaller``: its first response calls one tool with fixed arguments, its next one answers
``"<prefix> <what the tool returned, as JSON>"``, and it keeps every tool result it was given
(``seen``) so a test can assert what reached the model. ``Recaller``: answers each user message
with the message and the user's earlier messages in the session (to show context kept across
turns), streamed in two chunks when ADK asks for a stream.

Imported by tests only (google-adk is a dev dependency; the runtime never imports it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models import BaseLlm, LlmCapabilities, LlmRequest, LlmResponse
from google.genai import types
from pydantic import Field


def _text(text: str, *, partial: bool = False) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=text)]), partial=partial
    )


def _user_texts(request: LlmRequest) -> list[str]:
    return [
        part.text
        for content in request.contents
        if content.role == "user"
        for part in content.parts or ()
        if part.text and not part.text.startswith("For context:")
    ]


class _Fake(BaseLlm):
    model: str = "fake-adk-model"

    @property
    def capabilities(self) -> LlmCapabilities:
        # Declared outright: the name-based fallback would warn (a FutureWarning).
        return LlmCapabilities(output_schema_and_tools=True)


class ToolCaller(_Fake):
    """Calls ``tool`` with ``args``, then answers with what it returned."""

    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    prefix: str = "The tool said:"
    #: Each ``function_response.response`` this model was given, in order.
    seen: list[dict[str, Any]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1] if llm_request.contents else None
        results = [
            part.function_response.response or {}
            for part in (last.parts or () if last else ())
            if part.function_response is not None
        ]
        if not results:
            call = types.FunctionCall(name=self.tool, args=self.args)
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(function_call=call)])
            )
            return
        self.seen.extend(results)
        yield _text(f"{self.prefix} {json.dumps(results[-1], sort_keys=True)}")


class Recaller(_Fake):
    """Answers ``heard: <message> | earlier: <the user's earlier messages, ' / '-joined>``."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        texts = _user_texts(llm_request)
        heard, earlier = (texts[-1], texts[:-1]) if texts else ("", [])
        answer = f"heard: {heard} | earlier: {' / '.join(earlier) or '-'}"
        if stream:
            half = len(answer) // 2
            yield _text(answer[:half], partial=True)
            yield _text(answer[half:], partial=True)
        yield _text(answer)
