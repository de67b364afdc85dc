"""W3C Trace Context (``traceparent``) for delegations.

Every delegation carries a ``traceparent`` header value in the A2A message metadata, so one
user request can be followed across the coordinator and every specialist it calls: the trace
id stays the same, each hop gets its own span id.

    tp = TraceParent.parse(metadata.get("traceparent")) or TraceParent.new()
    child = tp.child()                     # same trace id, new span id
    message_metadata["traceparent"] = str(child)

Format (https://www.w3.org/TR/trace-context/#traceparent-header):
``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, lowercase, ids never all zeros.
An invalid header is ignored (the spec says: start a new trace), never an error.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
from dataclasses import dataclass

from mesh._frozen import made

__all__ = [
    "TRACEPARENT_KEY",
    "TraceLogFilter",
    "TraceParent",
    "current_traceparent",
    "ensure_traceparent",
    "trace_id_of",
    "traceparent_text",
]

#: The metadata key (message and task) that carries the header value.
TRACEPARENT_KEY = "traceparent"

_HEADER = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
# A version 00 header with nothing around it or after its flags (traceparent_text).
_HEADER_00 = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16

#: The traceparent of the work the current task is doing (set by whoever serves a request),
#: read by ``TraceLogFilter`` so log lines carry the trace id without threading it through.
current_traceparent: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mesh_traceparent", default=None
)


@dataclass(frozen=True)
class TraceParent:
    """One parsed ``traceparent``: a trace id, the caller's span id, and the flags."""

    trace_id: str
    span_id: str
    flags: str = "01"
    version: str = "00"

    @classmethod
    def parse(cls, header: str | None) -> TraceParent | None:
        """The parsed header, or None when it is missing or invalid."""
        ids = _ids(header)
        if ids is None:
            return None
        # Without the frozen __init__ (an object.__setattr__ per field, ~10 k instructions):
        # every delegation parses its turn's header. The same object (tests/test_tracing.py).
        return made(cls, {"trace_id": ids[0], "span_id": ids[1], "flags": ids[2], "version": "00"})

    @classmethod
    def new(cls, *, sampled: bool = True) -> TraceParent:
        """The root of a new trace."""
        return cls(
            trace_id=_random_hex(16, _ZERO_TRACE),
            span_id=_random_hex(8, _ZERO_SPAN),
            flags="01" if sampled else "00",
        )

    def child(self) -> TraceParent:
        """The same trace, a new span: what a caller sends to the next hop."""
        return TraceParent(
            trace_id=self.trace_id, span_id=_random_hex(8, _ZERO_SPAN), flags=self.flags
        )

    def child_text(self) -> str:
        """``str(self.child())`` without the child (a frozen dataclass made to be formatted
        once: every delegation sends one)."""
        return f"00-{self.trace_id}-{_random_hex(8, _ZERO_SPAN)}-{self.flags}"

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 0x01)

    def format(self) -> str:
        return f"{self.version}-{self.trace_id}-{self.span_id}-{self.flags}"

    def __str__(self) -> str:
        return self.format()


def _ids(header: str | None) -> tuple[str, str, str] | None:
    """The trace id, span id and flags of a valid header; None when it is missing or invalid."""
    if not header or not isinstance(header, str):
        return None
    match = _HEADER.match(header.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    # Version ff is forbidden; version 00 allows nothing after the flags. Higher versions
    # may append fields, which we drop (we speak version 00).
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return trace_id, span_id, flags


def ensure_traceparent(header: str | None) -> TraceParent:
    """The parsed header, or a new trace when it is missing or invalid."""
    return TraceParent.parse(header) or TraceParent.new()


def traceparent_text(header: str | None) -> str:
    """``ensure_traceparent(header).format()`` without the ``TraceParent`` (a frozen
    dataclass: every task reads its message's header once)."""
    if type(header) is str:
        if _HEADER_00.fullmatch(header) is not None:
            # A version 00 header as written (what a mesh caller sends) is its own text; only
            # all-zero ids make it invalid. ~1.5x cheaper than _ids's match, groups and tuple.
            if header[3:35] != _ZERO_TRACE and header[36:52] != _ZERO_SPAN:
                return header
            return _new_text()
    elif header is None:
        return _new_text()
    ids = _ids(header)
    if ids is None:
        return _new_text()
    return f"00-{ids[0]}-{ids[1]}-{ids[2]}"


def _new_text() -> str:
    """A new trace's text: its trace id and span id from one ``os.urandom`` call, without a
    loop (~4 k instructions less than ``_random_hex`` for each). Each id is still uniform over
    the values that are not all zeros, and independent of the other."""
    ids = os.urandom(24).hex()
    trace_id, span_id = ids[:32], ids[32:]
    if trace_id != _ZERO_TRACE and span_id != _ZERO_SPAN:
        return f"00-{trace_id}-{span_id}-01"
    # An all-zero id (odds 2**-64 at worst): both drawn again, each until it is not.
    return f"00-{_random_hex(16, _ZERO_TRACE)}-{_random_hex(8, _ZERO_SPAN)}-01"


def trace_id_of(header: str | None) -> str | None:
    """The trace id of a header value, None when it is missing or invalid."""
    ids = _ids(header)
    return ids[0] if ids is not None else None


class TraceLogFilter(logging.Filter):
    """Adds ``trace_id`` (``-`` outside a trace) to every record, from ``current_traceparent``.

    Install it on a handler and use ``%(trace_id)s`` in the format string.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "trace_id"):
            record.trace_id = trace_id_of(current_traceparent.get()) or "-"
        return True


def _random_hex(nbytes: int, zero: str) -> str:
    # All zeros is invalid; the odds are 2**-64 at worst, but the loop makes it impossible.
    for _ in range(8):
        value = os.urandom(nbytes).hex()  # secrets.token_hex's source, without its two calls
        if value != zero:
            return value
    raise RuntimeError("the random source returned zeros eight times")  # pragma: no cover
