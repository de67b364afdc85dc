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
_encode = json.JSONEncoder(separators=(",", ":")).encode


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
    not JSON is ``InvalidParamsError`` (nothing is sent)."""
    meta: dict[str, Any] = dict(metadata or {})
    if skill:
        meta["skill"] = skill
    part: dict[str, Any] = (
        {"text": payload} if isinstance(payload, str) else {"data": payload, "mediaType": JSON_MODE}
    )
    message: dict[str, Any] = {
        "messageId": message_id or os.urandom(16).hex(),
        "role": "ROLE_USER",
        "parts": [part],
    }
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    if meta:
        message["metadata"] = meta
    configuration: dict[str, Any] = {"historyLength": 0}
    if not wait:
        configuration["returnImmediately"] = True
    body = {
        "method": "SendMessage",
        "params": {"message": message, "configuration": configuration},
        "id": next(_ids),
        "jsonrpc": "2.0",
    }
    try:
        return _encode(body).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidParamsError(f"the payload is not JSON: {exc}") from exc


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
