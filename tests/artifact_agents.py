"""Agents for tests/test_node_artifacts.py, offline (scripted model).

``artifact-desk`` has function skills only: ``chart`` attaches a PNG (bytes), a PDF (URL) and
data next to its typed result; ``add`` answers with a direct message (``reply="message"``);
``measure`` takes PNG files besides its input (``accepts=``) and says what it got; ``stamp``
does too, after asking (its files are there again when the answer resumes it).
``artifact-chat`` is an LLM agent whose tool attaches a CSV file and the data of its answer.
``artifact-coord`` delegates ``add`` to the desk (at ``ARTIFACT_TEST_DESK``): a remote skill
that answers with a direct message, blocking and streamed.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from mesh import (
    Agent,
    Call,
    File,
    RetryPolicy,
    Rule,
    Script,
    SkillContext,
    SkillInputError,
    ToolContext,
    remote,
    skill,
)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
PDF_URL = "https://files.example/chart.pdf"


class ChartRequest(BaseModel):
    title: str
    points: list[float]


class ChartSummary(BaseModel):
    title: str
    count: int
    total: float


@skill
def chart(req: ChartRequest, ctx: SkillContext) -> ChartSummary:
    """Draw a chart of the points and sum them up."""
    ctx.attach(File(PNG, media_type="image/png", name="chart.png"))
    ctx.attach(File(url=PDF_URL, media_type="application/pdf", name="chart.pdf"), name="print")
    ctx.attach({"max": max(req.points), "min": min(req.points)}, "min and max", name="range")
    return ChartSummary(title=req.title, count=len(req.points), total=sum(req.points))


class Pair(BaseModel):
    a: int
    b: int


class Sum(BaseModel):
    sum: int


@skill(reply="message")
def add(req: Pair) -> Sum:
    """Add two numbers, at once (not negative ones; 13 breaks it)."""
    if req.a < 0 or req.b < 0:
        raise SkillInputError("field 'a' and 'b' must not be negative")
    if 13 in (req.a, req.b):
        raise RuntimeError("unlucky")
    return Sum(sum=req.a + req.b)


class Measure(BaseModel):
    label: str


class Measured(BaseModel):
    label: str
    files: list[str]
    sizes: list[int]


@skill(accepts=["image/png"])
def measure(req: Measure, ctx: SkillContext) -> Measured:
    """Say which PNG files came with the request, and their sizes."""
    return Measured(
        label=req.label,
        files=[f.name for f in ctx.files],
        sizes=[len(f.data or b"") for f in ctx.files],
    )


@skill(accepts=["image/png"], asks=True)
async def stamp(req: Measure, ctx: SkillContext) -> Measured:
    """Ask before stamping the PNG files that came with the request."""
    await ctx.ask(f"Stamp {len(ctx.files)} file(s) as {req.label}?")
    return Measured(
        label=req.label,
        files=[f.name for f in ctx.files],
        sizes=[len(f.data or b"") for f in ctx.files],
    )


desk = Agent(
    name="artifact-desk",
    description="Charts, sums, measures and stamps.",
    skills=[chart, add, measure, stamp],
)


def export_rates(currency: str, ctx: ToolContext) -> dict[str, float]:
    """Export today's rates against a currency as a CSV file."""
    rates = {"USD": 1.08, "GBP": 0.85}
    rows = "\n".join(f"{currency.upper()},{code},{rate}" for code, rate in rates.items())
    ctx.attach(File(rows.encode(), media_type="text/csv", name="rates.csv"))
    ctx.attach(rates, name="rates")
    return {"rows": len(rates)}


chat = Agent(
    name="artifact-chat",
    instruction="You export exchange rates.",
    tools=[export_rates],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)export (?P<currency>[a-z]{3})",
                steps=[Call("export_rates", {"currency": "{currency}"})],
                answer="Exported {export_rates.rows} rates against {currency|upper}.",
            ),
        ],
        fallback="Ask: export CUR",
    ),
)


coord = Agent(
    name="artifact-coord",
    instruction="You add numbers with artifact-desk.",
    tools=[
        remote(
            os.environ.get("ARTIFACT_TEST_DESK", "http://127.0.0.1:9"),
            policy=RetryPolicy(attempts=1),
        )
    ],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)add (?P<a>\d+) and (?P<b>\d+)",
                steps=[Call("artifact_desk_add", {"a": "{a|number}", "b": "{b|number}"})],
                answer="the desk says {artifact_desk_add.sum}",
                on_error="the desk failed: {error}",
            ),
        ],
        fallback="Ask: add A and B",
    ),
)
