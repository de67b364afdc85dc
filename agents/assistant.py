"""A small LLM agent: two tools, a typed LLM skill (``summarize``) and free-text chat.

    mesh serve agents.assistant:agent --port 8031
    mesh call http://127.0.0.1:8031 --text "my name is Ada"
    mesh call http://127.0.0.1:8031 --text "what is my name?" --context-id <the context id>
    mesh call http://127.0.0.1:8031 --skill summarize --json '{"text": "..."}'

Without a Gemini key it runs on the ``ScriptedModel`` with ``SCRIPT`` below: it remembers a
name in the session state (so a conversation continued by contextId remembers it), converts
currencies with a tool, and summarizes deterministically.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from mesh import Agent, Call, Rule, Script, ToolContext, llm_skill

# Fixed demo rates: a tool with a real lookup would sit here.
_RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "CHF": 0.96}


def remember(key: str, value: str, ctx: ToolContext) -> dict[str, str]:
    """Remember a fact about the user for the rest of the conversation."""
    ctx.state_delta[key] = value
    return {"remembered": key}


def convert(amount: float, source: str, target: str) -> dict[str, float | str]:
    """Convert an amount between EUR, USD, GBP and CHF at fixed demo rates."""
    src, dst = source.upper(), target.upper()
    for code in (src, dst):
        if code not in _RATES:
            raise ValueError(f"unknown currency {code}; use one of {sorted(_RATES)}")
    return {"amount": round(amount / _RATES[src] * _RATES[dst], 2), "currency": dst}


class Document(BaseModel):
    text: str = Field(description="The text to summarize.", min_length=1)
    max_words: int = Field(default=20, ge=1, le=200, description="Length of the summary.")


class Summary(BaseModel):
    summary: str
    words: int = Field(ge=0)


summarize = llm_skill(
    "summarize",
    input=Document,
    output=Summary,
    description="Summarize a text in at most max_words words.",
    tags=["text"],
    examples=['{"text": "Long text ...", "max_words": 10}'],
)

SCRIPT = Script(
    rules=[
        # A typed `summarize` request arrives as the JSON of a Document.
        Rule(
            when=r'^\{.*"text"',
            answer_data={"summary": "{input.text}", "words": "{input.max_words}"},
        ),
        Rule(
            when=r"(?i)my name is (?P<name>[A-Za-z][\w-]*)",
            steps=[Call("remember", {"key": "name", "value": "{name}"})],
            answer="Nice to meet you, {name}.",
        ),
        Rule(when=r"(?i)what is my name", answer="Your name is {state.name}."),
        Rule(
            when=r"(?i)convert (?P<amount>[\d.,]+) (?P<src>[A-Za-z]{3}) to (?P<dst>[A-Za-z]{3})",
            steps=[
                Call(
                    "convert",
                    {"amount": "{amount|number}", "source": "{src}", "target": "{dst}"},
                )
            ],
            answer="{amount} {src|upper} is {convert.amount} {convert.currency}.",
        ),
    ],
    fallback="I can remember your name, convert currencies and summarize text. You said: {input}",
)

agent = Agent(
    name="assistant",
    description="A helpful assistant: chat, currency conversion and text summaries.",
    instruction=(
        "You are a concise assistant. Use `remember` to keep facts the user tells you about "
        "themselves, and `convert` for currency conversions."
    ),
    model="gemini-2.5-flash",
    tools=[remember, convert],
    skills=[summarize],
    script=SCRIPT,
    tags=("assistant", "demo"),
)
