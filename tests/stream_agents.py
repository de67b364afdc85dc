"""A chain of three agents for tests/test_delegation_stream.py, offline (scripted model):

    stream-top (LLM)  --ask_stream_middle-->  stream-middle (LLM)  --stream_bottom_*-->  stream-bottom

``stream-bottom`` is a specialist of function skills: ``report`` reports its progress
(``ctx.progress``) step by step; ``confirm`` reports once, then asks (waits for input);
``pause`` takes a while (``slow TOPIC`` at the top pauses, then asks for a report). The
coordinators find the next hop at a fixed URL, from ``STREAM_TEST_BOTTOM`` and
``STREAM_TEST_MIDDLE``.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from mesh import Agent, BreakerBoard, Call, RetryPolicy, Rule, Script, SkillContext, remote, skill


class ReportRequest(BaseModel):
    topic: str
    steps: int = 3


class Report(BaseModel):
    topic: str
    steps: int


@skill
async def report(req: ReportRequest, ctx: SkillContext) -> Report:
    """Write a report on a topic, saying how far it got at each step."""
    for step in range(1, req.steps + 1):
        await ctx.progress(f"{req.topic}: step {step} of {req.steps}")
    return Report(topic=req.topic, steps=req.steps)


@skill(asks=True)
async def confirm(req: ReportRequest, ctx: SkillContext) -> Report:
    """Ask before writing the report."""
    await ctx.progress(f"{req.topic}: checking")
    answer = await ctx.ask(f"Write the report on {req.topic}?")
    return Report(topic=f"{req.topic} ({answer})", steps=req.steps)


class Pause(BaseModel):
    seconds: float


@skill
async def pause(req: Pause) -> Pause:
    """Take a while."""
    await asyncio.sleep(req.seconds)
    return req


bottom = Agent(
    name="stream-bottom",
    description="Writes reports, step by step.",
    skills=[report, confirm, pause],
)

# A child that waits is retried (its task is found again, same message id) and counts as a
# failure of its instance: quick here, and no breaker opens between the tests' calls.
_FAST = RetryPolicy(attempts=2, initial_delay=0.05, max_delay=0.1)
_NEVER_OPEN = BreakerBoard(failure_threshold=1000, cool_down=0.1)

middle = Agent(
    name="stream-middle",
    instruction="You get reports written by stream-bottom.",
    tools=[
        remote(
            os.environ.get("STREAM_TEST_BOTTOM", "http://127.0.0.1:9"),
            policy=_FAST,
            breakers=_NEVER_OPEN,
        )
    ],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)report (?P<topic>\w+)",
                steps=[[Call("stream_bottom_report", {"topic": "{topic}"})]],
                answer="middle has the {stream_bottom_report.topic} report "
                "({stream_bottom_report.steps} steps)",
                on_error="middle could not: {error}",
            ),
            Rule(
                when=r"(?i)pause",
                steps=[[Call("stream_bottom_pause", {"seconds": 1.5})]],
                answer="middle paused",
            ),
            Rule(
                when=r"(?i)confirm (?P<topic>\w+)",
                steps=[[Call("stream_bottom_confirm", {"topic": "{topic}"})]],
                answer="middle has {stream_bottom_confirm.topic}",
                on_error="middle could not: {error}",
            ),
        ],
        fallback="Ask: report TOPIC",
    ),
)

top = Agent(
    name="stream-top",
    instruction="You ask stream-middle for reports.",
    tools=[remote(os.environ.get("STREAM_TEST_MIDDLE", "http://127.0.0.1:9"), policy=_FAST)],
    script=Script(
        rules=[
            Rule(
                when=r"(?i)slow (?P<topic>\w+)",
                steps=[
                    [Call("ask_stream_middle", {"text": "pause"})],
                    [Call("ask_stream_middle", {"text": "report {topic}"})],
                ],
                answer="top heard: {ask_stream_middle}",
            ),
            Rule(
                when=r"(?i)(?P<what>(report|confirm) \w+)",
                steps=[[Call("ask_stream_middle", {"text": "{what}"})]],
                answer="top heard: {ask_stream_middle}",
                on_error="top could not: {error}",
            ),
        ],
        fallback="Ask: report TOPIC",
    ),
)
