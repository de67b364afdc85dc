"""A delegation's ``SendMessage`` request (``mesh._a2a.jsonrpc.send_message_body``), written by
hand around its payload, is byte for byte what one JSON encoder call on the whole request
writes, and refuses what that call refuses with the same error."""

from __future__ import annotations

import enum
import itertools
import json
import os
import sys
from collections import OrderedDict
from typing import Any

import pytest
from a2a.utils.errors import InvalidParamsError

from mesh._a2a import jsonrpc


def _reference(
    payload: Any,
    *,
    skill: str | None,
    message_id: Any,
    context_id: Any,
    metadata: Any,
    wait: bool,
    task_id: Any = None,
    request_id: int,
) -> bytes:
    """The request as first written: the whole dict, one encoder call."""
    meta: dict[str, Any] = dict(metadata or {})
    if skill:
        meta["skill"] = skill
    part: dict[str, Any] = (
        {"text": payload}
        if isinstance(payload, str)
        else {"data": payload, "mediaType": "application/json"}
    )
    message: dict[str, Any] = {"messageId": message_id, "role": "ROLE_USER", "parts": [part]}
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
        "id": request_id,
        "jsonrpc": "2.0",
    }
    return json.JSONEncoder(separators=(",", ":")).encode(body).encode()


class Text(str):
    pass


class Kind(enum.Enum):
    A = "a"


DELEGATION = {
    "traceparent": "00-0123456789abcdef0123456789abcdef-c9608098496983f1-01",
    "deadline": 1796156634.6968007,
    "caller": "bench-coordinator",
    "callerTask": "t-2",
}


class Level(enum.IntEnum):
    HIGH = 3


PAYLOADS: list[Any] = [
    {"applicant_id": "a-1001", "amount": 25000},
    {"i": 2**70, "neg": -5, "z": -0.0, "e": 1e16, "t": True, "f": False, "n": None, "s": "\ud800"},
    {"level": Level.HIGH, "flag": True, "sub": Text("x")},
    {"inf": float("inf"), "ok": 1},
    {"x": [1, 2.5, None, True, {"y": 'é\u2028"\\/\n'}], "n": float("nan"), "i": -1e400},
    {1: "int key", 2.5: "float key", None: "null", False: "bool"},
    OrderedDict([("b", 1), ("a", Text("sub"))]),
    "plain text, \u00e9t\u00e9 \U0001f600",
    Text("a str subclass"),
    "",
    {},
    [1, "two"],
]
METADATA: list[Any] = [
    None,
    {},
    DELEGATION,
    {**DELEGATION, "deadline": 1e16},
    {**DELEGATION, "deadline": float("inf")},
    {**DELEGATION, "deadline": float("nan")},
    {**DELEGATION, "deadline": 1796156634},
    {**DELEGATION, "flag": True, "none": None},
    {"urn:mesh:tasks:v1": {"answers": "q-1"}, "caller": "me"},
    {"caller": Text("sub"), Text("key"): "v", "é": "\u00ff"},
    {1: "x"},
]


def _refused_alike(
    payload: Any, error: type[Exception], match: str | None = None, *, metadata: Any = None
) -> None:
    """``send_message_body`` refuses ``payload`` with the encoder's own message (what
    ``_reference``, the encoder's bytes, raises), as the SDK-facing ``InvalidParamsError``."""
    with pytest.raises(InvalidParamsError) as sent:
        jsonrpc.send_message_body(
            payload, skill="s", message_id="m", context_id=None, metadata=metadata, wait=True
        )
    with pytest.raises(error, match=match) as encoded:
        _reference(
            payload,
            skill="s",
            message_id="m",
            context_id=None,
            metadata=metadata,
            wait=True,
            request_id=1,
        )
    assert str(sent.value) == str(InvalidParamsError(f"the payload is not JSON: {encoded.value}"))


@pytest.mark.parametrize(
    ("payload", "metadata"), list(itertools.product(PAYLOADS, METADATA)), ids=str
)
def test_the_request_is_the_encoders_to_the_byte(payload: Any, metadata: Any) -> None:
    for skill, context_id, task_id, wait in [
        ("score", None, None, True),
        (None, "ctx-1", None, False),
        ("", "", "task-\u00e9", True),
        ("chat", "c", "t", False),
    ]:
        sent = jsonrpc.send_message_body(
            payload,
            skill=skill,
            message_id="0848f5868115fa1ed7221b3ba2a54354",
            context_id=context_id,
            metadata=metadata,
            wait=wait,
            task_id=task_id,
        )
        request_id = json.loads(sent)["id"]
        assert sent == _reference(
            payload,
            skill=skill,
            message_id="0848f5868115fa1ed7221b3ba2a54354",
            context_id=context_id,
            metadata=metadata,
            wait=wait,
            task_id=task_id,
            request_id=request_id,
        )


