"""An LLM turn streams only while someone reads it (issue 19 item 1; mesh._a2a.dispatcher).

A real node serves tests.llm_stream_agents, whose scripted model writes down, per context,
whether each call was asked to stream or to answer whole. On both paths (the fast path and
``MESH_FASTPATH=0``):

* a blocking send nobody follows asks for whole answers, and its task holds only the answer;
* a streamed send streams every model call: the answer's text comes as chunks first;
* a follower arriving mid-turn (``SubscribeToTask`` while the turn's tool runs) gets, from then
  on, the answer's chunks of the next model call (streamed because it follows), the whole
  answer as the artifact's last chunk, and COMPLETED; the blocking caller gets the same task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import clean_env, eventually, free_port, running
from tests.test_node_fastpath import HEADERS

pytestmark = pytest.mark.integration

SSE = {**HEADERS, "Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The agent twice, "fast" (the default) and "sdk" (MESH_FASTPATH=0), sharing one dir
    for the model's records and the gates (context ids are unique per test)."""
    tmp = tmp_path_factory.mktemp("llm-stream")
    urls = {}
    with contextlib.ExitStack() as stack:
        for name, flag in (("fast", "1"), ("sdk", "0")):
            port = free_port()
            argv = ["mesh", "serve", "tests.llm_stream_agents:agent", "--port", str(port)]
            argv += ["--data-dir", str(tmp / name)]
            env = clean_env(MESH_FASTPATH=flag, NODE_TEST_DIR=str(tmp))
            health = f"http://127.0.0.1:{port}/health"
            stack.enter_context(running(argv, name=name, tmp=tmp, env=env, health=health))
            urls[name] = f"http://127.0.0.1:{port}"
        yield tmp, urls


def _send(text: str, context: str, method: str = "SendMessage") -> dict[str, Any]:
    message = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "contextId": context,
        "parts": [{"text": text}],
    }
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": message}}


async def _post(http: httpx.AsyncClient, url: str, body: Any) -> dict[str, Any]:
    reply = await http.post(url + "/", json=body, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    return dict(reply.json()["result"])


async def _events(
    http: httpx.AsyncClient, url: str, body: Any, gate: Path | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The SSE stream of ``body`` to its end: each result's kind and event (opening ``gate``
    once the first event came)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    async with asyncio.timeout(20):  # a stream that never ends fails here
        async with http.stream("POST", url + "/", json=body, headers=SSE) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if line.startswith("data:"):
                    ((kind, event),) = json.loads(line[5:])["result"].items()
                    seen.append((kind, event))
                    if gate is not None:
                        gate.touch()  # noqa: ASYNC240 - one file, a test
    return seen


def _calls(tmp: Path, context: str) -> list[str]:
    return (tmp / f"{context}.calls").read_text().split()


def _answer_chunks(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [
        e["artifact"]["parts"][0]["text"]
        for kind, e in events
        if kind == "artifactUpdate" and not e.get("lastChunk")
    ]


def _last_artifact(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return next(e for kind, e in reversed(events) if kind == "artifactUpdate" and e["lastChunk"])


@pytest.mark.parametrize("path", ["fast", "sdk"])
async def test_a_blocking_turn_nobody_follows_asks_for_whole_answers(
    nodes: tuple[Path, dict[str, str]], http: httpx.AsyncClient, path: str
) -> None:
    tmp, urls = nodes
    context = f"ctx-whole-{path}-{uuid.uuid4().hex[:6]}"
    (tmp / f"{context}.go").touch()  # the tool does not wait
    task = (await _post(http, urls[path], _send("wait for it", context)))["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][-1]["parts"][0]["text"] == "released true after the gate"
    # Two model calls (the tool call, the answer), neither streamed.
    assert _calls(tmp, context) == ["generate", "generate"]


@pytest.mark.parametrize("path", ["fast", "sdk"])
async def test_a_streamed_send_streams_every_model_call(
    nodes: tuple[Path, dict[str, str]], http: httpx.AsyncClient, path: str
) -> None:
    tmp, urls = nodes
    context = f"ctx-stream-{path}-{uuid.uuid4().hex[:6]}"
    text = "one two three four five six"
    events = await _events(http, urls[path], _send(text, context, "SendStreamingMessage"))
    assert _calls(tmp, context) == ["stream"]
    chunks = _answer_chunks(events)
    assert len(chunks) == 3
    assert "".join(chunks) == text
    assert _last_artifact(events)["artifact"]["parts"][0]["text"] == text
    assert events[-1][1]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.mark.parametrize("path", ["fast", "sdk"])
async def test_a_follower_arriving_mid_turn_gets_the_rest_streamed(
    nodes: tuple[Path, dict[str, str]], http: httpx.AsyncClient, path: str
) -> None:
    tmp, urls = nodes
    url = urls[path]
    context = f"ctx-follow-{path}-{uuid.uuid4().hex[:6]}"
    sent = asyncio.create_task(_post(http, url, _send("wait please", context)))
    try:
        task_id = await _working_task(http, url, context)
        subscribe = {"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask"}
        subscribe["params"] = {"id": task_id}
        followed = await _events(http, url, subscribe, gate=tmp / f"{context}.go")
    finally:
        answer = (await sent)["task"]
    # The tool call was asked before anyone followed; the answer after, while followed.
    assert _calls(tmp, context) == ["generate", "stream"]
    assert followed[0][0] == "task"
    assert followed[0][1]["status"]["state"] == "TASK_STATE_WORKING"
    assert _answer_chunks(followed) == ["released true ", "after the ", "gate"]
    last = _last_artifact(followed)
    assert last["artifact"]["parts"][0]["text"] == "released true after the gate"
    assert followed[-1][0] == "statusUpdate"
    assert followed[-1][1]["status"]["state"] == "TASK_STATE_COMPLETED"
    # The blocking caller's task: COMPLETED, the whole answer (the chunks replaced).
    assert answer["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [a["parts"][0]["text"] for a in answer["artifacts"]] == ["released true after the gate"]


async def _working_task(http: httpx.AsyncClient, url: str, context: str) -> str:
    """The id of the one task of ``context``, once it is WORKING."""
    body = {"jsonrpc": "2.0", "id": 5, "method": "ListTasks", "params": {"contextId": context}}

    async def working() -> str | None:
        tasks = (await _post(http, url, body)).get("tasks", [])
        if tasks and tasks[0]["status"]["state"] == "TASK_STATE_WORKING":
            return str(tasks[0]["id"])
        return None

    found: str = await eventually(working, within=10, what=f"a working task in {context} at {url}")
    return found
