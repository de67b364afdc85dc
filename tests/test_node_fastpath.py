"""The fast path (mesh._a2a.fastpath) answers exactly like the SDK path.

Two real nodes serve the same agent, one with ``MESH_FASTPATH=0`` (everything through the
a2a-sdk's DefaultRequestHandler). The same JSON-RPC requests go to both; the responses, the
stored tasks (GetTask, ListTasks), the idempotent replays and the metrics must be equal, modulo
the ids and timestamps each node generates. In-process tests check which requests the fast
path takes at all (the rest go to the SDK's handler untouched), that the SDK's rules on an
agent's events hold on both paths, and that the task store learns of blocking sends on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.helpers import new_text_part
from a2a.server.agent_execution import RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.routes import DefaultServerCallContextBuilder
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import (
    CancelTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import ParseDict
from prometheus_client.parser import text_string_to_metric_families
from starlette.authentication import AuthCredentials, SimpleUser
from starlette.requests import Request

from mesh._a2a.card import build_card
from mesh._a2a.dispatcher import SkillDispatcher
from mesh._a2a.executor import MeshExecutor
from mesh._a2a.fastroute import FastRoute
from mesh._a2a.handler import MeshRequestHandler
from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.server import A2AService
from mesh._a2a.store import BLOCKING_SEND
from mesh._sqlite import Database
from tests.node_agents import agent as worker_agent
from tests.support import clean_env, eventually, free_port, running, wait_for

TRACE = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
HEADERS = {"A2A-Version": "1.0"}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_MS = re.compile(r"duration_ms=[0-9.]+")

pytestmark = pytest.mark.integration


@dataclass
class Pair:
    fast: str
    sdk: str
    tmp: Path

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def calls(self, name: str) -> str:
        path = self.tmp / f"{name}.calls"
        return path.read_text() if path.exists() else ""


@contextlib.contextmanager
def fast_and_sdk(tmp: Path, target: str, *, file_var: str, suffix: str) -> Iterator[Pair]:
    """``target`` served twice: "fast" (MESH_FASTPATH=1) and "sdk" (MESH_FASTPATH=0), each with
    its own data dir and ``file_var`` set to ``tmp/<name><suffix>`` (the agent's file to write
    its calls to, or to wait on)."""
    urls = []
    with contextlib.ExitStack() as stack:
        for name, flag in (("fast", "1"), ("sdk", "0")):
            port = free_port()
            argv = ["mesh", "serve", target, "--port", str(port)]
            argv += ["--data-dir", str(tmp / name)]
            env = clean_env(MESH_FASTPATH=flag, **{file_var: str(tmp / f"{name}{suffix}")})
            health = f"http://127.0.0.1:{port}/health"
            stack.enter_context(running(argv, name=name, tmp=tmp, env=env, health=health))
            urls.append(f"http://127.0.0.1:{port}")
        yield Pair(urls[0], urls[1], tmp)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """The same agent twice: "fast" (the default) and "sdk" (MESH_FASTPATH=0)."""
    tmp = tmp_path_factory.mktemp("fastpath")
    with fast_and_sdk(
        tmp, "tests.node_agents:agent", file_var="NODE_TEST_CALLS", suffix=".calls"
    ) as served:
        yield served


def _send(
    data: Any,
    skill: str,
    *,
    message_id: str | None = None,
    config: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "message": {
            "role": "ROLE_USER",
            "messageId": message_id or uuid.uuid4().hex,
            "contextId": "ctx-fastpath",
            "parts": [{"data": data}],
            "metadata": {"skill": skill, "caller": "tester", "traceparent": TRACE, **(meta or {})},
        }
    }
    if config is not None:
        params["configuration"] = config
    return {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": params}


def _norm(value: Any) -> Any:
    """Ids and times each node generates, replaced by placeholders."""
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, str):
        return _TIME.sub("<time>", _UUID.sub("<uuid>", value))
    return value


async def _both(
    http: httpx.AsyncClient, pair: Pair, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    hdrs = HEADERS if headers is None else headers
    fast, sdk = await asyncio.gather(
        http.post(pair.fast + "/", json=body, headers=hdrs),
        http.post(pair.sdk + "/", json=body, headers=hdrs),
    )
    assert fast.status_code == sdk.status_code == 200, (fast.text, sdk.text)
    assert fast.headers["content-type"] == sdk.headers["content-type"]
    return dict(fast.json()), dict(sdk.json())


async def _same(
    http: httpx.AsyncClient, pair: Pair, body: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    fast, sdk = await _both(http, pair, body, **kw)
    assert _norm(fast) == _norm(sdk)
    # The wire shape, key order included.
    assert list(fast) == list(sdk)
    return fast


async def test_completed_task_is_the_same_on_both_paths(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    body = await _same(http, pair, _send({"key": "k1", "n": 3}, "echo"))
    task = body["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["data"] == {"key": "k1", "n": 3, "doubled": 6}
    assert task["metadata"]["caller"] == "tester"
    assert task["metadata"]["traceparent"] == TRACE
    # Without historyLength the answer does not echo the request (the caller has it).
    assert [m["role"] for m in task["history"]] == ["ROLE_AGENT"]  # the WORKING note


@pytest.mark.parametrize("length", [0, 1, 5])
async def test_history_length_is_applied_the_same(
    pair: Pair, http: httpx.AsyncClient, length: int
) -> None:
    body = await _same(http, pair, _send({"key": "h"}, "echo", config={"historyLength": length}))
    assert len(body["result"]["task"].get("history", [])) == min(length, 2)


async def test_rejections_and_failures_are_the_same(pair: Pair, http: httpx.AsyncClient) -> None:
    bad = await _same(http, pair, _send({"key": "x", "n": "many"}, "echo"))
    assert bad["result"]["task"]["status"]["state"] == "TASK_STATE_REJECTED"
    assert "field 'n'" in bad["result"]["task"]["metadata"]["error"]["message"]
    late = await _same(http, pair, _send({"key": "x"}, "echo", meta={"deadline": time.time() - 5}))
    assert late["result"]["task"]["metadata"]["error"]["reason"] == "deadline"
    failed = await _same(http, pair, _send({"key": "x"}, "broken"))
    assert failed["result"]["task"]["status"]["state"] == "TASK_STATE_FAILED"
    passing = await _same(
        http, pair, _send({"seconds": 5}, "slow", meta={"deadline": time.time() + 0.3})
    )
    assert passing["result"]["task"]["status"]["state"] == "TASK_STATE_FAILED"
    # Requests the fast path leaves to the SDK get the SDK's answer on both nodes.
    unknown = await _same(http, pair, _send({"key": "x"}, "nope"))
    assert unknown["result"]["task"]["status"]["state"] == "TASK_STATE_REJECTED"
    no_version = await _same(http, pair, _send({"key": "x"}, "echo"), headers={})
    assert "error" in no_version
    wrong_version = await _same(
        http, pair, _send({"key": "x"}, "echo"), headers={"A2A-Version": "2.0"}
    )
    assert "error" in wrong_version
    negative = await _same(http, pair, _send({"key": "x"}, "echo", config={"historyLength": -1}))
    assert "error" in negative


async def test_stored_tasks_and_replays_are_the_same(pair: Pair, http: httpx.AsyncClient) -> None:
    mid = f"dup-{uuid.uuid4().hex}"
    first = await _same(http, pair, _send({"key": "d"}, "echo", message_id=mid))
    again = await _same(http, pair, _send({"key": "d"}, "echo", message_id=mid))
    assert _norm(again) == _norm(first)
    for url in (pair.fast, pair.sdk):
        # Each node answered the duplicate with the task it started (the skill ran once).
        r1 = await http.post(
            url + "/", json=_send({"key": "d"}, "echo", message_id=mid), headers=HEADERS
        )
        task_id = r1.json()["result"]["task"]["id"]
        get = {"jsonrpc": "2.0", "id": 8, "method": "GetTask", "params": {"id": task_id}}
        stored = (await http.post(url + "/", json=get, headers=HEADERS)).json()["result"]
        answer = r1.json()["result"]["task"]
        assert {k: v for k, v in stored.items() if k != "history"} == {
            k: v for k, v in answer.items() if k != "history"
        }
        # The answer leaves out the caller's own message; the stored task has it first.
        assert stored["history"][0]["messageId"] == mid
        assert stored["history"][1:] == answer["history"]
    calls = {name: pair.calls(name).count("echo d\n") for name in ("fast", "sdk")}
    assert calls == {"fast": 1, "sdk": 1}
    listing = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "ListTasks",
        "params": {"contextId": "ctx-fastpath", "pageSize": 100},
    }
    fast, sdk = await _both(http, pair, listing)
    assert _norm(fast) == _norm(sdk)


async def test_a_duplicate_of_a_running_task_waits_for_it(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    mid = f"slow-{uuid.uuid4().hex}"
    body = _send({"seconds": 0.5}, "slow", message_id=mid)
    for url in (pair.fast, pair.sdk):
        one, two = await asyncio.gather(
            http.post(url + "/", json=body, headers=HEADERS),
            http.post(url + "/", json=body, headers=HEADERS),
        )
        assert one.json() == two.json()
        assert one.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_cancel_of_a_running_blocking_send_is_the_same(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    answers = []
    body = _send({"seconds": 20}, "slow")
    for name, url in (("fast", pair.fast), ("sdk", pair.sdk)):
        before = pair.calls(name).count("slow start ")
        sending = asyncio.ensure_future(http.post(url + "/", json=body, headers=HEADERS))
        await asyncio.to_thread(
            wait_for,
            lambda name=name, before=before: pair.calls(name).count("slow start ") > before,
            what="slow task to start",
        )
        task_id = pair.calls(name).split("slow start ")[-1].split()[0]
        cancel = {"jsonrpc": "2.0", "id": 3, "method": "CancelTask", "params": {"id": task_id}}
        canceled = (await http.post(url + "/", json=cancel, headers=HEADERS)).json()
        sent = (await sending).json()
        assert canceled["result"]["status"]["state"] == "TASK_STATE_CANCELED", canceled
        assert sent["result"]["task"]["status"]["state"] == "TASK_STATE_CANCELED"
        again = (await http.post(url + "/", json=cancel, headers=HEADERS)).json()
        assert "error" in again
        answers.append([canceled, sent, again])
        assert f"slow end {task_id}" not in pair.calls(name)
    assert _norm(answers[0]) == _norm(answers[1])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(("mesh_requests_total", "mesh_tasks_total", "mesh_tasks_in")):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_and_log_lines_are_the_same(pair: Pair, http: httpx.AsyncClient) -> None:
    # Runs last in this module: every request above went to both nodes alike.
    fast = (await http.get(pair.fast + "/metrics")).text
    sdk = (await http.get(pair.sdk + "/metrics")).text
    assert _samples(fast) == _samples(sdk)
    assert any(k[0] == "mesh_tasks_total" for k in _samples(fast))

    def lines(log: Path) -> list[str]:
        found = [
            _MS.sub("duration_ms=<ms>", _UUID.sub("<uuid>", line.split("task agent=", 1)[1]))
            for line in log.read_text().splitlines()
            if "task agent=" in line
        ]
        return sorted(found)

    assert lines(pair.log("fast")) == lines(pair.log("sdk"))
    assert lines(pair.log("fast"))


# -- in process: which requests the fast path takes, and the SDK's rules on both paths ------
@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[A2AService]:
    db = await Database.open(tmp_path / "node.db")
    svc = await A2AService.create(worker_agent, url="http://127.0.0.1:1", db=db)
    try:
        yield svc
    finally:
        await svc.aclose()
        await db.aclose()


def _params(body: dict[str, Any]) -> SendMessageRequest:
    """The params of a JSON-RPC ``SendMessage`` body as the SDK's route parses them."""
    params = SendMessageRequest()
    ParseDict(body["params"], params, ignore_unknown_fields=True)
    return params


