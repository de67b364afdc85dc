"""The checks of ``mesh eval``: each returns the failures it found, as messages that show what
was expected and what the mesh did (an empty list: it holds).

    check_answer(expect, answer)        # contains / not_contains / regex / equals / fields / state
    check_trajectory(trajectory, steps) # calls (args subset, in order or any), must_not_call
    check_bounds(bounds, latency_s, tokens, delegations)
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mesh._eval.cases import Bounds, Call, Expect, Trajectory
from mesh._eval.trace import Step

__all__ = [
    "Answer",
    "args_match",
    "check_answer",
    "check_bounds",
    "check_trajectory",
    "field_at",
]

_MISSING = object()
_SHOWN = 300


@dataclass(frozen=True)
class Answer:
    """The answer of a case's turn: its final state, text and typed JSON."""

    state: str
    text: str = ""
    data: dict[str, Any] | None = None

    @property
    def shown(self) -> str:
        """The text matchers read: the text, else the JSON."""
        if self.text:
            return self.text
        return json.dumps(self.data, sort_keys=True) if self.data is not None else ""


def _short(text: str) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def field_at(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` (``a.b.0.c``) of JSON ``data``; ``_MISSING`` if absent."""
    value = data
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return _MISSING
    return value


def check_answer(expect: Expect, answer: Answer) -> list[str]:
    """The ways ``answer`` misses ``expect`` (the rubric is judged elsewhere)."""
    failures: list[str] = []
    if expect.state is not None and answer.state != expect.state:
        failures.append(f"state: expected {expect.state}, got {answer.state}")
    text = answer.shown
    folded = text.lower() if expect.ignore_case else text
    for wanted in expect.contains:
        if (wanted.lower() if expect.ignore_case else wanted) not in folded:
            failures.append(f"answer: expected it to contain {wanted!r}; got {_short(text)!r}")
    for unwanted in expect.not_contains:
        if (unwanted.lower() if expect.ignore_case else unwanted) in folded:
            failures.append(f"answer: expected no {unwanted!r}; got {_short(text)!r}")
    if expect.regex is not None:
        flags = re.IGNORECASE if expect.ignore_case else 0
        if re.search(expect.regex, text, flags) is None:
            failures.append(f"answer: expected a match of /{expect.regex}/; got {_short(text)!r}")
    if expect.equals is not None:
        same = (
            text.strip().lower() == expect.equals.strip().lower()
            if expect.ignore_case
            else text.strip() == expect.equals.strip()
        )
        if not same:
            failures.append(f"answer: expected {expect.equals!r}; got {_short(text)!r}")
    for path, wanted in expect.fields.items():
        if answer.data is None:
            failures.append(f"field {path}: expected {wanted!r}; the answer has no JSON")
            continue
        got = field_at(answer.data, path)
        if got is _MISSING:
            failures.append(f"field {path}: expected {wanted!r}; the answer has no {path}")
        elif got != wanted:
            failures.append(f"field {path}: expected {wanted!r}, got {got!r}")
    return failures


def args_match(expected: Any, actual: Any) -> bool:
    """``expected`` is a subset of ``actual``: every key of a dict matches recursively, other
    values are equal (a number equals the same number as int or float)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and args_match(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(args_match(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)


def _named(call: Call, step: Step) -> bool:
    if call.tool is not None and (step.kind != "tool" or step.name != call.tool):
        return False
    if call.skill is not None and (step.kind != "skill" or step.name != call.skill):
        return False
    return call.agent is None or call.agent == step.agent


def _matches(call: Call, step: Step) -> bool:
    return _named(call, step) and args_match(call.args, step.args)


def _missing(call: Call, steps: Sequence[Step], note: str = "") -> str:
    """Expected vs actual for a call that was not found."""
    near = [s for s in steps if _named(call, s)]
    if near:
        actual = "; ".join(
            json.dumps(s.args, sort_keys=True, default=str) + f" at {s.agent}" for s in near
        )
        return (
            f"trajectory: expected {call.describe()}{note}; "
            f"actual {near[0].kind} {near[0].name} args: {actual}"
        )
    made = ", ".join(dict.fromkeys(f"{s.kind} {s.name} at {s.agent}" for s in steps)) or "none"
    return f"trajectory: expected {call.describe()}{note}; it was not called (calls: {made})"


def check_trajectory(trajectory: Trajectory, steps: Sequence[Step]) -> list[str]:
    """The ways ``steps`` (in time order) miss ``trajectory``."""
    failures: list[str] = []
    if trajectory.order == "in_order":
        at = 0
        for call in trajectory.calls:
            found = next((i for i in range(at, len(steps)) if _matches(call, steps[i])), None)
            if found is None:
                if any(_matches(call, s) for s in steps[:at]):
                    failures.append(
                        f"trajectory: expected {call.describe()} after the calls listed before "
                        "it; it came earlier"
                    )
                else:
                    failures.append(_missing(call, steps, " (in order)"))
                continue
            at = found + 1
    else:
        used: set[int] = set()
        for call in trajectory.calls:
            found = next(
                (i for i, s in enumerate(steps) if i not in used and _matches(call, s)), None
            )
            if found is None:
                failures.append(_missing(call, steps))
            else:
                used.add(found)
    for call in trajectory.must_not_call:
        bad = [s for s in steps if _matches(call, s)]
        if bad:
            failures.append(
                f"trajectory: expected no {call.describe()}; it was called: {bad[0].describe()}"
            )
    return failures


def check_bounds(bounds: Bounds, *, latency_s: float, tokens: int, delegations: int) -> list[str]:
    """The bounds the case passed."""
    failures: list[str] = []
    if bounds.latency_s is not None and latency_s > bounds.latency_s:
        failures.append(f"latency: expected at most {bounds.latency_s:g}s, took {latency_s:.2f}s")
    if bounds.total_tokens is not None and tokens > bounds.total_tokens:
        failures.append(
            f"tokens: expected at most {bounds.total_tokens} over all hops, used {tokens}"
        )
    if bounds.max_delegations is not None and delegations > bounds.max_delegations:
        failures.append(
            f"delegations: expected at most {bounds.max_delegations}, made {delegations}"
        )
    if bounds.min_delegations is not None and delegations < bounds.min_delegations:
        failures.append(
            f"delegations: expected at least {bounds.min_delegations}, made {delegations}"
        )
    return failures
