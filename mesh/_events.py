"""``Event``: one step of a turn, appended to the session.

A turn produces, in order: the user's message, then for each model call a model event (text
and/or function calls, with that response's usage), then one event holding the function
responses, ... until a final model event (``final=True``). Streaming yields ``partial=True``
events as text arrives; partial events are never persisted and never carry usage.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mesh._types import Content, FunctionCall, FunctionResponse, Usage

__all__ = ["Event", "new_id"]


def new_id() -> str:
    """A random 128-bit id, 32 hex digits (uuid4's ``.hex`` form): events, invocations and
    sessions need unique ids, not RFC 4122 ones, and building a ``UUID`` costs 5x the bytes."""
    return os.urandom(16).hex()


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_id)
    invocation_id: str = ""
    # "user", the agent's name, or "tool" for function responses.
    author: str
    timestamp: float = Field(default_factory=time.time)
    content: Content | None = None
    # Usage of the one model response this event carries (None for non-model events).
    usage: Usage | None = None
    model: str | None = None
    # Merged into session state with dict.update semantics when the event is appended.
    state_delta: dict[str, Any] = Field(default_factory=dict)
    partial: bool = False
    # The last event of a turn: the answer.
    final: bool = False
    # Free-form facts (skill id, A2A task id, traceparent, error kind...).
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.content.text if self.content else ""

    @property
    def function_calls(self) -> list[FunctionCall]:
        return self.content.function_calls if self.content else []

    @property
    def function_responses(self) -> list[FunctionResponse]:
        return self.content.function_responses if self.content else []