async def test_only_new_blocking_function_sends_take_the_fast_path(service: A2AService) -> None:
    fast = service.handler.fastpath
    assert fast is not None
    assert fast.takes(_params(_send({"key": "x"}, "echo")))

    def variant(**change: Any) -> SendMessageRequest:
        body = _send({"key": "x"}, "echo")
        body["params"]["message"].update(change.pop("message", {}))
        body["params"].update(change)
        return _params(body)

    refused = {
        "follow-up": variant(message={"taskId": "t-1"}),
        "return immediately": variant(configuration={"returnImmediately": True}),
        "push config": variant(configuration={"taskPushNotificationConfig": {"url": "http://x"}}),
        "unknown skill": _params(_send({"key": "x"}, "nope")),
        "skill not a string": variant(message={"metadata": {"skill": 5}}),
    }
    for what, params in refused.items():
        assert not fast.takes(params), what


async def _refusal(params: SendMessageRequest, *, fastpath: bool) -> str:
    handler = MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(worker_agent)),
        task_store=InMemoryTaskStore(),
        agent_card=build_card(worker_agent, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
        fastpath=fastpath,
    )
    try:
        with pytest.raises(A2AError) as raised:
            await handler.on_message_send(params, ServerCallContext())
    finally:
        await handler.aclose()
    return f"{type(raised.value).__name__}: {raised.value}"


