"""A delegation's JSON-RPC answer, read by pydantic-core's parser (``mesh._a2a.jsonrpc._loads``):
the same values as ``json.loads`` for every text, and json's own errors for what neither reads."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from a2a.client import A2AClientError

from mesh._a2a import jsonrpc
from mesh._a2a.results import TaskResult

ANSWER = (
    b'{"result":{"task":{"id":"t-1","contextId":"c-1","status":{"state":"TASK_STATE_COMPLETED",'
    b'"timestamp":"2026-12-01T20:23:24.702282Z"},"artifacts":[{"artifactId":"a-1","name":"score",'
    b'"parts":[{"data":{"applicant_id":"a-1001","score":396.0,"tier":"D"},'
    b'"mediaType":"application/json"},{"text":"{\\"score\\":396}","mediaType":"text/plain"}]}],'
    b'"metadata":{"usage":{"inputTokens":0.0},"skill":"score"}}},"id":3,"jsonrpc":"2.0"}'
)

# Texts at the edges of JSON: numbers of every form, escapes, duplicates, whitespace, and
# texts one parser reads and the other refuses (both ways), or neither.
EDGES = [
    b'{"a":1e400}',
    b'{"a":-1e400}',
    b'{"a":NaN,"b":Infinity,"c":-Infinity}',
    b'{"a":123456789012345678901234567890}',
    b'{"a":-9223372036854775809,"b":18446744073709551616}',
    b'{"a":-0,"b":-0.0,"c":0.1e1,"d":1E5,"e":1.5e-320,"f":4.9e-325}',
    b'{"a":9007199254740993,"b":1.7976931348623157e309}',
    b'{"a":0.' + b"1" * 400 + b"}",
    b'{"a":1' + b"0" * 5000 + b"}",
    b'{"a":"\\ud800"}',
    b'{"a":"\\uDFFF\\uD800"}',
    b'{"\\ud83d\\ude00":"\\u0000\\/\\n"}',
    b'{"a":1,"b":2,"a":3}',
    b' {"a":\t1}\n',
    b"\xef\xbb\xbf{}",
    b'{"a":"\xed\xa0\x80"}',
    b'{"a":"\xff"}',
    '{"a":1}'.encode("utf-16-le"),
    b"[" * 300 + b"]" * 300,
    b'{"a":"\x01"}',
    b'{"a":1,}',
    b'{"a":01}',
    b'{"a":.5}',
    b'{"a":1}x',
    b"",
    b'"text"',
    b"[1]",
]


def _same(a: Any, b: Any) -> bool:
    """Equal, by type too, floats to the bit (``-0.0``, NaN), keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _outcome(read: Any, text: bytes) -> tuple[str, Any]:
    try:
        return "value", read(text)
    except (ValueError, RecursionError) as exc:
        return "error", f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("text", EDGES)
def test_reads_what_json_reads_and_refuses_what_it_refuses(text: bytes) -> None:
    kind, value = _outcome(jsonrpc._loads, text)
    want_kind, want = _outcome(json.loads, text)
    assert kind == want_kind
    assert _same(value, want) if kind == "value" else value == want


def test_an_answer_is_read_without_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = TaskResult.from_json(json.loads(ANSWER)["result"]["task"])

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("json.loads read the answer")

    monkeypatch.setattr(json, "loads", refuse)
    result = TaskResult.from_json(jsonrpc.result_of(ANSWER)["task"])
    assert result == expected
    assert result.data == {"applicant_id": "a-1001", "score": 396, "tier": "D"}


def test_a_malformed_answer_keeps_json_s_error() -> None:
    with pytest.raises(json.JSONDecodeError) as json_error:
        json.loads(b'{"result": ')
    with pytest.raises(A2AClientError) as caught:
        jsonrpc.result_of(b'{"result": ')
    assert str(caught.value) == str(A2AClientError(f"JSON Decode Error: {json_error.value}"))
