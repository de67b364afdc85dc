"""A function skill's run in one shot (mesh._a2a.one_shot) answers and stores exactly what its
events did.

Two real nodes serve ``tests.one_shot_agents:agent``, one with ``MESH_FASTPATH=0`` (every task
through the a2a-sdk's handler and its events). Each way a run can end, at once or after the
loop ran (an answer, an attachment, a raise, a refusal of its own, a mesh error, output that
does not validate, input that does not), gets the same answer, the same stored task (GetTask)
and the same replay of its message id on both, modulo ids and timestamps; so do a duplicate
sent while the first runs, the listing, the metrics and the log lines. In process: a run that
ends at once saves its task once, a run that waits is found WORKING meanwhile.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import ListTasksRequest, Task, TaskState

from mesh._a2a.card import build_card
from mesh._a2a.dispatcher import SkillDispatcher
from mesh._a2a.executor import MeshExecutor
from mesh._a2a.handler import MeshRequestHandler
from mesh._a2a.idempotency import IdempotencyKeys
from tests.one_shot_agents import agent as one_shot_agent
from tests.support import eventually
from tests.test_node_fastpath import (
    HEADERS,
    Pair,
    _both,
    _norm,
    _params,
    _Recording,
    _samples,
    _send,
    fast_and_sdk,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("one-shot")
    with fast_and_sdk(
        tmp, "tests.one_shot_agents:agent", file_var="ONE_SHOT_CALLS", suffix=".calls"
    ) as served:
        yield served


async def _rpc(http: httpx.AsyncClient, url: str, method: str, params: Any) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return (await http.post(url + "/", json=body, headers=HEADERS)).json()


async def _same_everywhere(
    http: httpx.AsyncClient, pair: Pair, data: dict[str, Any], skill: str
) -> dict[str, Any]:
    """Send one message to both nodes, then its message id again, then GetTask its task: each
    the same on both, key order included."""
    mid = f"{skill}-{uuid.uuid4().hex}"
    fast, sdk = await _both(http, pair, _send(data, skill, message_id=mid))
    assert _norm(fast) == _norm(sdk)
    assert list(fast) == list(sdk)
    again_fast, again_sdk = await _both(http, pair, _send(data, skill, message_id=mid))
    assert _norm(again_fast) == _norm(fast)
    assert _norm(again_sdk) == _norm(sdk)
    stored = []
    for url, answer in ((pair.fast, fast), (pair.sdk, sdk)):
        task = answer["result"]["task"]
        got = await _rpc(http, url, "GetTask", {"id": task["id"]})
        stored.append(got["result"])
        assert {k: v for k, v in got["result"].items() if k != "history"} == {
            k: v for k, v in task.items() if k != "history"
        }
        assert got["result"]["history"][0]["messageId"] == mid
    assert _norm(stored[0]) == _norm(stored[1])
    assert list(stored[0]) == list(stored[1])
    result: dict[str, Any] = fast["result"]["task"]
    return result


@pytest.mark.parametrize(
    ("skill", "data", "state"),
    [
        ("quick", {"key": "q", "n": 2}, "TASK_STATE_COMPLETED"),
        ("napping", {"key": "n", "n": 3}, "TASK_STATE_COMPLETED"),
        ("attaching", {"key": "a"}, "TASK_STATE_COMPLETED"),
        ("raising", {"key": "r"}, "TASK_STATE_FAILED"),
        ("napping_raise", {"key": "nr"}, "TASK_STATE_FAILED"),
        ("refusing", {"key": "no"}, "TASK_STATE_REJECTED"),
        ("tool_failing", {"key": "t"}, "TASK_STATE_FAILED"),
        ("bad_output", {"key": "b"}, "TASK_STATE_FAILED"),
        ("quick", {"key": "q", "n": "many"}, "TASK_STATE_REJECTED"),
        ("quick", {"n": 1}, "TASK_STATE_REJECTED"),
    ],
)
async def test_every_ending_is_answered_and_stored_alike(
    pair: Pair, http: httpx.AsyncClient, skill: str, data: dict[str, Any], state: str
) -> None:
    task = await _same_everywhere(http, pair, data, skill)
    assert task["status"]["state"] == state
    if skill == "attaching":
        assert [a["name"] for a in task["artifacts"]] == ["note", "attaching"]
        assert task["artifacts"][0]["metadata"] == {"description": "a note"}
    if state == "TASK_STATE_FAILED":
        assert "secret" not in str(task)


async def test_a_duplicate_sent_while_it_runs_gets_its_task(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    answers = []
    key = f"dup-{uuid.uuid4().hex}"
    for name, url in (("fast", pair.fast), ("sdk", pair.sdk)):
        body = _send({"key": key, "seconds": 0.3}, "dozing", message_id=key)
        one, two = await asyncio.gather(
            http.post(url + "/", json=body, headers=HEADERS),
            http.post(url + "/", json=body, headers=HEADERS),
        )
        assert one.json() == two.json()
        assert one.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert pair.calls(name).count(f"dozing {key}\n") == 1
        answers.append(one.json())
    assert _norm(answers[0]) == _norm(answers[1])


async def test_listings_metrics_and_log_lines_are_the_same(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    # Runs last in this module: every request above went to both nodes alike.
    listing = {"contextId": "ctx-fastpath", "pageSize": 100}
    fast = await _rpc(http, pair.fast, "ListTasks", listing)
    sdk = await _rpc(http, pair.sdk, "ListTasks", listing)
    assert len(fast["result"]["tasks"]) >= 10
    assert _norm(fast) == _norm(sdk)
    metrics = [(await http.get(url + "/metrics")).text for url in (pair.fast, pair.sdk)]
    assert _samples(metrics[0]) == _samples(metrics[1])

    def lines(name: str) -> list[str]:
        return sorted(
            _norm(line.split("task agent=", 1)[1]).split(" duration_ms=")[0]
            for line in pair.log(name).read_text().splitlines()
            if "task agent=" in line
        )

    assert lines("fast") == lines("sdk")
    assert len(lines("fast")) >= 10


def _handler(store: _Recording) -> MeshRequestHandler:
    return MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(one_shot_agent)),
        task_store=store,
        agent_card=build_card(one_shot_agent, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
    )


@pytest.mark.parametrize(
    ("skill", "data", "state"),
    [
        ("quick", {"key": "q"}, TaskState.TASK_STATE_COMPLETED),
        ("attaching", {"key": "a"}, TaskState.TASK_STATE_COMPLETED),
        ("raising", {"key": "r"}, TaskState.TASK_STATE_FAILED),
        ("quick", {"key": "q", "n": "many"}, TaskState.TASK_STATE_REJECTED),
    ],
)
async def test_a_run_that_ends_at_once_saves_its_task_once(
    skill: str, data: dict[str, Any], state: TaskState
) -> None:
    store = _Recording(InMemoryTaskStore())
    handler = _handler(store)
    try:
        answer = await handler.on_message_send(_params(_send(data, skill)), ServerCallContext())
        assert isinstance(answer, Task)
        assert answer.status.state == state
        assert [s for s, _ in store.blocking] == [state]
        stored = await store.get(answer.id, ServerCallContext())
        assert stored is not None
        assert stored.status == answer.status
        assert list(stored.artifacts) == list(answer.artifacts)
    finally:
        await handler.aclose()


async def test_a_run_that_awaits_is_found_working_meanwhile() -> None:
    store = _Recording(InMemoryTaskStore())
    handler = _handler(store)
    try:
        sending = asyncio.ensure_future(
            handler.on_message_send(
                _params(_send({"key": "w", "seconds": 0.3}, "dozing")), ServerCallContext()
            )
        )
        await eventually(
            lambda: any(s == TaskState.TASK_STATE_WORKING for s, _ in store.blocking),
            what="the dozing task's WORKING state to be saved",
        )
        listed = await store.list(ListTasksRequest(), ServerCallContext())
        assert [t.status.message.parts[0].text for t in listed.tasks] == ["running skill 'dozing'"]
        assert handler.fastpath is not None
        assert handler.fastpath.runs(listed.tasks[0].id)
        done = await sending
        assert isinstance(done, Task)
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert [s for s, _ in store.blocking] == [
            TaskState.TASK_STATE_SUBMITTED,
            TaskState.TASK_STATE_WORKING,
            TaskState.TASK_STATE_COMPLETED,
        ]
    finally:
        await handler.aclose()
