"""The fast path's REQUIRED-field check (``mesh._a2a.fastpath_required``) says "missing"
exactly when the SDK's ``validate_proto_required_fields`` refuses the params (the fast path
then raises the SDK's own error)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from a2a.types import SendMessageRequest
from a2a.utils.errors import InvalidParamsError
from a2a.utils.proto_utils import validate_proto_required_fields
from google.protobuf.json_format import ParseDict

from mesh._a2a.fastpath_required import missing_required

GOOD: dict[str, Any] = {
    "message": {
        "messageId": "m-1",
        "role": "ROLE_USER",
        "parts": [{"text": "score APP-1 for 400"}, {"data": {"a": [1, {"b": None}]}}],
        "metadata": {"skill": "chat", "deep": {"list": [1, "two", {"three": [True]}]}},
    },
    "configuration": {"historyLength": 2},
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """GOOD with the field at dotted ``path`` set to ``value`` (None: removed)."""
    body = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return body


PUSH = {"url": "https://example.test/hook", "authentication": {"scheme": "Bearer"}}

CASES: dict[str, dict[str, Any]] = {
    "valid": GOOD,
    "no metadata": _with("message.metadata", None),
    "no message": _with("message", None),
    "no message id": _with("message.messageId", None),
    "empty message id": _with("message.messageId", ""),
    "no role": _with("message.role", None),
    "no parts": _with("message.parts", None),
    "empty parts": _with("message.parts", []),
    "valid push config": _with("configuration.taskPushNotificationConfig", PUSH),
    "push config without url": _with(
        "configuration.taskPushNotificationConfig", {"authentication": {"scheme": "Bearer"}}
    ),
    "push auth without scheme": _with(
        "configuration.taskPushNotificationConfig",
        {"url": "https://example.test/hook", "authentication": {"credentials": "x"}},
    ),
    "push config without auth": _with(
        "configuration.taskPushNotificationConfig", {"url": "https://example.test/hook"}
    ),
    "empty configuration": _with("configuration", {}),
    "no configuration": _with("configuration", None),
    "push config without url, no message id": _with("message.messageId", None)
    | {"configuration": {"taskPushNotificationConfig": {"authentication": {}}}},
}


def _sdk_refuses(params: SendMessageRequest) -> bool:
    try:
        validate_proto_required_fields(params)
    except InvalidParamsError:
        return True
    return False


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_check_agrees_with_the_sdk(case: str) -> None:
    params = ParseDict(CASES[case], SendMessageRequest())
    assert missing_required(params) == _sdk_refuses(params)


def test_the_cases_cover_both_answers() -> None:
    answers = {_sdk_refuses(ParseDict(body, SendMessageRequest())) for body in CASES.values()}
    assert answers == {True, False}
