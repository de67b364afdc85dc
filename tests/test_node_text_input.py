"""Typed skills reached by text-only clients: the input as a JSON object in one text part (or in
ADK's ``<a2a_datapart_json>`` wrapping), the skill named in metadata, implied by the only typed
skill, or picked by the single input schema the object matches; real nodes over JSON-RPC."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.helpers import get_data_parts
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import SendMessageRequest, Task
from google.protobuf.json_format import ParseDict

from mesh._a2a.card import build_card
from mesh._a2a.dispatcher import SkillDispatcher
from mesh._a2a.executor import MeshExecutor
from mesh._a2a.handler import MeshRequestHandler
from mesh._a2a.idempotency import IdempotencyKeys
from tests.support import clean_env, free_port, running
from tests.text_input_agents import calculator

pytestmark = pytest.mark.integration

_HEADERS = {"A2A-Version": "1.0"}


def _serve(tmp_path_factory: pytest.TempPathFactory, target: str) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp(target.rsplit(":", 1)[1])
    port = free_port()
    argv = ["mesh", "serve", target, "--port", str(port), "--data-dir", str(tmp / "data")]
    health = f"http://127.0.0.1:{port}/health"
    with running(argv, name=target, tmp=tmp, env=clean_env(), health=health):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, "tests.text_input_agents:calculator")


@pytest.fixture(scope="module")
def chat_desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, "tests.text_input_agents:desk")


def _message(parts: list[dict[str, Any]], skill: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": parts}
    if skill is not None:
        message["metadata"] = {"skill": skill}
    return message


def _text(value: Any) -> dict[str, Any]:
    return {"text": value if isinstance(value, str) else json.dumps(value)}


def _send(url: str, parts: list[dict[str, Any]], skill: str | None = None) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage"}
    body["params"] = {"message": _message(parts, skill)}
    r = httpx.post(url + "/", json=body, headers=_HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert "result" in answer, answer
    return dict(answer["result"]["task"])


def _state(task: dict[str, Any]) -> str:
    return str(task["status"]["state"]).removeprefix("TASK_STATE_").lower()


def _data(task: dict[str, Any]) -> dict[str, Any]:
    assert _state(task) == "completed", task
    for artifact in task["artifacts"]:
        for part in artifact["parts"]:
            if "data" in part:
                return dict(part["data"])
    raise AssertionError(f"no data part in {task['artifacts']}")


def _error(task: dict[str, Any]) -> str:
    assert _state(task) == "rejected", task
    return str(task["metadata"]["error"]["message"])


def test_a_json_object_in_text_reaches_the_only_typed_skill(chat_desk: str) -> None:
    task = _send(chat_desk, [_text({"symbol": "ACME", "amount": 4})])
    assert _data(task) == {"symbol": "ACME", "price": 10.0}
    assert task["metadata"]["skill"] == "quote"
    # Named in metadata, and in a Markdown fence, alike.
    fenced = _text('```json\n{"symbol": "ACME"}\n```')
    assert _data(_send(chat_desk, [fenced], skill="quote"))["price"] == 2.5
    # Text that is not a JSON object still goes to chat.
    task = _send(chat_desk, [_text("what is the price of ACME?")])
    assert _state(task) == "completed", task
    assert task["metadata"]["skill"] == "chat"
    said = [p["text"] for a in task["artifacts"] for p in a["parts"] if "text" in p]
    assert any("chat heard: what is the price of ACME?" in t for t in said), said


def test_an_invalid_object_is_rejected_naming_the_field(chat_desk: str, calc: str) -> None:
    missing = _error(_send(chat_desk, [_text({"amount": 3})]))
    assert "symbol" in missing, missing
    assert "missing" in missing, missing
    wrong = _error(_send(chat_desk, [_text({"symbol": "ACME", "amount": "lots"})]))
    assert "amount" in wrong, wrong
    # Named skill, text that is not an object: the rejection says what the skill takes.
    prose = _error(_send(calc, [_text("two plus three")], skill="add"))
    assert "JSON object" in prose, prose
    assert "add" in prose, prose


def test_several_typed_skills_the_one_whose_schema_matches(calc: str) -> None:
    task = _send(calc, [_text({"a": 2, "b": 3})])
    assert _data(task) == {"total": 5}
    assert task["metadata"]["skill"] == "add"
    # The same object, two skills: metadata decides.
    assert _data(_send(calc, [_text({"text": "Hi"})], skill="lower")) == {"text": "hi"}


def test_ambiguous_and_unmatched_objects_are_rejected_naming_the_candidates(calc: str) -> None:
    both = _error(_send(calc, [_text({"text": "Hi"})]))
    assert "upper" in both, both
    assert "lower" in both, both
    assert "add" not in both, both
    assert "metadata field 'skill'" in both
    none = _error(_send(calc, [_text({"c": 1})]))
    for name in ("add", "upper", "lower"):
        assert name in none, none
    assert "field 'a'" in none, none
    assert "field 'text'" in none, none


def test_adk_wrapped_json_and_adk_context_parts(calc: str) -> None:
    wrapped = "<a2a_datapart_json>" + json.dumps({"a": 1, "b": 1}) + "</a2a_datapart_json>"
    # ADK's inline_data blob (text/plain) as a raw part, and the same wrapping in text.
    raw = {"raw": base64.b64encode(wrapped.encode()).decode(), "mediaType": "text/plain"}
    assert _data(_send(calc, [raw])) == {"total": 2}
    assert _data(_send(calc, [_text(wrapped)])) == {"total": 2}
    # ADK reached by transfer: context parts, and the user's turns flagged; the last is the
    # request.
    user = {"is_user_input": True}
    parts = [
        {**_text("hello"), "metadata": user},
        _text('For context: [other-agent] said: {"a": 9}'),
        {**_text({"a": 20, "b": 22}), "metadata": user},
    ]
    assert _data(_send(calc, parts)) == {"total": 42}
    # Without ADK's flags, two text parts are not one object.
    two = _error(_send(calc, [_text("hello"), _text({"a": 1, "b": 2})]))
    assert "2 text parts" in two, two


def _params(parts: list[dict[str, Any]], skill: str | None = None) -> SendMessageRequest:
    params = SendMessageRequest()
    ParseDict({"message": _message(parts, skill)}, params)
    return params


async def test_text_json_blocking_sends_take_the_fast_path() -> None:
    handler = MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(calculator)),
        task_store=InMemoryTaskStore(),
        agent_card=build_card(calculator, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
    )
    try:
        fast = handler.fastpath
        assert fast is not None
        assert fast.takes(_params([_text({"a": 1, "b": 2})]))
        assert fast.takes(_params([_text({"text": "x"})], skill="upper"))
        assert not fast.takes(_params([_text({"text": "x"})]))  # ambiguous: rejected by the SDK
        answer = await handler.on_message_send(
            _params([_text({"a": 1, "b": 2})]), ServerCallContext()
        )
        assert isinstance(answer, Task)
        assert get_data_parts(list(answer.artifacts[0].parts))[0]["total"] == 3
    finally:
        await handler.aclose()
