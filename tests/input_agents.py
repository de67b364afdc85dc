"""The agent tests/test_node_input.py serves: a typed function skill (the fast path), the chat
skill and an LLM typed skill (both text turns for the model), on the offline scripted model."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from mesh import Agent, Rule, Script, llm_skill, skill


class Note(BaseModel):
    key: str
    n: int = 1


class Noted(BaseModel):
    key: str
    n: int


@skill
def echo(req: Note) -> Noted:
    """Echo the key and n (fields beyond these are accepted and ignored)."""
    return Noted(key=req.key, n=req.n)


class Pause(BaseModel):
    seconds: float


@skill
async def pause(req: Pause) -> Pause:
    """Sleep, then answer (keeps a request, and its body, in flight)."""
    await asyncio.sleep(req.seconds)
    return req


class Draft(BaseModel):
    text: str


class Summary(BaseModel):
    words: int


summarize = llm_skill("summarize", input=Draft, output=Summary, description="Summarize a text.")

agent = Agent(
    name="test-input",
    description="Takes hostile input.",
    instruction="Answer briefly.",
    skills=[echo, pause, summarize],
    script=Script(rules=[Rule(when=r"\S", answer="heard you", answer_data={"words": 2})]),
)
