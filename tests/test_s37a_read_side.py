"""The gate's body parse and the task's trace, made cheaper in session 37, read and refuse
exactly what they did: ``parse_json`` / ``parse_rpc_body`` (a body that starts with ``{`` read
as UTF-8 without ``json.detect_encoding``, the C scanner called without ``decode``'s regex
matches) against the parse as it was, to the value, the error code and message, and the
nesting depth that is too deep; ``traceparent_text`` (a version 00 header taken as written, a
new trace's ids from one ``os.urandom`` call) against ``ensure_traceparent(header).format()``."""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh import _rpc_body, _tracing
from mesh._rpc_body import RpcRefused, parse_json, parse_rpc_body
from mesh._tracing import ensure_traceparent, traceparent_text

# ---- the parse as it was (b007e39) -----------------------------------------------------------


def _reference_json(body: bytes) -> Any:
    """``parse_json`` before session 37: the same frames down to the C scanner (decode,
    raw_decode), so the same depth is too deep."""
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
        data = _rpc_body._STRICT.decode(text)
    except json.JSONDecodeError as exc:
        raise RpcRefused(-32700, f"Parse error: {exc}") from None
    except UnicodeDecodeError:
        raise RpcRefused(-32700, "Parse error: the body is not UTF-8 JSON text") from None
    except RecursionError:
        raise RpcRefused(
            -32700,
            "Parse error: the JSON is nested too deeply to parse (a data part may nest at most "
            "about 48 levels)",
        ) from None
    except ValueError:
        raise _rpc_body._locate(body) from None
    return data


def _reference_rpc(body: bytes) -> Any:
    data = _reference_json(body)
    _rpc_body._check_envelope(data)
    return data


def _outcome(parse: Any, body: bytes) -> tuple[str, Any]:
    """What ``parse`` makes of ``body``: the value (with its types), or the refusal."""
    try:
        value = parse(body)
    except RpcRefused as refused:
        return "refused", (refused.code, refused.message, refused.request_id, refused.body())
    except Exception as exc:
        # _locate's own parse failing on what the strict parse stopped before (a literal
        # such as NaN followed by what is not JSON): an error as it was, found, not fixed, here.
        return "raised", (type(exc), str(exc))
    return "value", _typed(value)


def _typed(value: Any) -> Any:
    """``value`` with each leaf's type, and each object's members in order."""
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


def _same(body: bytes) -> None:
    assert _outcome(parse_json, body) == _outcome(_reference_json, body)
    assert _outcome(parse_rpc_body, body) == _outcome(_reference_rpc, body)


# ---- bodies ------------------------------------------------------------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_ids = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=6),
    st.booleans(),
    st.floats(),
    st.lists(st.integers(), max_size=2),
)
_envelopes = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "id": _ids,
        "method": st.one_of(st.sampled_from(["SendMessage", ""]), st.integers()),
        "params": _json,
    },
)
_spaces = st.sampled_from(["", " ", "\n", "\r\n\t ", "  x", "}", ",", " {}", "\x00"])
# Literals the strict parse refuses or locates, spliced into a body's text.
_odd = st.sampled_from(
    [
        "NaN",
        "-Infinity",
        "Infinity",
        "1e400",
        "-1e999",
        "1" * 4400,
        "1.5",
        "0",
        '"\\ud800"',
        '"\\udc00x"',
        "[" * 5,
        "tru",
        '"\\x"',
        "01",
    ]
)
_encodings = st.sampled_from(
    ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"]
)


@settings(max_examples=400, deadline=None)
@given(_envelopes, _spaces, _spaces, st.booleans())
def test_an_envelope_is_read_and_refused_as_before(
    body: dict[str, Any], before: str, after: str, compact: bool
) -> None:
    text = json.dumps(body, separators=(",", ":") if compact else None)
    _same((before + text + after).encode())
    _same(text.encode())


@settings(max_examples=300, deadline=None)
@given(_envelopes, _odd, st.integers(min_value=0, max_value=10_000))
def test_an_odd_literal_anywhere_is_refused_or_read_as_before(
    body: dict[str, Any], literal: str, at: int
) -> None:
    text = json.dumps(body, separators=(",", ":"))
    at = at % (len(text) + 1)
    _same((text[:at] + literal + text[at:]).encode())
    # As a member's value, where a number may stand.
    _same(json.dumps({**body, "params": {"x": 1}}).replace("1}", literal + "}").encode())


@settings(max_examples=200, deadline=None)
@given(_envelopes, _encodings)
def test_other_encodings_are_read_as_before(body: dict[str, Any], encoding: str) -> None:
    _same(json.dumps(body).encode(encoding))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40))
