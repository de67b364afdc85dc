"""The fast path answers an LLM agent's turn exactly like the SDK path (mesh._a2a.fastpath).

Two real nodes serve tests.llm_ask_agents (scripted model, offline), one with
``MESH_FASTPATH=0``. The same JSON-RPC requests go to both: a chat turn, a typed ``llm_skill``
(answered, and rejected for its input), a turn whose tool asks (INPUT_REQUIRED) and its answer
(a message naming the task: the SDK's handler resumes it on both nodes), and the session the
turns share. Responses, stored tasks and the session's effect must be equal, modulo the ids and
times each node generates; the fast node must have answered the new sends itself.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import eventually
from tests.test_node_fastpath import HEADERS, TRACE, Pair, _norm, fast_and_sdk

pytestmark = pytest.mark.integration

_QUESTION = re.compile(r"q-[0-9a-f]{8}")


def _n(value: Any) -> Any:
    """``_norm``, and the question ids each node draws."""
    return json.loads(_QUESTION.sub("q-<id>", json.dumps(_norm(value))))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """The LLM agent twice: "fast" (the default) and "sdk" (MESH_FASTPATH=0)."""
    tmp = tmp_path_factory.mktemp("fastpath-llm")
    with fast_and_sdk(
        tmp, "tests.llm_ask_agents:agent", file_var="NODE_TEST_CALLS", suffix=".calls"
    ) as served:
        yield served


def _send(part: dict[str, Any], *, context: str, task_id: str = "", skill: str = "") -> Any:
    message: dict[str, Any] = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "contextId": context,
        "parts": [part],
    }
    if task_id:
        message["taskId"] = task_id
    # A trace of the caller's: the one a node would start is random.
    message["metadata"] = {"traceparent": TRACE, **({"skill": skill} if skill else {})}
    return {"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": message}}


async def _post(http: httpx.AsyncClient, url: str, body: Any) -> dict[str, Any]:
    reply = await http.post(url + "/", json=body, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def _same(http: httpx.AsyncClient, pair: Pair, body: Any) -> tuple[Any, Any]:
    """``body`` sent to both nodes; their tasks, equal modulo ids and times."""
    fast = await _post(http, pair.fast, body)
    sdk = await _post(http, pair.sdk, body)
    assert _n(fast) == _n(sdk)
    assert list(fast) == list(sdk)  # the wire shape, key order included
    return fast["result"]["task"], sdk["result"]["task"]


async def _stored(http: httpx.AsyncClient, url: str, task_id: str) -> Any:
    body = {"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {"id": task_id}}
    return (await _post(http, url, body))["result"]


def _fast_sends(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "mesh_fastpath_sends":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


async def test_llm_turns_are_the_same_on_both_paths_and_take_the_fast_one(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    context = "ctx-llm-" + uuid.uuid4().hex[:8]
    # A chat turn, and a typed llm_skill answered and rejected.
    hello, _ = await _same(http, pair, _send({"text": "hello"}, context=context))
    assert hello["status"]["state"] == "TASK_STATE_COMPLETED"
    small = {"data": {"applicant_id": "APP-2", "amount": 100}}
    done, _ = await _same(http, pair, _send(small, context=context + "-p", skill="payout"))
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    bad = {"data": {"applicant_id": "APP-2"}}
    rejected, _ = await _same(http, pair, _send(bad, context=context + "-r", skill="payout"))
    assert rejected["status"]["state"] == "TASK_STATE_REJECTED"

    # A turn whose tool asks waits the same way; the answer resumes it the same way.
    fast, sdk = await _same(http, pair, _send({"text": "pay APP-1 80,000"}, context=context))
    assert fast["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    answer = _send({"data": {"decision": "approve", "note": "ok"}}, context=context, task_id="-")
    ended = []
    for url, task in ((pair.fast, fast), (pair.sdk, sdk)):
        answer["params"]["message"]["taskId"] = task["id"]  # the same message otherwise
        ended.append(await _post(http, url, answer))
    assert _n(ended[0]) == _n(ended[1])
    assert ended[0]["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    stored = [await _stored(http, pair.fast, fast["id"]), await _stored(http, pair.sdk, sdk["id"])]
    assert _n(stored[0]) == _n(stored[1])
    assert stored[0]["artifacts"][-1]["parts"][0]["text"] == "Ann Lee: approve (ok); lookups 1"

    # The session the turns share: the next turn sees its state on both.
    again, _ = await _same(http, pair, _send({"text": "pay APP-1 10"}, context=context))
    assert (
        again["artifacts"][-1]["parts"][0]["text"] == "Ann Lee: approve (small amount); lookups 2"
    )

    # The fast node answered the five new sends itself; the other sent all to the SDK.
    metrics = [(await http.get(url + "/metrics")).text for url in (pair.fast, pair.sdk)]
    assert _fast_sends(metrics[0]) == 5
    assert _fast_sends(metrics[1]) == 0


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """tests.llm_gate_agents twice, fast and sdk; each turn waits for ``<name>.go``."""
    tmp = tmp_path_factory.mktemp("fastpath-gate")
    with fast_and_sdk(
        tmp, "tests.llm_gate_agents:agent", file_var="NODE_TEST_GATE", suffix=".go"
    ) as served:
        yield served


async def _working_task(http: httpx.AsyncClient, url: str, context: str) -> str:
    """The id of the one task of ``context``, once it is WORKING."""
    body = {"jsonrpc": "2.0", "id": 5, "method": "ListTasks", "params": {"contextId": context}}

    async def working() -> str | None:
        tasks = (await _post(http, url, body))["result"].get("tasks", [])
        if tasks and tasks[0]["status"]["state"] == "TASK_STATE_WORKING":
            return str(tasks[0]["id"])
        return None

    found: str = await eventually(working, within=10, what=f"a working task in {context} at {url}")
    return found


async def _follow(http: httpx.AsyncClient, url: str, task_id: str, gate: Path) -> list[Any]:
    """Subscribe to the running task, open its gate after the first event, and read the
    stream to its end: each event's kind and state."""
    body = {"jsonrpc": "2.0", "id": 6, "method": "SubscribeToTask", "params": {"id": task_id}}
    headers = {**HEADERS, "Accept": "text/event-stream"}
    seen: list[Any] = []
    async with asyncio.timeout(15):  # a subscription that never ends fails here
        async with http.stream("POST", url + "/", json=body, headers=headers) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if not line.startswith("data:"):
                    continue
                result = json.loads(line[5:])["result"]
                ((kind, event),) = result.items()
                state = (event.get("status") or {}).get("state")
                seen.append((kind, state))
                gate.touch()  # noqa: ASYNC240 - one file, a test
    return seen


async def test_a_subscriber_follows_a_running_turn_to_its_end_on_both_paths(
    gated: Pair, http: httpx.AsyncClient
) -> None:
    followed = []
    for name, url in (("fast", gated.fast), ("sdk", gated.sdk)):
        context = f"ctx-gate-{name}"
        sent = asyncio.create_task(_post(http, url, _send({"text": "wait"}, context=context)))
        try:
            task_id = await _working_task(http, url, context)
            followed.append(await _follow(http, url, task_id, gated.tmp / f"{name}.go"))
        finally:
            answer = await sent
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert answer["result"]["task"]["artifacts"][-1]["parts"][0]["text"] == "released true"
    assert followed[0] == followed[1]
    assert followed[0][0] == ("task", "TASK_STATE_WORKING")
    assert followed[0][-1] == ("statusUpdate", "TASK_STATE_COMPLETED")
