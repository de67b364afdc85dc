"""The HTTP+JSON (REST) binding of a real `mesh serve` node, driven by the a2a-sdk client on its
REST transport: the same auth, metrics and fast path as JSON-RPC, and the spec's errors for
unknown methods and unsupported versions on both bindings."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import get_data_parts, new_data_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.constants import TransportProtocol
from google.protobuf.struct_pb2 import Struct
from prometheus_client.parser import text_string_to_metric_families

from mesh._a2a.client import A2APeer
from tests.support import Proc, clean_env, free_port, running, wait_for

pytestmark = pytest.mark.integration

TOKEN = "rest-token-5678"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REST = "/a2a/rest"


class Node:
    def __init__(self, proc: Proc, url: str, calls: Path) -> None:
        self.proc = proc
        self.url = url
        self.calls = calls

    def called(self, prefix: str) -> list[str]:
        if not self.calls.exists():
            return []
        return [line for line in self.calls.read_text().splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The test agent (echo, slow...) with a mesh token."""
    tmp = tmp_path_factory.mktemp("rest")
    port = free_port()
    env = clean_env(NODE_TEST_CALLS=str(tmp / "calls.txt"), MESH_TOKEN=TOKEN)
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data")]
    health = f"http://127.0.0.1:{port}/health"
    with running(argv, name="rest", tmp=tmp, env=env, health=health) as proc:
        yield Node(proc, f"http://127.0.0.1:{port}", tmp / "calls.txt")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=AUTH) as client:
        yield client


def _client(card: Any, http: httpx.AsyncClient, *, streaming: bool = False) -> Client:
    config = ClientConfig(
        streaming=streaming,
        httpx_client=http,
        supported_protocol_bindings=[TransportProtocol.HTTP_JSON],
    )
    return ClientFactory(config).create(card)


def _message(data: dict[str, Any], skill: str, context_id: str) -> Message:
    meta = Struct()
    meta.update({"skill": skill})
    return Message(
        role=Role.ROLE_USER,
        message_id=uuid.uuid4().hex,
        context_id=context_id,
        parts=[new_data_part(data)],
        metadata=meta,
    )


async def _one(responses: AsyncIterator[StreamResponse]) -> Task:
    found = [r async for r in responses]
    assert len(found) == 1, found
    assert found[0].HasField("task"), found
    return found[0].task