def test_any_bytes_after_a_brace_are_read_as_before(head: bytes, tail: bytes) -> None:
    _same(b"{" + head)
    _same(b"{" + head + b'"id":1}' + tail)
    _same(head + tail)


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"{}",
        b"{\x00",
        b"{\x00\x00\x00",
        b'{\x00"\x00',  # UTF-16-LE of '{"'
        b"{ }",
        b"{}\n",
        b"{} x",
        b'{"a":1}{"b":2}',
        b'{"jsonrpc":"2.0","method":"m","id":1}   ',
        b'{"jsonrpc":"2.0","method":"m","id":1,"params":{"n":NaN}}',
        b'{"jsonrpc":"2.0","method":"m","id":"7","params":{"n":[1,2e999]}}',
        b'{"jsonrpc":"2.0","method":"m","id":1,"params":{"n":"\xff"}}',
        b'{"jsonrpc":"2.0","method":"m","id":1,"params":{"n":"\xed\xa0\x80"}}',
        b'{"jsonrpc":"2.0","method":"m","id":1,"params":{"n":"\\ud800"}}',
        b'{"jsonrpc":"2.0","method":"m","id":true}',
        b"\xef\xbb\xbf{}",
        b" {}",
    ],
)
def test_edge_bodies_are_read_as_before(body: bytes) -> None:
    _same(body)


def test_the_depth_too_deep_to_parse_is_the_same() -> None:
    """Called from this same frame, both parses refuse from the same nesting on: the C scanner
    is as many Python frames below ``parse_json`` as it was."""

    def nested(depth: int) -> bytes:
        return b'{"a":' * depth + b"1" + b"}" * depth

    def too_deep(parse: Any, depth: int) -> bool:
        try:
            parse(nested(depth))
        except RpcRefused as refused:
            refusal = refused.message
        else:
            return False
        assert "nested too deeply" in refusal
        return True

    low, high = 1, sys.getrecursionlimit() + 10
    assert too_deep(_reference_json, high)
    assert not too_deep(_reference_json, low)
    while high - low > 1:  # the reference's first depth too deep
        mid = (low + high) // 2
        low, high = (low, mid) if too_deep(_reference_json, mid) else (mid, high)
    for depth in range(high - 4, high + 5):
        assert too_deep(parse_json, depth) == too_deep(_reference_json, depth), depth
        assert too_deep(parse_json, depth) == (depth >= high)


# ---- traceparent_text ----------------------------------------------------------------------------

_NEW = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01")
_hex = "0123456789abcdef"


def _reference_valid(header: Any) -> str | None:
    """The text ``traceparent_text`` gives for a header it keeps, else None (a new trace)."""
    parsed = _tracing.TraceParent.parse(header)
    return None if parsed is None else ensure_traceparent(header).format()


def _check_trace(header: Any) -> None:
    text = traceparent_text(header)
    assert type(text) is str
    kept = _reference_valid(header)
    if kept is not None:
        assert text == kept
    else:
        assert _NEW.fullmatch(text), text
        assert text[3:35] != "0" * 32
        assert text[36:52] != "0" * 16
        assert traceparent_text(header) != text  # a new trace each time


class Header(str):
    pass


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(["00", "01", "ff", "0g", "0", "000"]),
    st.text(_hex + "ABx", min_size=31, max_size=33),
    st.text(_hex + "Ag", min_size=15, max_size=17),
    st.sampled_from(["01", "00", "ff", "1", "0x", "AB"]),
    st.sampled_from(["", "-", "-x", "-00", " ", "\n", "\t"]),
    st.sampled_from(["", " ", "\t", "\n"]),
)
def test_a_header_is_kept_or_replaced_as_before(
    version: str, trace: str, span: str, flags: str, rest: str, pad: str
) -> None:
    header = f"{pad}{version}-{trace}-{span}-{flags}{rest}"
    _check_trace(header)
    _check_trace(Header(header))


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "x",
        5,
        b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01",
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "0" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "a" * 32 + "-" + "0" * 16 + "-01",
        "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
        "00-" + "a" * 32 + "-" + "b" * 16 + "-00",
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01 ",
        " 00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01-x",
        "01-" + "a" * 32 + "-" + "b" * 16 + "-01-x",
        "00-" + "A" * 32 + "-" + "b" * 16 + "-01",
        Header("00-" + "a" * 32 + "-" + "b" * 16 + "-01"),
    ],
)
def test_edge_headers_are_kept_or_replaced_as_before(header: Any) -> None:
    _check_trace(header)


def test_a_new_trace_draws_again_past_an_all_zero_id(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.urandom
    draws: list[bytes] = []

    def urandom(n: int) -> bytes:
        return draws.pop(0)[:n] if draws else real(n)

    monkeypatch.setattr(os, "urandom", urandom)
    for zeros in (bytes(24), bytes(16) + b"\x01" * 8, b"\x01" * 16 + bytes(8)):
        draws.append(zeros)
        text = traceparent_text(None)
        assert _NEW.fullmatch(text)
        assert text[3:35] != "0" * 32
        assert text[36:52] != "0" * 16
        assert not draws
