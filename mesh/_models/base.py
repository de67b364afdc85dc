"""The ``Model`` interface: a request in, a response (or a stream of chunks) out."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mesh._types import Content, Usage

__all__ = ["Model", "ModelRequest", "ModelResponse", "ToolDeclaration"]


class ToolDeclaration(BaseModel):
    """What the model sees of a tool: name, description, JSON Schema of the parameters."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ModelRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    system_instruction: str | None = None
    contents: tuple[Content, ...] = ()
    tools: tuple[ToolDeclaration, ...] = ()
    # When set, the answer must be JSON matching this schema (typed LLM skills).
    response_schema: dict[str, Any] | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None


class ModelResponse(BaseModel):
    """One model response, or (``partial=True``) a streamed delta of one.

    A stream is zero or more partial chunks followed by exactly one final response whose
    ``content`` is the whole turn and whose ``usage`` is the response's usage. Usage is read
    from the final response only: providers report running totals on chunks.
    """

    model_config = ConfigDict(frozen=True)

    content: Content
    usage: Usage | None = None
    partial: bool = False
    finish_reason: str | None = None
    model_version: str | None = None
    # Session state the response writes (merged like a tool's ``state_delta``). Real models
    # leave it empty; the scripted model's rules use it to remember facts across turns.
    state_delta: dict[str, Any] = Field(default_factory=dict)


class Model(abc.ABC):
    """A language model. Implementations: ``ScriptedModel`` (offline), ``GeminiModel``."""

    #: Shown in /introspect and metrics labels.
    name: str = "model"

    @abc.abstractmethod
    async def generate(self, request: ModelRequest) -> ModelResponse:
        """One complete response."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelResponse]:
        """Partial chunks then one final response. Default: the complete response only."""
        yield await self.generate(request)

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def describe(self) -> dict[str, Any]:
        """Public facts for /introspect (never keys)."""
        return {"name": self.name, "kind": type(self).__name__}
