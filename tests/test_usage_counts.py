"""A child's token usage as its caller adds it up (``usage_counts``, ``report_usage``): both
spellings, counts of every numeric type but bool, anything else ignored, in the child's order."""

from __future__ import annotations

import enum
import re
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest

from mesh._a2a.metadata_keys import usage_counts
from mesh._delegation import report_usage
from mesh._tools import ToolContext


class Count(enum.IntEnum):
    THREE = 3


class Name(str):
    pass


def _reference(value: Any) -> dict[str, int]:
    """The rule as first written (isinstance checks, a regex per key)."""
    if not isinstance(value, Mapping):
        return {}
    counts: dict[str, int] = {}
    for name, count in value.items():
        if isinstance(count, int | float) and not isinstance(count, bool):
            kind = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), str(name))
            counts[kind] = counts.get(kind, 0) + int(count)
    return counts


CASES: list[Any] = [
    {"inputTokens": 3.0, "outputTokens": 4, "totalTokens": 7},
    {"input_tokens": 3, "inputTokens": 2.9, "cached_tokens": 1},
    {"inputTokens": True, "outputTokens": None, "x": "5", "y": [1], "z": Count.THREE},
    {Name("input_tokens"): 1, Name("outputTokens"): 2, 7: 1},
    OrderedDict([("b_c", 1.5), ("a", -2)]),
    MappingProxyType({"thinking_tokens": 8}),
    {},
    None,
    [("inputTokens", 1)],
    "inputTokens",
]


@pytest.mark.parametrize("value", CASES)
def test_usage_counts_follow_the_rule(value: Any) -> None:
    found = usage_counts(value)
    want = _reference(value)
    assert found == want
    assert list(found) == list(want)
    assert all(type(k) is str and type(v) is int for k, v in found.items())


def test_report_usage_adds_the_childs_own_and_its_childrens() -> None:
    sink: list[dict[str, int]] = []
    ctx = ToolContext(agent_name="a", metadata={"usage_sink": sink})
    metadata = {
        "usage": {"inputTokens": 5.0, "outputTokens": 2.0},
        "children_usage": {"output_tokens": 1, "cachedTokens": 4},
    }
    report_usage(ctx, metadata)
    report_usage(ctx, {"usage": {"inputTokens": 0}, "childrenUsage": {}})
    report_usage(ctx, {"childrenUsage": {"inputTokens": 1}})
    report_usage(ctx, {})
    assert sink == [
        {"inputTokens": 5, "outputTokens": 3, "cachedTokens": 4},
        {"inputTokens": 0},
        {"inputTokens": 1},
    ]
    assert list(sink[0]) == ["inputTokens", "outputTokens", "cachedTokens"]
    seen: list[dict[str, int]] = []
    report_usage(ToolContext(agent_name="a", metadata={"usage_sink": seen.append}), metadata)
    assert seen == sink[:1]


def test_report_usage_reads_either_spelling_into_any_list_sink() -> None:
    """A key present as null is read in its older spelling (``read``'s rule: a child's
    ``children_usage``), and a sink that is a list of another type (not callable) is appended
    to as a plain list is."""

    class Sink(list[dict[str, int]]):
        pass

    sink = Sink()
    ctx = ToolContext(agent_name="a", metadata={"usage_sink": sink})
    report_usage(ctx, {"usage": {"input_tokens": 9}, "childrenUsage": None})
    report_usage(ctx, {"usage": None, "childrenUsage": None, "children_usage": {"x": 2}})
    assert sink == [{"inputTokens": 9}, {"x": 2}]
