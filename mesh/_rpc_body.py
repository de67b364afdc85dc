"""``parse_rpc_body``: a JSON-RPC request body parsed once, strictly, as the node's gate
(``mesh._gate``) reads it.

JSON-RPC cannot carry what JSON does not have: ``NaN``/``Infinity`` are a parse error (-32700)
and a number no double holds (``1e400``, an integer of thousands of digits) is invalid params
(-32602), both naming where they are; a body nested too deeply to parse is -32700. Python's
parser accepts all of these (and the SDK then failed with HTTP 500 while writing the answer).

Then the envelope, as JSON-RPC 2.0 defines it: an object (no batches), ``"jsonrpc": "2.0"``, a
``method`` string, an ``id`` that is a string, an integer or null, ``params`` an object when
present; else -32600 (-32602 for ``params``) naming the member. The SDK answers these too, but
logs an ERROR with a traceback for each: a caller could fill the log at will.

    try:
        data = parse_rpc_body(body)    # a dict whose "method" is a str
    except RpcRefused as refused:
        answer = refused.body()    # {"error": {"code": -32602, "message": "..."}, ...}
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

__all__ = ["RpcRefused", "parse_json", "parse_rpc_body"]

# An id of a JSON-RPC request is a string, a number or null (bool is an int to Python).
_RpcId = str | int | None


class RpcRefused(Exception):
    """A body the node answers with a JSON-RPC error itself. ``request_id`` as JSON-RPC wants
    it: None when the body could not be parsed."""

    def __init__(self, code: int, message: str, request_id: _RpcId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id

    def body(self) -> bytes:
        error = {"code": self.code, "message": self.message}
        # "error" first, like the SDK's answers (the gate's outcome check reads the first bytes).
        return json.dumps(
            {"error": error, "id": self.request_id, "jsonrpc": "2.0"}, separators=(",", ":")
        ).encode()


class _NotFinite(ValueError):
    """Raised by the strict parser's hooks; the slow path then says where."""


_TOO_DEEP = (
    "Parse error: the JSON is nested too deeply to parse (a data part may nest at most about 48 "
    "levels)"
)


def _no_constant(literal: str) -> Any:
    raise _NotFinite(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise _NotFinite(literal)
    return value


# Built once: json.loads(..., hooks) would build a decoder per request.
_STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)
_scan_once = _STRICT.scan_once  # type: ignore[attr-defined]
_space = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]  # what decode skips


def _object(body: bytes) -> Any:
    """``_STRICT.decode`` of a UTF-8 ``body`` that starts with ``{``, its answer and its
    errors, without its leading whitespace match (there is none). The C scanner is called two
    Python frames below ``parse_json``, as through ``decode`` and ``raw_decode``: how deep a
    body may nest before RecursionError is the same."""
    text = body.decode("utf-8", "surrogatepass")
    data, end = _scanned(text)
    if end != len(text):
        end = _space(text, end).end()
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    return data


def _scanned(text: str) -> tuple[Any, int]:
    """``raw_decode(text)``: the C scanner's StopIteration for a member with no value (it
    tells where) is its JSONDecodeError."""
    try:
        return _scan_once(text, 0)  # type: ignore[no-any-return]
    except StopIteration as err:
        raise json.JSONDecodeError("Expecting value", text, err.value) from None


def parse_rpc_body(body: bytes) -> dict[str, Any]:
    """The JSON-RPC request in ``body``, or ``RpcRefused`` (-32700 not JSON, -32602 a number no
    double holds, -32600 not a JSON-RPC 2.0 request) naming what and where. One parse, as fast
    as ``json.loads``: the hooks run only on non-integer numbers and on the non-JSON constants."""
    data = parse_json(body)
    _check_envelope(data)
    return data  # type: ignore[no-any-return]