async def test_params_the_sdk_refuses_are_refused_alike_on_the_fast_path() -> None:
    negative = _params(_send({"key": "x"}, "echo", config={"historyLength": -1}))
    no_parts = _params(_send({"key": "x"}, "echo"))
    del no_parts.message.parts[:]
    for params in (negative, no_parts):
        fast = await _refusal(params, fastpath=True)
        assert fast == await _refusal(params, fastpath=False)
        assert fast.startswith("InvalidParamsError"), fast


async def test_a_fast_send_runs_outside_the_sdk_and_is_stored(service: A2AService) -> None:
    fast = service.handler.fastpath
    assert fast is not None
    sending = asyncio.ensure_future(
        service.handler.on_message_send(
            _params(_send({"seconds": 0.3}, "slow")), ServerCallContext()
        )
    )
    task_id = await eventually(lambda: next(iter(fast.running), None), what="a fast task")
    assert service.handler.task_store.running(task_id)
    task = await sending
    assert isinstance(task, Task)
    assert task.id == task_id
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    stored = await service.handler.task_store.get(task_id, ServerCallContext())
    assert stored is not None
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert stored.artifacts[0].parts[0].data.struct_value["seconds"] == 0.3
    assert not fast.running
    assert not service.handler.task_store.running(task_id)
    assert service.in_flight == 0