def test_a_new_message_id_and_the_next_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
    first = jsonrpc.send_message_body(
        {"a": 1}, skill=None, message_id=None, context_id=None, metadata=None, wait=True
    )
    second = jsonrpc.send_message_body(
        {"a": 1}, skill=None, message_id="", context_id=None, metadata=None, wait=True
    )
    ids = [json.loads(first)["id"], json.loads(second)["id"]]
    assert ids[1] == ids[0] + 1
    for sent, request_id in ((first, ids[0]), (second, ids[1])):
        assert sent == _reference(
            {"a": 1},
            skill=None,
            message_id="01" * 16,
            context_id=None,
            metadata=None,
            wait=True,
            request_id=request_id,
        )


@pytest.mark.parametrize(
    ("payload", "metadata"),
    [
        ({"when": object()}, None),
        ({"set": {1}}, DELEGATION),
        (
            {"ok": 1},
            {**DELEGATION, "kind": Kind.A},
        ),
        ({"first": object()}, {"second": object()}),
        ({(1, 2): "tuple key"}, None),
    ],
)
def test_what_the_encoder_refuses_is_refused_the_same(payload: Any, metadata: Any) -> None:
    _refused_alike(payload, TypeError, metadata=metadata)


def test_a_circular_payload_is_refused_the_same() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    _refused_alike(loop, ValueError, "Circular")


def test_circular_metadata_is_refused_the_same_and_the_next_request_is_written() -> None:
    # The metadata's C encoder is made once, without the circular check's shared state: a
    # metadata that contains itself is the encoder's refusal, and leaves nothing behind.
    loop: dict[str, Any] = {**DELEGATION}
    loop["self"] = {"again": loop}
    _refused_alike({"ok": 1}, ValueError, "Circular", metadata=loop)
    assert jsonrpc.send_message_body(
        {"ok": 1}, skill="s", message_id="m", context_id=None, metadata=DELEGATION, wait=True
    ) == _reference(
        {"ok": 1},
        skill="s",
        message_id="m",
        context_id=None,
        metadata=DELEGATION,
        wait=True,
        request_id=json.loads(
            jsonrpc.send_message_body(
                {"ok": 1}, skill="s", message_id="m", context_id=None, metadata=None, wait=True
            )
        )["id"]
        - 1,
    )


def test_metadata_nested_past_the_recursion_limit_fails_as_the_encoder_does() -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(sys.getrecursionlimit() + 10):
        inner["d"] = {}
        inner = inner["d"]
    with pytest.raises(RecursionError):
        jsonrpc._encode(deep)
    with pytest.raises(RecursionError):
        jsonrpc.send_message_body(
            {"ok": 1}, skill="s", message_id="m", context_id=None, metadata=deep, wait=True
        )


def test_only_the_payload_goes_through_the_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[Any] = []
    encode = jsonrpc._encode

    def counted(value: Any) -> str:
        encoded.append(value)
        return encode(value)

    monkeypatch.setattr(jsonrpc, "_encode", counted)
    payload = {"applicant_id": "a-1001", "nested": {"amount": 25000}}
    jsonrpc.send_message_body(
        payload, skill="score", message_id="m", context_id="c", metadata=DELEGATION, wait=True
    )
    assert encoded == [payload]
    assert encoded[0] is payload


def test_a_flat_payload_goes_through_no_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typed payload of names and plain values (the bench's: a str and an int) is written
    as the encoder writes it without a call of it (it makes a C encoder object per call)."""

    def refused(value: Any) -> str:
        raise AssertionError(f"encoded {value!r}")

    monkeypatch.setattr(jsonrpc, "_encode", refused)
    payload = {"applicant_id": "a-1001", "amount": 25000, "rate": 0.5, "ok": True, "no": None}
    sent = jsonrpc.send_message_body(
        payload, skill="score", message_id="m", context_id="c", metadata=DELEGATION, wait=True
    )
    assert json.loads(sent)["params"]["message"]["parts"] == [
        {"data": payload, "mediaType": "application/json"}
    ]


def test_an_int_past_the_digit_limit_is_refused_the_same() -> None:
    _refused_alike({"a": 1, "big": 10**5000}, ValueError, "digits")
