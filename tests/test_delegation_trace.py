"""The trace a delegation carries: the caller's, else one per turn, kept nowhere."""

from __future__ import annotations

from mesh._delegation import turn_trace
from mesh._tools import ToolContext
from mesh._tracing import TraceParent


def test_a_turn_without_a_traceparent_has_one_trace_for_all_its_delegations() -> None:
    first = turn_trace(ToolContext(invocation_id="inv-1"))
    again = turn_trace(ToolContext(invocation_id="inv-1"))
    other = turn_trace(ToolContext(invocation_id="inv-2"))
    assert first.trace_id == again.trace_id != other.trace_id
    assert TraceParent.parse(str(first)) == first  # a valid W3C traceparent


def test_the_callers_traceparent_wins_and_a_call_outside_a_turn_gets_its_own() -> None:
    root = TraceParent.new()
    ctx = ToolContext(invocation_id="inv-1", metadata={"traceparent": str(root)})
    assert turn_trace(ctx) == root
    assert turn_trace(ToolContext()).trace_id != turn_trace(ToolContext()).trace_id