async def _drain(events: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [e async for e in events]


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def test_the_card_lists_json_rpc_first_then_rest(node: Node, http: httpx.AsyncClient) -> None:
    card = (await http.get(node.url + "/.well-known/agent-card.json")).json()
    assert card["supportedInterfaces"] == [
        {"url": node.url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": node.url + REST, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ]


async def test_a_rest_round_trip_with_the_sdk_client(node: Node, http: httpx.AsyncClient) -> None:
    card = await A2ACardResolver(http, node.url).get_agent_card()
    client = _client(card, http)
    before = (await http.get(node.url + "/metrics")).text
    context_id = f"ctx-{uuid.uuid4().hex[:8]}"

    # SendMessage, blocking, typed: on the fast path.
    task = await _one(
        client.send_message(_request(_message({"key": "r1", "n": 4}, "echo", context_id)))
    )
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    assert get_data_parts(list(task.artifacts[0].parts))[0] == {
        "key": "r1",
        "n": 4.0,
        "doubled": 8.0,
    }
    assert node.called("echo r1") == ["echo r1"]

    # GetTask and ListTasks.
    got = await client.get_task(GetTaskRequest(id=task.id))
    assert got.id == task.id
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    page = await client.list_tasks(ListTasksRequest(context_id=context_id))
    assert [t.id for t in page.tasks] == [task.id]

    # CancelTask: a slow task, sent without waiting, followed by SubscribeToTask.
    streaming = _client(card, http, streaming=True)
    slow = _request(_message({"seconds": 30}, "slow", context_id))
    slow.configuration.return_immediately = True
    started = await _one(client.send_message(slow))
    await asyncio.to_thread(
        wait_for, lambda: node.called(f"slow start {started.id}"), what="slow task to start"
    )

    subscription = streaming.subscribe(SubscribeToTaskRequest(id=started.id))
    first = await anext(subscription)  # the task as it is now: the subscription is open
    assert first.task.status.state == TaskState.TASK_STATE_WORKING, first
    canceled = await client.cancel_task(CancelTaskRequest(id=started.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert node.called(f"slow end {started.id}") == []
    followed = await asyncio.wait_for(_drain(subscription), 20)
    assert followed[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED, followed

    # SendStreamingMessage: the task's events, ending COMPLETED.
    events = [
        e
        async for e in streaming.send_message(_request(_message({"key": "r2"}, "echo", context_id)))
    ]
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task", kinds
    assert kinds[-1] == "status_update", kinds
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert any(e.HasField("artifact_update") for e in events)

    after = (await http.get(node.url + "/metrics")).text
    for method in (
        "POST /message:send",
        "GET /tasks/{id}",
        "GET /tasks",
        "POST /tasks/{id}:cancel",
    ):
        grew = _metric(after, "mesh_requests_total", method=method, outcome="ok") - _metric(
            before, "mesh_requests_total", method=method, outcome="ok"
        )
        assert grew >= 1, method
    assert _metric(after, "mesh_requests_total", method="POST /message:stream", outcome="ok") >= 1
    # Only the first send was a blocking typed one: the fast path answered exactly it.
    fast = _metric(after, "mesh_fastpath_sends_total", binding="rest") - _metric(
        before, "mesh_fastpath_sends_total", binding="rest"
    )
    assert fast == 1
    await client.close()
    await streaming.close()


def _request(message: Message) -> SendMessageRequest:
    return SendMessageRequest(message=message)


async def test_rest_needs_the_token(node: Node) -> None:
    body = {"message": {"role": "ROLE_USER", "messageId": "m-x", "parts": [{"data": {"key": "x"}}]}}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as anonymous:
        for method, path, json in (
            ("POST", "/message:send", body),
            ("POST", "/message:stream", body),
            ("GET", "/tasks", None),
            ("GET", "/tasks/some-id", None),
            ("POST", "/tasks/some-id:cancel", None),
            ("GET", "/nowhere", None),
        ):
            r = await anonymous.request(
                method, node.url + REST + path, json=json, headers={"A2A-Version": "1.0"}
            )
            assert r.status_code == 401, (path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"]["status"] == "UNAUTHENTICATED"
            assert "MESH_TOKEN" in r.json()["error"]["message"]
    assert node.called("echo x") == []


async def test_unknown_rest_methods_are_method_not_found(
    node: Node, http: httpx.AsyncClient
) -> None:
    for method, path in (
        ("GET", "/nowhere"),
        ("POST", "/message:shout"),
        ("DELETE", "/message:send"),  # a REST path with a method it does not have
        ("PUT", "/tasks/x"),
    ):
        r = await http.request(method, node.url + REST + path, headers={"A2A-Version": "1.0"})
        assert r.status_code == 404, (method, path, r.text)
        error = r.json()["error"]
        assert error["status"] == "NOT_FOUND"
        assert error["details"][0]["reason"] == "METHOD_NOT_FOUND"
        assert f"{method} {path}" in error["message"]
    metrics = (await http.get(node.url + "/metrics")).text
    assert _metric(metrics, "mesh_requests_total", method="other", outcome="error") >= 4


async def test_unknown_json_rpc_methods_are_method_not_found(
    node: Node, http: httpx.AsyncClient
) -> None:
    for method in ("Shout", "message/send", "tasks/get"):
        body = {"jsonrpc": "2.0", "id": 5, "method": method, "params": {}}
        r = await http.post(node.url + "/", json=body, headers={"A2A-Version": "1.0"})
        assert r.status_code == 200
        assert r.json()["error"]["code"] == -32601, r.text


@pytest.mark.parametrize("version", ["2.0", "0.3", None])
async def test_unsupported_versions_are_refused_on_both_bindings(
    node: Node, http: httpx.AsyncClient, version: str | None
) -> None:
    headers = {} if version is None else {"A2A-Version": version}
    shown = version or "0.3"  # no header is A2A 0.3, as the spec says
    message = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "parts": [{"data": {"key": f"v{version}"}}],
        "metadata": {"skill": "echo"},
    }
    for method, params in (("SendMessage", {"message": message}), ("ListTasks", {})):
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        r = await http.post(node.url + "/", json=body, headers=headers)
        assert r.json()["error"]["code"] == -32009, r.text
        assert shown in r.json()["error"]["message"]
    for method, path, json in (
        ("POST", "/message:send", {"message": message}),
        ("GET", "/tasks", None),
        ("POST", "/message:stream", {"message": message}),
    ):
        r = await http.request(method, node.url + REST + path, json=json, headers=headers)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["details"][0]["reason"] == "VERSION_NOT_SUPPORTED", error
        assert shown in error["message"]
    assert node.called(f"echo v{version}") == []


async def test_rest_bodies_get_the_strict_parse(node: Node, http: httpx.AsyncClient) -> None:
    headers = {"A2A-Version": "1.0", "Content-Type": "application/json"}
    for path, raw, what, reason in (
        ("/message:send", b'{"message": {"parts": [{"data": {"x": NaN}}]}}', "NaN", "REQUEST"),
        ("/message:send", b'{"message": ', "Parse error", "REQUEST"),
        (
            "/message:stream",
            b'{"message": {"parts": [{"data": {"x": 1e400}}]}}',
            "1e400",
            "PARAMS",
        ),
        (
            "/tasks/t-1/pushNotificationConfigs",
            b'{"url": "https://x.example", "n": -Infinity}',
            "Infinity",
            "REQUEST",
        ),
    ):
        r = await http.post(node.url + REST + path, content=raw, headers=headers)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT"
        assert what in error["message"]
        # The A2A reason, which the SDK's client maps to InvalidRequestError/InvalidParamsError.
        assert error["details"][0]["reason"] == f"INVALID_{reason}", error


async def test_a_rest_body_over_the_limit_is_refused(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(MESH_MAX_BODY_BYTES="2000")
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data")]
    url = f"http://127.0.0.1:{port}"
    with running(argv, name="small", tmp=tmp_path, env=env, health=url + "/health"):
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            big = {
                "message": {"role": "ROLE_USER", "messageId": "m", "parts": [{"text": "x" * 5000}]}
            }
            r = await http.post(
                url + REST + "/message:send", json=big, headers={"A2A-Version": "1.0"}
            )
            assert r.status_code == 413, r.text
            assert "MESH_MAX_BODY_BYTES" in r.json()["error"]["message"]


def test_a_draining_node_refuses_new_rest_sends(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    calls = tmp_path / "calls.txt"
    env = clean_env(NODE_TEST_CALLS=str(calls))
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data"), "--grace", "10"]
    headers = {"A2A-Version": "1.0"}

    def message(data: dict[str, Any], skill: str) -> dict[str, Any]:
        return {
            "message": {
                "role": "ROLE_USER",
                "messageId": uuid.uuid4().hex,
                "parts": [{"data": data}],
                "metadata": {"skill": skill},
            }
        }

    with (
        running(argv, name="draining", tmp=tmp_path, env=env, health=url + "/health") as proc,
        httpx.Client(timeout=30, trust_env=False) as client,
        httpx.Client(timeout=30, trust_env=False) as other,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        client.get(url + "/health")  # a keep-alive connection, reused after the signal
        pending = pool.submit(
            other.post,
            url + REST + "/message:send",
            json=message({"seconds": 1.5}, "slow"),
            headers=headers,
        )
        wait_for(lambda: calls.exists() and "slow start" in calls.read_text(), what="task start")
        proc.popen.send_signal(signal.SIGTERM)
        wait_for(lambda: client.get(url + "/health").status_code == 503, what="draining")
        for path in ("/message:send", "/message:stream"):
            refused = client.post(
                url + REST + path, json=message({"key": "late"}, "echo"), headers=headers
            )
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["status"] == "UNAVAILABLE"
            assert "shutting down" in refused.json()["error"]["message"]
        # Reads are still answered while the node drains.
        assert client.get(url + REST + "/tasks", headers=headers).status_code == 200
        answer = pending.result(timeout=20)
        assert answer.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED", answer.text
        assert proc.popen.wait(20) == 0
    assert "echo late" not in calls.read_text()


@pytest.fixture(scope="module")
def rest_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An a2a-sdk node whose card offers HTTP+JSON only (tests.rest_only_node)."""
    tmp = tmp_path_factory.mktemp("rest-only")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "tests.rest_only_node", "--port", str(port)]
    with running(argv, name="rest-only", tmp=tmp, health=url + "/health"):
        yield url


async def test_a_peer_offering_only_http_json_is_called_over_it(rest_only: str) -> None:
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
        # The card not read yet: the JSON-RPC send finds nothing (404), the card says REST.
        fresh = A2APeer(http, rest_only)
        result = await fresh.send({"text": "hi"}, skill="echo")
        assert result.state == "completed", result
        assert result.data == {"echo": "hi"}
        # The card known (as after a delegation's trust check): straight to REST.
        known = A2APeer(http, rest_only)
        await known.card()
        started = await known.send({"text": "later"}, skill="echo", wait=False)
        done = await known.get_task(started.task_id)
        assert done.data == {"echo": "later"}
        updates = [u async for u in known.stream({"text": "streamed"}, skill="echo")]
        assert updates[-1].state == "completed", updates
        page = await known.list_tasks()
        assert {t.task_id for t in page.tasks} >= {result.task_id, started.task_id}
        await fresh.aclose()
        await known.aclose()


async def test_a_mesh_node_is_still_called_over_json_rpc(
    node: Node, http: httpx.AsyncClient
) -> None:
    before = (await http.get(node.url + "/metrics")).text
    peer = A2APeer(http, node.url, headers=AUTH)
    await peer.card()
    result = await peer.send({"key": "jr"}, skill="echo")
    assert result.state == "completed"
    assert (await peer.get_task(result.task_id)).state == "completed"
    await peer.aclose()
    after = (await http.get(node.url + "/metrics")).text
    for method in ("SendMessage", "GetTask"):
        grew = _metric(after, "mesh_requests_total", method=method) - _metric(
            before, "mesh_requests_total", method=method
        )
        assert grew == 1, method
    assert _metric(after, "mesh_requests_total", method="GET /tasks/{id}") == _metric(
        before, "mesh_requests_total", method="GET /tasks/{id}"
    )


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_TRACE = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]")


def _norm(value: Any) -> Any:
    """Ids and times each node generates, replaced by placeholders."""
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, str):
        return _TRACE.sub("<trace>", _TIME.sub("<time>", _UUID.sub("<uuid>", value)))
    return value


async def test_the_rest_fast_path_answers_as_the_sdks_rest_route(tmp_path: Path) -> None:
    urls = []
    with contextlib.ExitStack() as stack:
        for name, flag in (("fast", "1"), ("sdk", "0")):
            port = free_port()
            argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
            argv += ["--data-dir", str(tmp_path / name)]
            url = f"http://127.0.0.1:{port}"
            env = clean_env(MESH_FASTPATH=flag)
            stack.enter_context(
                running(argv, name=name, tmp=tmp_path, env=env, health=url + "/health")
            )
            urls.append(url)
        fast_url, sdk_url = urls

        def send(data: Any, **config: Any) -> dict[str, Any]:
            body: dict[str, Any] = {
                "message": {
                    "role": "ROLE_USER",
                    "messageId": uuid.uuid4().hex,
                    "contextId": "ctx-rest",
                    "parts": [{"data": data}],
                    "metadata": {"skill": "echo"},
                }
            }
            if config:
                body["configuration"] = config
            return body

        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            cases = {
                "completed": (send({"key": "a", "n": 3}), "1.0"),
                "history": (send({"key": "b"}, historyLength=5), "1.0"),
                "rejected": (send({"n": 1}), "1.0"),
                "negative history": (send({"key": "c"}, historyLength=-1), "1.0"),
                "version": (send({"key": "d"}), "2.0"),
            }
            for what, (body, version) in cases.items():
                answers = [
                    await http.post(
                        url + REST + "/message:send", json=body, headers={"A2A-Version": version}
                    )
                    for url in (fast_url, sdk_url)
                ]
                fast, sdk = answers
                assert fast.status_code == sdk.status_code, (what, fast.text, sdk.text)
                assert fast.headers["content-type"] == sdk.headers["content-type"], what
                assert _norm(fast.json()) == _norm(sdk.json()), what
            metrics = [(await http.get(u + "/metrics")).text for u in urls]
    # The fast node answered the blocking sends it takes itself; the other none.
    assert _metric(metrics[0], "mesh_fastpath_sends_total", binding="rest") == 5
    assert _metric(metrics[1], "mesh_fastpath_sends_total", binding="rest") == 0
