"""``turn_trace`` keeps the last valid header's parse (session 38, helper C2): the same traces as
parsing each call's header, whatever the sequence of headers and invocation ids a process's
delegations bring (valid, padded, invalid, missing, not a str, a str subclass), and the same on
several threads at once."""

from __future__ import annotations

import hashlib
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

import mesh._delegation as delegation
from mesh._delegation import turn_trace
from mesh._tools import ToolContext
from mesh._tracing import TraceParent

HEX = "0123456789abcdef"


def _reference(ctx: ToolContext) -> TraceParent | None:
    """turn_trace as it was (d67a51c): None where it makes a new random trace."""
    parsed = TraceParent.parse(ctx.metadata.get("traceparent"))
    if parsed is not None:
        return parsed
    if not ctx.invocation_id:
        return None
    digest = hashlib.sha256(ctx.invocation_id.encode()).hexdigest()
    return TraceParent.parse(f"00-{digest[:32]}-{digest[32:48]}-01")


class _Odd(str):
    """A str whose comparison says it equals anything: never taken for the kept header."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


def _header(trace: str, span: str, flags: str, version: str = "00") -> str:
    return f"{version}-{trace}-{span}-{flags}"


ids = st.text(HEX, min_size=32, max_size=32)
spans = st.text(HEX, min_size=16, max_size=16)
flags = st.sampled_from(["00", "01", "ff", "0a"])
valid = st.builds(_header, ids, spans, flags)
# A few distinct valid headers, so sequences come back to one after another.
few = st.sampled_from(
    [
        _header("0123456789abcdef0123456789abcdef", "0123456789abcdef", "01"),
        _header("fedcba9876543210fedcba9876543210", "0123456789abcdef", "01"),
        _header("0123456789abcdef0123456789abcdef", "1111111111111111", "00"),
    ]
)
headers = st.one_of(
    few,
    valid,
    valid.map(lambda h: f"  {h}\n"),  # padded: valid, its text not the kept one
    valid.map(lambda h: "01" + h[2:] + "-more"),  # a later version with more fields
    valid.map(lambda h: h.upper()),  # invalid (upper case)
    valid.map(lambda h: h + "-x"),  # version 00 with more: invalid
    st.just(_header("0" * 32, "0123456789abcdef", "01")),  # all-zero trace id
    st.just(_header("0123456789abcdef0123456789abcdef", "0" * 16, "01")),
    st.just(_header("0123456789abcdef0123456789abcdef", "0123456789abcdef", "01", "ff")),
    few.map(_Odd),
    st.none(),
    st.just(""),
    st.integers(),
    st.text(max_size=60),
)
calls = st.lists(st.tuples(headers, st.sampled_from(["", "inv-1", "inv-2"])), max_size=25)


def _check(header: object, invocation: str) -> None:
    ctx = ToolContext(invocation_id=invocation, metadata={"traceparent": header})
    expected = _reference(ctx)
    got = turn_trace(ctx)
    assert type(got) is TraceParent
    if expected is None:
        # A trace of its own: a new, valid one.
        assert TraceParent.parse(got.format()) == got
        assert got.span_id != "0" * 16
        assert got.trace_id != "0" * 32
    else:
        assert got == expected
        assert got.format() == expected.format()


@settings(max_examples=300, deadline=None)
@given(calls)
def test_the_same_traces_as_parsing_every_header(sequence: list[tuple[object, str]]) -> None:
    for header, invocation in sequence:
        _check(header, invocation)


@given(few, few)
def test_a_kept_header_answers_for_its_own_text_only(first: str, second: str) -> None:
    _check(first, "")
    _check(second, "")
    _check(_Odd(first), "")  # equal to anything: parsed as itself
    _check(first, "inv-1")


def test_an_odd_str_never_answers_with_the_kept_trace() -> None:
    kept = _header("0123456789abcdef0123456789abcdef", "0123456789abcdef", "01")
    assert turn_trace(ToolContext(metadata={"traceparent": kept})).trace_id == kept[3:35]
    odd = _Odd(_header("fedcba9876543210fedcba9876543210", "0123456789abcdef", "01"))
    assert turn_trace(ToolContext(metadata={"traceparent": odd})).trace_id == odd[3:35]
    invalid = _Odd("not a header")
    assert turn_trace(ToolContext(invocation_id="inv-1", metadata={"traceparent": invalid})) == (
        _reference(ToolContext(invocation_id="inv-1"))
    )


def test_threads_reading_and_replacing_the_kept_header() -> None:
    texts = [_header(f"{i:032x}", f"{i + 1:016x}", "01") for i in range(1, 9)]
    failures: list[BaseException] = []

    def run(offset: int) -> None:
        try:
            for n in range(2000):
                _check(texts[(n + offset) % len(texts)], "")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert delegation._parsed_trace is not None


def _delegation(trace: TraceParent, ctx: ToolContext) -> delegation.Delegation:
    from types import SimpleNamespace

    from mesh._peer_link import PeerLink
    from mesh._resilience import BreakerBoard, RetryPolicy

    tool = SimpleNamespace(
        name="t", skill_id="score", typed=True, input_schema=None, output_schema=None
    )
    record = delegation.CallRecord("score", "", "", trace.trace_id, 0.0, 0.0, "failed", 0)
    breakers = BreakerBoard()
    return delegation.Delegation(
        PeerLink(
            "bureau", url="http://127.0.0.1:1", named=True, deadline_s=30.0, breakers=breakers
        ),
        tool,
        ctx,
        trace=trace,
        record=record,
        policy=RetryPolicy(),
        breakers=breakers,
        deadline_s=30.0,
        caller="coordinator",
    )


@settings(max_examples=200, deadline=None)
@given(
    valid.filter(lambda h: TraceParent.parse(h) is not None),
    st.one_of(spans, st.just("0" * 16), st.just("")),
    st.one_of(st.none(), st.text(max_size=8)),
)
def test_the_metadata_carries_the_span_drawn_or_a_new_one(
    header: str, span: str, caller_task: str | None
) -> None:
    """``_metadata(span)``: the child traceparent of the turn's trace with ``span`` as its span
    id, as ``TraceParent.child_text`` writes it; all zeros or none: ``child_text``'s own draw.
    The rest as before (deadline, caller, the caller's task when a non-empty str)."""
    trace = TraceParent.parse(header)
    assert trace is not None
    metadata = {} if caller_task is None else {"task_id": caller_task}
    call = _delegation(trace, ToolContext(agent_name="coordinator", metadata=metadata))
    call.deadline = 123.5
    got = call._metadata(span)
    sent = TraceParent.parse(got["traceparent"])
    assert sent is not None
    assert sent.trace_id == trace.trace_id
    assert sent.flags == trace.flags
    assert got["traceparent"] == f"00-{trace.trace_id}-{sent.span_id}-{trace.flags}"
    if span and span != "0" * 16:
        assert sent.span_id == span
    else:
        assert sent.span_id != "0" * 16
    rest = {k: v for k, v in got.items() if k != "traceparent"}
    expected: dict[str, object] = {"deadline": 123.5, "caller": "coordinator"}
    if caller_task:
        expected["callerTask"] = caller_task
    assert rest == expected
    assert list(got) == ["traceparent", *expected]