def _scope(version: str | None = "1.0") -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if version is not None:
        headers.append((b"a2a-version", version.encode()))
    return {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": headers,
        "query_string": b"",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "scheme": "http",
    }


async def _serve(route: FastRoute, body: dict[str, Any], version: str | None = "1.0") -> Any:
    """What ``route`` answers to ``body`` (None: it left the request to the SDK's route)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    if not await route.serve(body, _scope(version), receive, send):
        assert not sent
        return None
    return json.loads(sent[1]["body"])


async def test_the_fast_route_answers_what_the_fast_path_takes(service: A2AService) -> None:
    route = service.fastroute
    assert route is not None
    body = await _serve(route, _send({"key": "in", "n": 2}, "echo"))
    task = body["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["data"] == {"key": "in", "n": 2, "doubled": 4}
    stored = await service.handler.task_store.get(task["id"], ServerCallContext())
    assert stored is not None
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    # The SDK's version check, with the SDK's error (the two-node tests compare the bodies).
    for version in (None, "0.3", "2.0"):
        refused = await _serve(route, _send({"key": "v"}, "echo"), version)
        assert refused["error"]["code"] == -32009, version
    assert await _serve(route, _send({"key": "v"}, "echo"), "1.0.3") is not None
    ok = _send({"key": "x"}, "echo")
    elsewhere = {
        "streaming": {**ok, "method": "SendStreamingMessage"},
        "boolean id": {**ok, "id": True},
        "null id": {**ok, "id": None},
        "params not parsed": {**ok, "params": {"message": {"parts": "nope"}}},
        "follow-up": _send({"key": "x"}, "echo", meta={})
        | {"params": {"message": {"taskId": "t"}}},
        "unknown skill": _send({"key": "x"}, "nope"),
    }
    for what, other in elsewhere.items():
        assert await _serve(route, other) is None, what


class _RuleBreaker(MeshExecutor):
    """An executor that breaks one of the rules the SDK enforces on an agent's events."""

    def __init__(self, fault: str) -> None:
        super().__init__(SkillDispatcher(worker_agent))
        self.fault = fault

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = str(context.task_id), str(context.context_id)
        update = TaskStatusUpdateEvent(
            task_id=task_id,
            context_id=context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
        )
        if self.fault == "update before task":
            await event_queue.enqueue_event(update)
            return
        first = Task(
            id="another-task" if self.fault == "task of another id" else task_id,
            context_id=context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
            history=[context.message] if context.message is not None else [],
        )
        await event_queue.enqueue_event(first)
        if self.fault == "update of another task":
            update.task_id = "another-task"
        await event_queue.enqueue_event(update)
        if self.fault == "message in task mode":
            await event_queue.enqueue_event(
                Message(role=Role.ROLE_AGENT, message_id="m-1", parts=[new_text_part("hi")])
            )
        elif self.fault == "raises":
            raise RuntimeError("the agent broke")


