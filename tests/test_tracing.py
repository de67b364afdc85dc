"""W3C traceparent: parse, format, new, child."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from mesh._tracing import (
    TraceLogFilter,
    TraceParent,
    current_traceparent,
    ensure_traceparent,
    trace_id_of,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parse_valid_header_round_trips() -> None:
    tp = TraceParent.parse(VALID)
    assert tp is not None
    assert tp.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert tp.span_id == "00f067aa0ba902b7"
    assert tp.sampled
    assert str(tp) == VALID


def test_a_parsed_header_is_the_object_its_init_makes() -> None:
    # parse builds it without the frozen __init__: every field set, equal, hashed and frozen
    # as the one __init__ makes.
    tp = TraceParent.parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more")
    made = TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "00", "00")
    assert tp == made
    assert hash(tp) == hash(made)
    assert repr(tp) == repr(made)
    assert vars(tp) == vars(made)
    assert set(vars(tp)) == {f.name for f in dataclasses.fields(TraceParent)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        tp.span_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # uppercase
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # v00 has no extras
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
    ],
)
def test_invalid_headers_are_ignored(header: str | None) -> None:
    assert TraceParent.parse(header) is None
    assert trace_id_of(header) is None


def test_future_version_keeps_known_fields() -> None:
    tp = TraceParent.parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more")
    assert tp is not None
    assert tp.version == "00"
    assert not tp.sampled


def test_new_and_child() -> None:
    root = TraceParent.new()
    again = TraceParent.parse(str(root))
    assert again == root
    child = root.child()
    assert child.trace_id == root.trace_id
    assert child.span_id != root.span_id
    assert TraceParent.new().trace_id != root.trace_id


def test_child_text_is_a_childs_header() -> None:
    # What a delegation sends: str(child()) without the child object, for any parent version.
    for parent in (TraceParent.new(), TraceParent.new(sampled=False), TraceParent.parse(VALID)):
        assert parent is not None
        text = parent.child_text()
        child = TraceParent.parse(text)
        assert child is not None
        assert str(child) == text
        assert (child.trace_id, child.flags, child.version) == (parent.trace_id, parent.flags, "00")
        assert child.span_id != parent.span_id
        assert text.split("-")[2] != parent.child_text().split("-")[2]
    higher = TraceParent.parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
    assert higher is not None
    assert higher.child_text().startswith("00-")


def test_ensure_keeps_a_valid_trace_and_starts_one_otherwise() -> None:
    assert ensure_traceparent(VALID).trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    fresh = ensure_traceparent("nonsense")
    assert TraceParent.parse(str(fresh)) == fresh


def test_log_filter_adds_trace_id() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "msg", None, None)
    token = current_traceparent.set(VALID)
    try:
        assert TraceLogFilter().filter(record)
    finally:
        current_traceparent.reset(token)
    assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    outside = logging.LogRecord("x", logging.INFO, __file__, 1, "msg", None, None)
    TraceLogFilter().filter(outside)
    assert outside.trace_id == "-"
