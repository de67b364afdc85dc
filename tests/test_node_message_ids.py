"""A repeated ``messageId``: the same message again replays its task; the id reused for another
task or context is a JSON-RPC error naming the task the id belongs to (never that task as the
answer to another conversation). On the fast path (a blocking typed send) and the SDK's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import Proc, clean_env, free_port, running

pytestmark = pytest.mark.integration

_HEADERS = {"A2A-Version": "1.0"}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ids")
    port = free_port()
    env = clean_env(NODE_TEST_CALLS=str(tmp / "calls.txt"))
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data")]
    health = f"http://127.0.0.1:{port}/health"
    with running(argv, name="ids-worker", tmp=tmp, env=env, health=health) as proc:
        assert isinstance(proc, Proc)
        yield f"http://127.0.0.1:{port}"


def _message(message_id: str, key: str, **ids: str) -> dict[str, Any]:
    return {
        "role": "ROLE_USER",
        "messageId": message_id,
        "parts": [{"data": {"key": key}}],
        "metadata": {"skill": "echo"},
        **ids,
    }


def _send(url: str, message: dict[str, Any], **config: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"message": message}
    if config:
        params["configuration"] = config
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    r = httpx.post(url + "/", json=body, headers=_HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _stream_first(url: str, message: dict[str, Any]) -> dict[str, Any]:
    """The first event of a stream, or the error answered instead of one (plain JSON)."""
    body = {"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage"}
    body["params"] = {"message": message}
    with httpx.stream("POST", url + "/", json=body, headers=_HEADERS, timeout=30) as r:
        if r.headers["content-type"].startswith("application/json"):
            return dict(json.loads(r.read()))
        for line in r.iter_lines():
            if line.startswith("data:"):
                return dict(json.loads(line.removeprefix("data:")))
    raise AssertionError("the stream ended without an event")


def _task(answer: dict[str, Any]) -> dict[str, Any]:
    assert "result" in answer, answer
    return dict(answer["result"]["task"])


def _assert_names(answer: dict[str, Any], task: dict[str, Any], message_id: str) -> None:
    assert "error" in answer, answer
    error = answer["error"]
    assert error["code"] == -32602, error
    assert task["id"] in error["message"]
    assert message_id in error["message"]


@pytest.mark.parametrize("return_immediately", [False, True], ids=["fastpath", "sdk"])
def test_message_id_reused_for_another_context_or_task_is_an_error(
    worker: str, return_immediately: bool
) -> None:
    message_id = f"m-{uuid.uuid4().hex}"
    key = uuid.uuid4().hex
    config = {"returnImmediately": True} if return_immediately else {}
    first = _task(_send(worker, _message(message_id, key), **config))
    other = f"ctx-{uuid.uuid4().hex}"

    # Blocking (the fast path's way in when the task is new) and streamed, both refused.
    _assert_names(_send(worker, _message(message_id, key, contextId=other)), first, message_id)
    _assert_names(_send(worker, _message(message_id, key, taskId="t-other")), first, message_id)
    streamed = _stream_first(worker, _message(message_id, key, contextId=other))
    _assert_names(streamed, first, message_id)

    # The same message again (no ids, or the task's own): its task, as before.
    again = _task(_send(worker, _message(message_id, key)))
    assert again["id"] == first["id"]
    same = _task(_send(worker, _message(message_id, key, contextId=first["contextId"])))
    assert same["id"] == first["id"]
    streamed = _stream_first(worker, _message(message_id, key, contextId=first["contextId"]))
    assert "result" in streamed, streamed
    assert streamed["result"]["task"]["id"] == first["id"]


@pytest.fixture(scope="module")
def asker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ids-ask")
    port = free_port()
    argv = ["mesh", "serve", "tests.ask_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data")]
    health = f"http://127.0.0.1:{port}/health"
    with running(argv, name="ids-asker", tmp=tmp, env=clean_env(), health=health):
        yield f"http://127.0.0.1:{port}"


def test_the_id_of_an_answer_reused_for_a_new_message_is_an_error(asker: str) -> None:
    start = {
        "role": "ROLE_USER",
        "messageId": f"m-{uuid.uuid4().hex}",
        "parts": [{"data": {"applicant_id": "APP-9", "amount": 1000}}],
        "metadata": {"skill": "review"},
    }
    task = _task(_send(asker, start))
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task
    answer_id = f"m-{uuid.uuid4().hex}"
    answer = {
        "role": "ROLE_USER",
        "messageId": answer_id,
        "taskId": task["id"],
        "contextId": task["contextId"],
        "parts": [{"data": {"decision": "approve"}}],
    }
    asked_again = _task(_send(asker, answer))
    assert asked_again["id"] == task["id"]
    assert asked_again["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", asked_again

    # The answer's id on a new message (no taskId): not a retry of the answer.
    reused = {**start, "messageId": answer_id}
    _assert_names(_send(asker, reused), task, answer_id)
    # The answer itself again: its task, as before.
    assert _task(_send(asker, answer))["id"] == task["id"]