async def _break_rule(fault: str, *, fastpath: bool) -> tuple[str, int | None]:
    """Send one message to an executor breaking ``fault``: the error the caller gets, and the
    state its task is stored in (None: no task)."""
    store = InMemoryTaskStore()
    handler = MeshRequestHandler(
        executor=_RuleBreaker(fault),
        task_store=store,
        agent_card=build_card(worker_agent, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
        fastpath=fastpath,
    )
    assert (handler.fastpath is not None) == fastpath
    params = _params(_send({"key": "r"}, "echo"))
    try:
        with pytest.raises(Exception) as raised:  # noqa: PT011 (each fault has its own error)
            await asyncio.wait_for(handler.on_message_send(params, ServerCallContext()), 10)
        listed = await store.list(ListTasksRequest(), ServerCallContext())
    finally:
        await handler.aclose()
    states = [t.status.state for t in listed.tasks]
    assert len(states) <= 1
    return type(raised.value).__name__, states[0] if states else None


@pytest.mark.parametrize(
    "fault",
    [
        "update before task",
        "message in task mode",
        "raises",
        "task of another id",
        "update of another task",
    ],
)
async def test_the_sdks_rules_on_agent_events_hold_on_both_paths(fault: str) -> None:
    fast = await _break_rule(fault, fastpath=True)
    sdk = await _break_rule(fault, fastpath=False)
    assert fast == sdk
    expected = {
        "update before task": ("InvalidAgentResponseError", None),
        "message in task mode": ("InvalidAgentResponseError", TaskState.TASK_STATE_FAILED),
        "raises": ("RuntimeError", TaskState.TASK_STATE_FAILED),
        "task of another id": ("InvalidParamsError", None),
        "update of another task": ("InvalidParamsError", TaskState.TASK_STATE_FAILED),
    }
    assert fast == expected[fault]


class _Recording(TaskStore):
    """A real store that notes, per save, whether its call context was a blocking send."""

    def __init__(self, inner: TaskStore) -> None:
        self.inner = inner
        self.blocking: list[tuple[int, bool]] = []

    async def save(self, task: Task, context: ServerCallContext) -> None:
        self.blocking.append((task.status.state, context.state.get(BLOCKING_SEND) is True))
        await self.inner.save(task, context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self.inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self.inner.delete(task_id, context)


@pytest.mark.parametrize("fastpath", [True, False], ids=["fast-path", "sdk-path"])
async def test_the_store_knows_a_blocking_send_on_both_paths(fastpath: bool) -> None:
    """The write-behind store skips the wait for a blocking send's first save: it must learn
    of it from the call context of every save, whichever path runs the task."""
    store = _Recording(InMemoryTaskStore())
    handler = MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(worker_agent)),
        task_store=store,
        agent_card=build_card(worker_agent, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
        fastpath=fastpath,
    )
    try:
        blocking = _params(_send({"key": "b"}, "echo"))
        await handler.on_message_send(blocking, ServerCallContext())
        sent, store.blocking = store.blocking, []
        assert sent
        assert all(flag for _, flag in sent), sent
        assert sent[-1][0] == TaskState.TASK_STATE_COMPLETED
        streamed = _params(_send({"key": "s"}, "echo"))
        async for _ in handler.on_message_send_stream(streamed, ServerCallContext()):
            pass
        assert store.blocking
        assert not any(flag for _, flag in store.blocking), store.blocking
    finally:
        await handler.aclose()


async def test_a_function_skill_that_settles_at_once_saves_its_task_once() -> None:
    """A run that settles without letting the loop run saves its task once, in its final
    form (mesh._a2a.one_shot), not once per event nor first and last; a run that waits has
    its WORKING state saved meanwhile, for GetTask and CancelTask to find."""
    store = _Recording(InMemoryTaskStore())
    handler = MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(worker_agent)),
        task_store=store,
        agent_card=build_card(worker_agent, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
    )
    try:
        answer = await handler.on_message_send(
            _params(_send({"key": "f"}, "echo")), ServerCallContext()
        )
        assert isinstance(answer, Task)
        assert [s for s, _ in store.blocking] == [TaskState.TASK_STATE_COMPLETED]
        stored = await store.get(answer.id, ServerCallContext())
        assert stored is not None
        assert [m.parts[0].text for m in stored.history[1:]] == ["running skill 'echo'"]
        assert len(stored.artifacts) == 1
        store.blocking = []
        sending = asyncio.ensure_future(
            handler.on_message_send(_params(_send({"seconds": 0.3}, "slow")), ServerCallContext())
        )
        await eventually(
            lambda: any(s == TaskState.TASK_STATE_WORKING for s, _ in store.blocking),
            what="the slow task's WORKING state to be saved",
        )
        listed = await store.list(ListTasksRequest(), ServerCallContext())
        running = [t for t in listed.tasks if t.status.state == TaskState.TASK_STATE_WORKING]
        assert [t.status.message.parts[0].text for t in running] == ["running skill 'slow'"]
        done = await sending
        assert isinstance(done, Task)
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        assert [s for s, _ in store.blocking][-1] == TaskState.TASK_STATE_COMPLETED
    finally:
        await handler.aclose()


