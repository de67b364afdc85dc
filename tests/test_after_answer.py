"""What the answer does not need is done after it is sent (``mesh._a2a.after_answer``).

On the fast route (JSON-RPC and REST) the task's log line, its metrics and its count in flight
are handed to the request's ``AfterAnswer`` and done right after the answer's body is sent: at
the moment the body goes out none of them is there yet, and once the route returns every one
is, on a success, a skill's failure, a JSON-RPC error and a cancelled request alike. One that
raises is logged and costs neither the answer nor the others. Without a route that runs them
(the SDK's handler called directly) they are done at once, as before.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import SendMessageRequest
from google.protobuf.json_format import ParseDict
from prometheus_client import CollectorRegistry

from mesh._a2a.after_answer import AFTER_ANSWER, AfterAnswer, later
from mesh._a2a.server import A2AService
from mesh._agent import Agent
from mesh._metrics import NodeMetrics
from mesh._sqlite import Database
from tests.artifact_agents import desk
from tests.node_agents import agent as worker_agent
from tests.support import eventually

HEADERS = [(b"content-type", b"application/json"), (b"a2a-version", b"1.0")]


# -- AfterAnswer itself ------------------------------------------------------------------------
def test_the_calls_run_once_in_order_and_one_that_raises_stops_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    after = AfterAnswer()
    done: list[str] = []

    def broken() -> None:
        raise RuntimeError("the metrics broke")

    def adds_more() -> None:
        done.append("second")
        after.append(functools.partial(done.append, "added while running"))

    after.append(functools.partial(done.append, "first"))
    after.append(broken)
    after.append(adds_more)
    with caplog.at_level(logging.ERROR, logger="mesh._a2a"):
        after.run()
    assert done == ["first", "second", "added while running"]
    (record,) = [r for r in caplog.records if "after an answer" in r.getMessage()]
    assert "broken" in record.getMessage()  # the call, named
    assert record.exc_info is not None
    assert "the metrics broke" in str(record.exc_info[1])
    after.run()  # each call once
    assert done == ["first", "second", "added while running"]


def test_later_is_the_calls_after_answer_only_when_a_route_put_one_there() -> None:
    assert later(None) is None
    assert later(ServerCallContext()) is None
    assert later(ServerCallContext(state={AFTER_ANSWER: "not one"})) is None
    after = AfterAnswer()
    assert later(ServerCallContext(state={AFTER_ANSWER: after})) is after


# -- through the fast route --------------------------------------------------------------------
class Node:
    """An in-process service with its metrics, and what it had done when each body was sent."""

    def __init__(self, service: A2AService, metrics: NodeMetrics) -> None:
        self.service = service
        self.metrics = metrics
        self.lines: list[str] = []
        self.at_send: list[dict[str, Any]] = []

    def seen(self) -> dict[str, Any]:
        """What the answer's deferred work leaves: task lines, tasks counted, tasks running."""
        tasks = sum(
            s.value
            for family in self.metrics.registry.collect()
            if family.name == "mesh_tasks"
            for s in family.samples
            if s.name == "mesh_tasks_total"
        )
        return {
            "lines": len(self.lines),
            "tasks": tasks,
            "in_flight": self.service.in_flight,
            "running gauge": self.metrics._tasks_running(),
        }

    async def send(self, message: dict[str, Any], sent: list[dict[str, Any]]) -> None:
        if message["type"] == "http.response.body":
            self.at_send.append(self.seen())
        sent.append(message)

    async def rpc(self, data: dict[str, Any], skill: str) -> dict[str, Any]:
        sent: list[dict[str, Any]] = []
        route = self.service.fastroute
        assert route is not None
        scope = {"type": "http", "method": "POST", "path": "/", "headers": HEADERS}
        answered = await route.serve(
            _body(data, skill), scope, _no_receive, lambda m: self.send(m, sent)
        )
        assert answered, "the fast route took it"
        return json.loads(sent[-1]["body"])

    async def rest(self, data: dict[str, Any], skill: str) -> tuple[int, dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        route = self.service.fastroute
        assert route is not None
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/a2a/rest/message:send",
            "headers": HEADERS,
        }
        params = _body(data, skill)["params"]
        answered = await route.serve_rest(params, scope, _no_receive, lambda m: self.send(m, sent))
        assert answered, "the fast route took it"
        return sent[0]["status"], json.loads(sent[-1]["body"])


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("task agent=", "message agent=")):
            self.lines.append(message)


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def _body(data: dict[str, Any], skill: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": f"m-{id(data)}-{skill}-{asyncio.get_running_loop().time()}",
                "parts": [{"data": data}],
                "metadata": {"skill": skill},
            }
        },
    }


async def _node(tmp_path: Path, agent: Agent) -> AsyncIterator[Node]:
    db = await Database.open(tmp_path / f"{agent.name}.db")
    metrics = NodeMetrics(CollectorRegistry(), agent.name, skills=[s.id for s in agent.all_skills])
    service = await A2AService.create(agent, url="http://127.0.0.1:1", db=db, metrics=metrics)
    node = Node(service, metrics)
    handler = _Lines(node.lines)
    task_log = logging.getLogger("mesh.task")
    task_log.addHandler(handler)
    level = task_log.level
    task_log.setLevel(logging.INFO)
    try:
        yield node
    finally:
        task_log.removeHandler(handler)
        task_log.setLevel(level)
        await service.aclose()
        await db.aclose()


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[Node]:
    async for node in _node(tmp_path, worker_agent):
        yield node