def parse_json(body: bytes) -> Any:
    """The JSON value in ``body``, strictly (``parse_rpc_body`` without the envelope: a REST
    body), or ``RpcRefused`` (-32700 not JSON, -32602 a number no double holds)."""
    try:
        if body[:1] == b"{" and body[1:2] != b"\x00":
            # UTF-8 by detect_encoding's own rule (no BOM starts with "{", and a second byte
            # that is not zero rules out UTF-16 and UTF-32); its call, ~5.6 k instructions, and
            # decode's and raw_decode's (their regex matches, their frames), ~6 k, left out.
            data = _object(body)
        else:
            text = body.decode(json.detect_encoding(body), "surrogatepass")
            data = _STRICT.decode(text)
    except json.JSONDecodeError as exc:
        raise RpcRefused(-32700, f"Parse error: {exc}") from None
    except UnicodeDecodeError:
        raise RpcRefused(-32700, "Parse error: the body is not UTF-8 JSON text") from None
    except RecursionError:
        raise RpcRefused(-32700, _TOO_DEEP) from None
    except ValueError:
        # _NotFinite, or an integer longer than Python converts (4300 digits).
        raise _locate(body) from None
    return data


_ID_TYPES = (str, int, type(None))  # exact types: a bool is an int to isinstance
_KINDS = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number written with a fraction or an exponent",
    bool: "a boolean",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _check_envelope(data: Any) -> None:
    """``RpcRefused`` unless ``data`` is one JSON-RPC 2.0 request (a few lookups)."""
    if type(data) is not dict:
        extra = " (batches are not supported)" if type(data) is list else ""
        raise RpcRefused(
            -32600, f"Invalid Request: a JSON-RPC request is an object, got {_kind(data)}{extra}"
        )
    request_id = data.get("id")
    if type(request_id) not in _ID_TYPES:
        raise RpcRefused(
            -32600,
            "Invalid Request: 'id' must be a string, an integer or null (JSON-RPC 2.0), "
            f"got {_kind(request_id)}",
        )
    if data.get("jsonrpc") != "2.0":
        raise RpcRefused(-32600, "Invalid Request: 'jsonrpc' must be \"2.0\"", request_id)
    method = data.get("method")
    if type(method) is not str or not method:
        raise RpcRefused(
            -32600, "Invalid Request: 'method' must be the name of an A2A method", request_id
        )
    if "params" in data and type(data["params"]) is not dict:
        raise RpcRefused(
            -32602,
            f"Invalid params: 'params' must be an object, got {_kind(data['params'])}",
            request_id,
        )


class _Bad:
    """Stands for an offending literal in the slow re-parse."""

    __slots__ = ("kind", "literal")

    def __init__(self, kind: str, literal: str) -> None:
        self.kind = kind
        self.literal = literal if len(literal) <= 24 else f"{literal[:12]}...({len(literal)} chars)"


def _mark_float(literal: str) -> Any:
    value = float(literal)
    return _Bad("range", literal) if math.isinf(value) else value


def _mark_int(literal: str) -> Any:
    try:
        return int(literal)
    except ValueError:
        return _Bad("digits", literal)


def _locate(body: bytes) -> RpcRefused:
    """The refusal for a body the strict parse rejected for one of its numbers (error path
    only: parses again with markers and walks to the first one)."""
    try:
        data = json.loads(
            body,
            parse_constant=lambda literal: _Bad("constant", literal),
            parse_float=_mark_float,
            parse_int=_mark_int,
        )
    except json.JSONDecodeError as exc:
        # Not JSON past the number the strict parse stopped at (``{"a": NaN x}``): the
        # strict parse's hook ran before its scanner reached the syntax error.
        return RpcRefused(-32700, f"Parse error: {exc}")
    except RecursionError:
        return RpcRefused(-32700, _TOO_DEEP)
    path, bad = next(_marks(data), ("", _Bad("range", "?")))
    where = path or "the body"
    if bad.kind == "constant":
        return RpcRefused(
            -32700,
            f"Parse error: {bad.literal} at {where} is not JSON (JSON numbers are finite); send "
            "null or a string instead",
        )
    request_id = data.get("id") if isinstance(data, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
        request_id = None
    what = (
        f"{bad.literal} is out of the range of a double (|x| < 1.8e308)"
        if bad.kind == "range"
        else f"the integer {bad.literal} has too many digits (send it as a string)"
    )
    return RpcRefused(-32602, f"Invalid params: {where}: {what}", request_id)


def _marks(data: Any) -> Iterator[tuple[str, _Bad]]:
    """(path, marker) of every offending literal, depth first, in document order."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Bad):
            yield path, value
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