class _SlowCancel(_Recording):
    """A real store whose CANCELED save waits for the test to let it through."""

    def __init__(self, inner: TaskStore) -> None:
        super().__init__(inner)
        self.canceling = asyncio.Event()
        self.release = asyncio.Event()
        self.reads = 0

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        self.reads += 1
        return await super().get(task_id, context)

    async def save(self, task: Task, context: ServerCallContext) -> None:
        if task.status.state == TaskState.TASK_STATE_CANCELED:
            self.canceling.set()
            await self.release.wait()
        await super().save(task, context)


@pytest.mark.parametrize("fastpath", [True, False], ids=["fast-path", "sdk-path"])
async def test_a_second_cancel_does_not_cut_the_first(fastpath: bool) -> None:
    """A CancelTask arriving while the first one writes CANCELED waits for that write: all
    three callers (sender, both cancels) get the CANCELED task."""
    store = _SlowCancel(InMemoryTaskStore())
    handler = MeshRequestHandler(
        executor=MeshExecutor(SkillDispatcher(worker_agent)),
        task_store=store,
        agent_card=build_card(worker_agent, "http://127.0.0.1:1"),
        keys=IdempotencyKeys(None),
        fastpath=fastpath,
    )
    try:
        sending = asyncio.ensure_future(
            handler.on_message_send(_params(_send({"seconds": 20}, "slow")), ServerCallContext())
        )
        await eventually(
            lambda: any(s == TaskState.TASK_STATE_WORKING for s, _ in store.blocking),
            what="the slow task to run",
        )
        listed = await store.list(ListTasksRequest(), ServerCallContext())
        cancel = CancelTaskRequest(id=listed.tasks[0].id)
        first = asyncio.ensure_future(handler.on_cancel_task(cancel, ServerCallContext()))
        await asyncio.wait_for(store.canceling.wait(), 10)
        reads = store.reads
        second = asyncio.ensure_future(handler.on_cancel_task(cancel, ServerCallContext()))
        # The second cancel has read the task: one loop turn more and it has acted on it.
        await eventually(lambda: store.reads > reads, what="the second cancel to read the task")
        await asyncio.sleep(0)
        store.release.set()
        results = await asyncio.wait_for(
            asyncio.gather(sending, first, second, return_exceptions=True), 10
        )
        for result in results:
            assert isinstance(result, Task), result
            assert result.status.state == TaskState.TASK_STATE_CANCELED
    finally:
        await handler.aclose()


async def test_the_fast_routes_call_context_is_the_builders(service: A2AService) -> None:
    """The call context the fast route builds from the scope is the one the SDK's
    ``DefaultServerCallContextBuilder`` builds from a Starlette ``Request`` of it."""
    route = service.fastroute
    assert route is not None
    params = _params(_send({"key": "x"}, "echo"))
    params.tenant = "acme"
    scope = _scope()
    scope["headers"] += [
        (b"a2a-extensions", b"https://x.example/a, https://x.example/b"),
        (b"x-twice", b"first"),
        (b"a2a-extensions", b" ,https://x.example/c"),
        (b"x-twice", b"second"),
        (b"x-latin", "caf\xe9".encode("latin-1")),
    ]
    with_user = {**scope, "user": SimpleUser("ada"), "auth": AuthCredentials(["a"])}
    for each in (scope, _scope(None), with_user):
        mine = route._context(each, params)
        theirs = DefaultServerCallContextBuilder().build(Request(each))
        theirs.tenant = params.tenant
        assert mine.state == theirs.state
        assert mine.tenant == theirs.tenant == "acme"
        assert mine.requested_extensions == theirs.requested_extensions
        assert type(mine.user) is type(theirs.user)
        assert mine.user.is_authenticated == theirs.user.is_authenticated
        assert mine.user.user_name == theirs.user.user_name
    assert route._context(scope, params).requested_extensions == {
        f"https://x.example/{c}" for c in "abc"
    }
