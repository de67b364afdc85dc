"""The blocking ``SendMessage`` of a delegation as JSON-RPC, built and read without protobuf.

It speaks what the a2a-sdk's own JSON-RPC transport sends (same method, fields and ``A2A-Version``
header; tests/test_delegation_one_trip.py compares the two) and raises, for a JSON-RPC error, the
A2A error type the SDK's transport raises for the same code, so ``A2APeer`` translates both the
same way.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

import pydantic_core
from a2a.client import A2AClientError
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, VERSION_HEADER
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, InvalidParamsError

from mesh._a2a.card import JSON_MODE

__all__ = ["HEADERS", "result_of", "send_message_body"]

#: The headers of every JSON-RPC request (the SDK's transport sends the same).
HEADERS = {VERSION_HEADER: PROTOCOL_VERSION_CURRENT, "Content-Type": "application/json"}
_ERRORS = {code: error for error, code in JSON_RPC_ERROR_CODE_MAP.items()}
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_ids = itertools.count(1)
# ``json.dumps`` with arguments builds an encoder per call; one, made once, writes the same.
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_encode = _ENCODER.encode
# The C encoder that encoder's ``encode`` makes per call (its ``iterencode``), made once, without
# the circular-reference check (a dict of ids shared by every call would be state across calls
# and threads): a value that nests too deeply, or contains itself, goes to ``_encode``, which
# refuses it with its own error. Everything else it writes and refuses as ``_encode`` does.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)  # not in the type stubs
_encode_once = (
    _c_make_encoder(
        None,
        _ENCODER.default,
        encode_basestring_ascii,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        _ENCODER.sort_keys,
        _ENCODER.skipkeys,
        _ENCODER.allow_nan,
    )
    if _c_make_encoder is not None
    else None
)
# What the encoder writes for a str (keys and values): ensure_ascii's escaping.
_text = encode_basestring_ascii
_JSON_MODE = _text(JSON_MODE)
# The request's end after its message: the configuration, then the id's name.
_WAITING = '},"configuration":{"historyLength":0}},"id":'
_NOT_WAITING = '},"configuration":{"historyLength":0,"returnImmediately":true}},"id":'


def send_message_body(
    payload: dict[str, Any] | str,
    *,
    skill: str | None,
    message_id: str | None,
    context_id: str | None,
    metadata: Mapping[str, Any] | None,
    wait: bool,
    task_id: str | None = None,
) -> bytes:
    """The ``SendMessage`` request for a typed (dict: one data part) or text (str) payload;
    ``wait=False`` asks for the task as soon as it exists (``returnImmediately``); ``task_id``
    sends it to that existing task (an answer to a task waiting for input). A payload that is
    not JSON is ``InvalidParamsError`` (nothing is sent).

    Written as the one JSON encoder call on the whole request would write it, to the byte
    (tests/test_rpc_body_bytes.py), with the request's fixed names and values written once here:
    only the payload goes through the encoder, and the metadata too unless all of it is text
    and finite numbers (what a delegation sends)."""
    meta: dict[str, Any] = dict(metadata or {})
    if skill:
        meta["skill"] = skill
    request_id = next(_ids)
    try:
        # In the order the encoder walks the request (the first problem found is the one told).
        message = [
            '{"method":"SendMessage","params":{"message":{"messageId":',
            _value(message_id or os.urandom(16).hex()),
            ',"role":"ROLE_USER","parts":[',
            '{"text":' + _text(payload) + "}"
            if isinstance(payload, str)
            else '{"data":'
            + (_plain(payload) or _encode(payload))
            + ',"mediaType":'
            + _JSON_MODE
            + "}",
            "]",
        ]
        if context_id:
            message += (',"contextId":', _value(context_id))
        if task_id:
            message += (',"taskId":', _value(task_id))
        if meta:
            message += (',"metadata":', _metadata(meta))
    except (TypeError, ValueError) as exc:
        raise InvalidParamsError(f"the payload is not JSON: {exc}") from exc
    message += (_WAITING if wait else _NOT_WAITING, str(request_id), ',"jsonrpc":"2.0"}')
    return "".join(message).encode()


def _metadata(meta: dict[str, Any]) -> str:
    """``meta`` as the encoder writes it, by its C encoder made once (a delegation's five
    values: ~24 k instructions against ``_plain``'s ~29 k, the deadline's float written alike)."""
    if _encode_once is None:
        return _plain(meta) or _encode(meta)
    try:
        return "".join(_encode_once(meta, 0))
    except RecursionError:
        return _encode(meta)  # contains itself or nests too deeply: the encoder's own error


def _value(value: Any) -> str:
    # An id is a str (anything else is written as the encoder writes it).
    return _text(value) if isinstance(value, str) else _encode(value)


#: What the encoder writes for True, False and None.
_CONSTANTS = {True: "true", False: "false", None: "null"}


def _plain(meta: Any) -> str | None:
    """``meta`` as the encoder writes it when it is a dict whose every name is a str and every
    value a str, an int, a finite float, a bool or None (a delegation's metadata: traceparent,
    deadline, caller...; a typed payload of such values); None for anything else (the encoder
    writes it then, and says what it refuses). The encoder writes an int or a float by its
    type's own ``__repr__`` (so a subclass's repr is not used), as done here for exactly those
    types."""
    if type(meta) is not dict:
        return None
    items = []
    for name, value in meta.items():
        if type(name) is not str:
            return None
        kind = type(value)
        if kind is str:
            items.append(_text(name) + ":" + _text(value))
        elif kind is int:
            items.append(_text(name) + ":" + int.__repr__(value))
        elif kind is float and value - value == 0.0:  # finite: NaN and infinities are not
            items.append(_text(name) + ":" + float.__repr__(value))
        elif kind is bool or value is None:
            items.append(_text(name) + ":" + _CONSTANTS[value])
        else:
            return None
    return "{" + ",".join(items) + "}"


def result_of(content: bytes) -> Mapping[str, Any]:
    """The ``result`` object of a JSON-RPC answer. A JSON-RPC error raises the A2A error the
    SDK's transport raises for its code; anything that is not a JSON-RPC answer,
    ``A2AClientError``."""
    try:
        answer = _loads(content)
    except ValueError as exc:
        raise A2AClientError(f"JSON Decode Error: {exc}") from exc
    if not isinstance(answer, dict):
        raise A2AClientError(
            f"Invalid JSON-RPC response: expected an object, got {type(answer).__name__}"
        )
    error = answer.get("error")
    if error:
        if not isinstance(error, dict):
            raise A2AClientError(f"Invalid JSON-RPC response: error is not an object: {error!r}")
        code, message = error.get("code"), error.get("message", str(error))
        data: dict[str, Any] | None = None
        raw = error.get("data")
        if isinstance(raw, list):
            for item in raw:
                if isinstance(item, dict) and item.get("@type") == _ERROR_INFO:
                    data = item.get("metadata") or None
                    break
        if isinstance(code, int) and code in _ERRORS:
            raise _ERRORS[code](message, data=data)
        raise A2AClientError(f"JSON-RPC Error {code}: {message}")
    result = answer.get("result")
    if not isinstance(result, dict):
        raise A2AClientError("Invalid JSON-RPC response: it has no 'result' object")
    return result


def _loads(content: bytes) -> Any:
    """``json.loads(content)``, read by pydantic-core's parser first (~3x faster on a
    delegation's answer) to the same values for every text it reads (floats, big integers,
    duplicate keys, ``NaN``/``Infinity``; tests/test_rpc_answer_json.py). What it refuses (a lone
    surrogate, a BOM, UTF-16, nesting past its depth, an integer json refuses too, any malformed
    text) goes to ``json.loads``: read as before, or refused with json's own error."""
    try:
        return pydantic_core.from_json(content)
    except ValueError:
        return json.loads(content)
