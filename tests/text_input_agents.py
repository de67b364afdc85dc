"""Agents for typed input sent as text (tests/test_node_text_input.py).

``calculator``: several typed skills, told apart by their input schemas except ``upper`` and
``lower``, which take the same object. ``desk``: an LLM agent (chat) with one typed skill.
"""

from __future__ import annotations

from pydantic import BaseModel

from mesh import Agent, Rule, Script, skill


class Pair(BaseModel):
    a: int
    b: int


class Total(BaseModel):
    total: int


class Words(BaseModel):
    text: str


class Said(BaseModel):
    text: str


class Quote(BaseModel):
    symbol: str
    amount: int = 1


class Price(BaseModel):
    symbol: str
    price: float


@skill(tags=["test"])
def add(req: Pair) -> Total:
    """Add two integers."""
    return Total(total=req.a + req.b)


@skill(tags=["test"])
def upper(req: Words) -> Said:
    """Shout the text."""
    return Said(text=req.text.upper())


@skill(tags=["test"])
def lower(req: Words) -> Said:
    """Whisper the text."""
    return Said(text=req.text.lower())


calculator = Agent(
    name="text-calculator", description="Typed skills only.", skills=[add, upper, lower]
)


@skill(tags=["test"])
def quote(req: Quote) -> Price:
    """Price an amount of a symbol."""
    return Price(symbol=req.symbol, price=2.5 * req.amount)


desk = Agent(
    name="text-desk",
    instruction="Answer briefly.",
    skills=[quote],
    script=Script(rules=[Rule(when=r"(?s).", answer="chat heard: {input}")]),
)
