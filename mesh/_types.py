"""The small vocabulary every layer shares: content, parts, function calls, usage.

These mirror the shapes of google-genai's ``types`` (role/parts, functionCall/functionResponse,
usage metadata) so a Gemini request is a direct translation, but they are our own pydantic
models: importing ``google.genai`` costs ~0.5 s, and only ``mesh._models.gemini`` may pay it.
Everything here is JSON-serialisable, so sessions persist it as is.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Content",
    "FunctionCall",
    "FunctionResponse",
    "Part",
    "Role",
    "Usage",
]

Role = Literal["user", "model"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FunctionCall(_Frozen):
    """The model asks for a tool. ``id`` pairs the call with its response."""

    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class FunctionResponse(_Frozen):
    """A tool's result. ``response`` is ``{"result": ...}`` or ``{"error": {...}}``."""

    id: str
    name: str
    response: dict[str, Any]

    @property
    def is_error(self) -> bool:
        return "error" in self.response


class Part(_Frozen):
    """One piece of content. Exactly one of text / function_call / function_response is set."""

    text: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    # Gemini "thinking" text is kept apart from the answer.
    thought: bool = False
    # Opaque provider token (Gemini's thoughtSignature, base64) that must round-trip unchanged.
    thought_signature: str | None = None

    @classmethod
    def from_text(cls, text: str) -> Part:
        return cls(text=text)


class Content(_Frozen):
    """A turn of the conversation: who spoke, and the parts."""

    role: Role
    parts: tuple[Part, ...] = ()

    @classmethod
    def user(cls, text: str) -> Content:
        return cls(role="user", parts=(Part(text=text),))

    @classmethod
    def model(cls, text: str) -> Content:
        return cls(role="model", parts=(Part(text=text),))

    @property
    def text(self) -> str:
        """The non-thought text parts joined, '' when there are none."""
        return "".join(p.text for p in self.parts if p.text is not None and not p.thought)

    @property
    def function_calls(self) -> list[FunctionCall]:
        return [p.function_call for p in self.parts if p.function_call is not None]

    @property
    def function_responses(self) -> list[FunctionResponse]:
        return [p.function_response for p in self.parts if p.function_response is not None]


class Usage(_Frozen):
    """Token usage of ONE model response (never a sum over streamed chunks)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    thinking_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            thinking_tokens=self.thinking_tokens + other.thinking_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )

    def as_dict(self) -> dict[str, int]:
        return self.model_dump()