@pytest.fixture
async def replier(tmp_path: Path) -> AsyncIterator[Node]:
    async for node in _node(tmp_path, desk):
        yield node


NOTHING_YET = {"lines": 0, "tasks": 0, "in_flight": 1, "running gauge": 1}
ALL_DONE = {"lines": 1, "tasks": 1, "in_flight": 0, "running gauge": 0}


async def test_a_completed_tasks_line_and_metrics_come_after_its_answer(worker: Node) -> None:
    answer = await worker.rpc({"key": "k", "n": 2}, "echo")
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert worker.at_send == [NOTHING_YET]
    assert worker.seen() == ALL_DONE
    assert "skill=echo" in worker.lines[0]
    assert "outcome=completed" in worker.lines[0]


async def test_a_failed_skills_line_and_metrics_come_after_its_answer(worker: Node) -> None:
    answer = await worker.rpc({"key": "k"}, "broken")
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_FAILED"
    assert worker.at_send == [NOTHING_YET]
    assert worker.seen() == ALL_DONE
    assert "outcome=failed" in worker.lines[0]


async def test_a_json_rpc_errors_line_and_metrics_come_after_it(replier: Node) -> None:
    # A direct reply whose skill raises: no task, the JSON-RPC error -32603 is the answer.
    answer = await replier.rpc({"a": 13, "b": 1}, "add")
    assert answer["error"]["code"] == -32603, answer
    assert replier.at_send == [NOTHING_YET]
    assert replier.seen() == ALL_DONE
    assert replier.lines[0].startswith("message agent=artifact-desk skill=add outcome=failed")


async def test_a_direct_replys_line_comes_after_it(replier: Node) -> None:
    answer = await replier.rpc({"a": 2, "b": 3}, "add")
    assert answer["result"]["message"]["parts"][0]["data"] == {"sum": 5}
    assert replier.at_send == [NOTHING_YET]
    assert replier.seen() == ALL_DONE


async def test_on_rest_the_line_and_metrics_come_after_the_answer(worker: Node) -> None:
    status, answer = await worker.rest({"key": "k", "n": 1}, "echo")
    assert status == 200
    assert answer["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    status, answer = await worker.rest({"key": "k"}, "broken")
    assert answer["task"]["status"]["state"] == "TASK_STATE_FAILED"
    assert worker.at_send == [
        NOTHING_YET,
        {"lines": 1, "tasks": 1, "in_flight": 1, "running gauge": 1},
    ]
    assert worker.seen() == {"lines": 2, "tasks": 2, "in_flight": 0, "running gauge": 0}


async def test_a_cancelled_request_still_does_its_work(worker: Node) -> None:
    """A request cancelled mid-run (its connection gone) sends no answer; its task's line
    and metrics are still written as it ends."""
    serving = asyncio.ensure_future(worker.rpc({"seconds": 30}, "slow"))
    await eventually(lambda: worker.service.in_flight == 1 or None, what="the slow task running")
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert worker.at_send == []
    assert worker.seen() == ALL_DONE
    assert "skill=slow" in worker.lines[0]
    assert "outcome=canceled" in worker.lines[0]


async def test_a_deferred_call_that_raises_costs_neither_the_answer_nor_the_rest(
    worker: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("the histogram broke")

    # The task's metrics raise: its line is still written, the next request still served.
    monkeypatch.setattr(worker.metrics, "task_done", broken)
    with caplog.at_level(logging.ERROR, logger="mesh._a2a"):
        answer = await worker.rpc({"key": "k", "n": 2}, "echo")
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    failed = [r.getMessage() for r in caplog.records if "after an answer" in r.getMessage()]
    assert failed == ["after an answer: MeshExecutor._finished failed"]
    assert worker.seen()["in_flight"] == 0
    assert len(worker.lines) == 1
    monkeypatch.undo()
    answer = await worker.rpc({"key": "k2", "n": 1}, "echo")
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert len(worker.lines) == 2


async def test_without_a_route_the_work_is_done_at_once(worker: Node) -> None:
    """The handler called directly (as the SDK's route calls it): nothing waits for a send."""
    params = SendMessageRequest()
    ParseDict(_body({"key": "k", "n": 1}, "echo")["params"], params)
    task = await worker.service.handler.on_message_send(params, ServerCallContext())
    assert task.status.state == 3  # TASK_STATE_COMPLETED
    assert worker.seen() == ALL_DONE


async def test_a_send_that_waits_does_not_hold_the_work_behind_it(worker: Node) -> None:
    """A caller that does not read (uvicorn's send waits for the transport to drain): the
    task's line, metrics and in-flight count do not wait for it (a drain would count the task
    as running for as long), the loop does them while the send waits."""
    route = worker.service.fastroute
    assert route is not None
    reading = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def slow_reader(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            worker.at_send.append(worker.seen())
            await reading.wait()
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": HEADERS}
    serving = asyncio.ensure_future(
        route.serve(_body({"key": "k", "n": 2}, "echo"), scope, _no_receive, slow_reader)
    )
    await eventually(lambda: worker.seen() == ALL_DONE, what="the work done while the send waits")
    assert not serving.done()
    assert worker.at_send == [NOTHING_YET]
    reading.set()
    assert await serving
    answer = json.loads(sent[-1]["body"])
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert worker.seen() == ALL_DONE
