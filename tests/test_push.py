"""A2A push notifications (mesh._a2a.push): a caller that went away learns a task's end at its
webhook, delivered from a durable outbox with retries, to URLs the node's policy allows.

Every test runs a real node (``mesh serve tests.node_agents:holder``, whose ``hold`` skill a
test holds mid-run) and a real webhook receiver: a uvicorn app on a free loopback port in the
test's own event loop, answering the statuses the test scripts. Nodes that must reach it run
with ``MESH_PUSH_NETWORKS=loopback`` (the default, public addresses only, refuses loopback).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import (
    AgentCard,
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    SendMessageRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.holder_support import HEADERS, Holder, message, rpc
from tests.support import eventually, free_port, uvicorn_serving

pytestmark = pytest.mark.integration

LOOPBACK = "loopback"


@dataclass
class Hook:
    """What the webhook received, and the statuses it answers (then ``default``)."""

    url: str
    answers: list[int] = field(default_factory=list)
    default: int = 200
    got: list[tuple[dict[str, str], dict[str, Any], int]] = field(default_factory=list)

    def bodies(self, status: int | None = None) -> list[dict[str, Any]]:
        return [body for _, body, answered in self.got if status is None or answered == status]


@contextlib.asynccontextmanager
async def webhook(*answers: int, default: int = 200) -> AsyncIterator[Hook]:
    port = free_port()
    hook = Hook(f"http://127.0.0.1:{port}/hook", list(answers), default)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        status = hook.answers.pop(0) if hook.answers else hook.default
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        hook.got.append((headers, json.loads(body), status))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async with uvicorn_serving(app, port, what="the webhook", log_level="critical", lifespan="off"):
        yield hook


def _push_send(
    key: str, config: dict[str, Any] | None, *, message_id: str | None = None, wait: bool = False
) -> dict[str, Any]:
    configuration: dict[str, Any] = {"returnImmediately": not wait}
    if config is not None:
        configuration["taskPushNotificationConfig"] = config
    params = {
        "message": message(key, message_id or uuid.uuid4().hex),
        "configuration": configuration,
    }
    return rpc("SendMessage", params)


async def _post(node: Holder, body: dict[str, Any]) -> dict[str, Any]:
    # A client of its own, closed when it returns: the caller goes away.
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        r = await http.post(node.url + "/", json=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _outbox(node: Holder) -> list[dict[str, Any]]:
    conn = sqlite3.connect(node.data / "node.db", timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("select * from a2a_push_outbox").fetchall()]
    finally:
        conn.close()


async def _deliveries(node: Holder) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        text = (await http.get(node.url + "/metrics")).text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "mesh_push_deliveries"
        for sample in family.samples
        if sample.name == "mesh_push_deliveries_total"
    }


def _task_of(body: dict[str, Any]) -> dict[str, Any]:
    assert list(body) == ["task"], body  # a StreamResponse holding the task
    return dict(body["task"])


async def test_the_webhook_gets_the_final_task_after_the_caller_went_away(tmp_path: Path) -> None:
    node = Holder(tmp_path)
    node.hold()
    async with webhook() as hook:
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):
            config = {
                "url": hook.url,
                "token": "tok-1",
                "authentication": {"scheme": "Bearer", "credentials": "hook-secret"},
            }
            answer = await _post(node, _push_send("k1", config))
            task_id = answer["result"]["task"]["id"]
            # The caller is gone; the task is still running.
            assert answer["result"]["task"]["status"]["state"] in {
                "TASK_STATE_SUBMITTED",
                "TASK_STATE_WORKING",
            }
            await eventually(lambda: node.calls("hold start k1"), what="the skill to start")
            assert hook.got == []
            node.release()
            await eventually(lambda: hook.got, what="a push notification")
            await eventually(lambda: not _outbox(node), what="the outbox to empty")
            assert (await _deliveries(node))["delivered"] == 1
        headers, body, _ = hook.got[0]
        assert len(hook.got) == 1  # settled states only: no SUBMITTED/WORKING pushes
        task = _task_of(body)
        assert task["id"] == task_id
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert task["artifacts"][0]["parts"][0]["data"] == {"key": "k1"}
        assert "history" not in task
        assert headers["x-a2a-notification-token"] == "tok-1"
        assert headers["authorization"] == "Bearer hook-secret"
        assert headers["content-type"] == "application/json"


async def test_a_503_is_retried_and_the_task_delivered_once(tmp_path: Path) -> None:
    node = Holder(tmp_path)
    async with webhook(503) as hook:
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):
            await _post(node, _push_send("k2", {"url": hook.url}))
            await eventually(lambda: len(hook.got) >= 2, within=15, what="a retry after the 503")
            # Nothing left to send once the 200 came: the row is gone, nothing more arrives.
            await eventually(lambda: not _outbox(node), what="the outbox to empty")
            counts = await _deliveries(node)
        assert [status for _, _, status in hook.got] == [503, 200]
        first, second = hook.bodies()
        assert first == second
        assert _task_of(second)["status"]["state"] == "TASK_STATE_COMPLETED"
        assert counts["failed"] == 1
        assert counts["delivered"] == 1


async def test_a_delivery_pending_at_a_kill_9_is_delivered_after_the_restart(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    async with webhook(default=503) as hook:
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK) as proc:
            answer = await _post(node, _push_send("k3", {"url": hook.url, "token": "t3"}))
            task_id = answer["result"]["task"]["id"]
            # Killed between attempts: the first failed, the row waits for its retry.
            pending = await eventually(
                lambda: [row for row in _outbox(node) if row["last_error"] == "HTTP 503"],
                what="a failed first attempt",
            )
            assert pending[0]["task_id"] == task_id
            proc.kill()
        hook.default = 200
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):
            await eventually(lambda: hook.bodies(200), within=15, what="the delivery after restart")
            await eventually(lambda: not _outbox(node), what="the outbox to empty")
        assert len(hook.bodies(200)) == 1
        assert all(body == hook.bodies(200)[0] for body in hook.bodies(503))
        headers, body, _ = hook.got[-1]
        assert _task_of(body)["id"] == task_id
        assert _task_of(body)["status"]["state"] == "TASK_STATE_COMPLETED"
        assert headers["x-a2a-notification-token"] == "t3"


async def test_a_task_cut_by_a_kill_9_notifies_its_webhook_of_the_interrupted_end(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    node.hold()
    async with webhook() as hook:
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK) as proc:
            answer = await _post(node, _push_send("k4", {"url": hook.url}))
            task_id = answer["result"]["task"]["id"]
            await eventually(lambda: node.calls("hold start k4"), what="the skill to start")
            proc.kill()
        node.release()
        # The start-up pass ends the task FAILED (interrupted) without any event: the outbox's
        # first pass finds the state no notification was queued for.
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):
            await eventually(lambda: hook.got, within=15, what="the notification of the end")
        task = _task_of(hook.got[0][1])
        assert task["id"] == task_id
        assert task["status"]["state"] == "TASK_STATE_FAILED"
        assert task["metadata"]["error"]["reason"] == "interrupted"


async def test_a_dropped_stream_still_gets_its_end_at_the_webhook(tmp_path: Path) -> None:
    """The SDK finishes a stream whose client went away without its push callback: the
    outbox's periodic pass finds the end."""
    node = Holder(tmp_path)
    node.hold()
    async with webhook() as hook:
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):
            body = _push_send("k6", {"url": hook.url})
            body["method"] = "SendStreamingMessage"
            del body["params"]["configuration"]["returnImmediately"]
            headers = {**HEADERS, "Accept": "text/event-stream"}
            async with (
                httpx.AsyncClient(timeout=30, trust_env=False) as http,
                http.stream("POST", node.url + "/", json=body, headers=headers) as r,
            ):
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        task_id = json.loads(line[5:])["result"]["task"]["id"]
                        break  # the caller goes away mid-stream
            await eventually(lambda: node.calls("hold start k6"), what="the skill to start")
            node.release()
            await eventually(lambda: hook.got, within=15, what="the notification of the end")
        task = _task_of(hook.got[0][1])
        assert (task["id"], task["status"]["state"]) == (task_id, "TASK_STATE_COMPLETED")


async def test_a_config_set_after_the_task_ended_gets_the_end_at_once(tmp_path: Path) -> None:
    """A caller that sets its webhook after a non-blocking send cannot miss a fast end."""
    node = Holder(tmp_path)
    async with webhook() as hook:
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):
            answer = await _post(node, _push_send("k7", None, wait=True))
            task_id = answer["result"]["task"]["id"]
            assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            body = rpc("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": hook.url})
            created = await _post(node, body)
            assert created["result"]["id"] == task_id
            await eventually(lambda: hook.got, what="the notification of the end")
        task = _task_of(hook.got[0][1])
        assert (task["id"], task["status"]["state"]) == (task_id, "TASK_STATE_COMPLETED")
        assert len(hook.got) == 1


async def test_configs_are_set_read_listed_and_deleted_with_the_sdk_client_and_kept(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    node.hold()
    async with webhook() as hook, httpx.AsyncClient(timeout=30, trust_env=False) as http:
        with node.serve(grace=0.5, MESH_PUSH_NETWORKS=LOOPBACK):
            answer = await _post(node, _push_send("k5", {"url": hook.url, "token": "inline"}))
            task_id = answer["result"]["task"]["id"]
            client = _client(http, await _card(http, node))
            created = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(
                    task_id=task_id,
                    id="second",
                    url=hook.url + "?second",
                    token="tok-2",
                    authentication=AuthenticationInfo(scheme="Bearer", credentials="c2"),
                )
            )
            assert (created.id, created.task_id, created.url) == (
                "second",
                task_id,
                hook.url + "?second",
            )
            got = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="second")
            )
            assert got.token == "tok-2"
            assert got.authentication.credentials == "c2"
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            # The inline config's id defaults to the task id.
            assert [c.id for c in listed.configs] == [task_id, "second"]
            await client.close()
        with node.serve(MESH_PUSH_NETWORKS=LOOPBACK):  # a restart keeps them
            client = _client(http, await _card(http, node))
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            assert [c.id for c in listed.configs] == [task_id, "second"]
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="second")
            )
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            assert [c.id for c in listed.configs] == [task_id]
            await client.close()


def _client(http: httpx.AsyncClient, card: AgentCard) -> Client:
    return ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)


async def _card(http: httpx.AsyncClient, node: Holder) -> AgentCard:
    card = await A2ACardResolver(http, node.url).get_agent_card()
    assert card.capabilities.push_notifications
    return card


def _refusal(answer: dict[str, Any]) -> str:
    assert "result" not in answer, answer
    assert answer["error"]["code"] == -32602, answer
    return str(answer["error"]["message"])


async def test_a_refused_url_is_invalid_params_naming_the_field_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    with node.serve():  # the default: public addresses only, as a2a-sdk's validator
        hook = f"http://127.0.0.1:{free_port()}/hook"
        message = _refusal(await _post(node, _push_send("r1", {"url": hook}, message_id="m-r1")))
        assert message.startswith("taskPushNotificationConfig.url: ")
        assert "MESH_PUSH_NETWORKS=public" in message
        assert "127.0.0.1" not in message.removeprefix("taskPushNotificationConfig.url: ")
        for url in ("ftp://example.com/x", "not a url", "http:///nohost"):
            assert "http:// or https://" in _refusal(
                await _post(node, _push_send("r", {"url": url}))
            )
        # Nothing half-written: no task, and the same messageId runs once sent without a hook.
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            assert await node.list_tasks(http) == []
        answer = await _post(node, _push_send("r1", None, message_id="m-r1", wait=True))
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        task_id = answer["result"]["task"]["id"]
        # CreateTaskPushNotificationConfig is checked alike.
        body = rpc("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": hook})
        assert "MESH_PUSH_NETWORKS" in _refusal(await _post(node, body))
    # Link-local (cloud metadata) stays refused whatever the setting says.
    with node.serve(MESH_PUSH_NETWORKS="any"):
        for url in ("http://169.254.169.254/latest/meta-data", "http://[fe80::1]/x"):
            body = rpc("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": url})
            assert "outside the networks" in _refusal(await _post(node, body))
    assert _configs(node) == []


def _configs(node: Holder) -> list[tuple[str, str]]:
    conn = sqlite3.connect(node.data / "node.db", timeout=5)
    try:
        return conn.execute("select task_id, config_id from a2a_push_configs").fetchall()
    finally:
        conn.close()


async def test_the_fast_path_is_untouched_by_push(tmp_path: Path) -> None:
    """A blocking send without a push config is still the fast path's, with push on: nothing
    is queued or stored for it, and its answer is the same as ever."""
    from a2a.server.context import ServerCallContext
    from google.protobuf.json_format import ParseDict

    from mesh._a2a.server import A2AService
    from mesh._netpolicy import NetworkPolicy
    from mesh._sqlite import Database
    from tests.node_agents import agent as worker_agent

    db = await Database.open(tmp_path / "node.db")
    service = await A2AService.create(
        worker_agent, url="http://127.0.0.1:1", db=db, push_networks=NetworkPolicy.parse("loopback")
    )
    try:
        assert service.push is not None
        assert service.card.capabilities.push_notifications
        fast = service.handler.fastpath
        assert fast is not None
        body = rpc("SendMessage", {"message": message("f1", "m-f1")})["params"]
        body["message"]["metadata"]["skill"] = "echo"
        body["message"]["parts"] = [{"data": {"key": "f1"}}]
        params = ParseDict(body, SendMessageRequest())
        assert fast.takes(params)
        task = await service.handler.on_message_send(params, ServerCallContext())
        assert isinstance(task, Task)
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        rows = await db.read(
            lambda conn: conn.execute(
                "select (select count(*) from a2a_push_configs), "
                "(select count(*) from a2a_push_outbox)"
            ).fetchone()
        )
        assert tuple(rows) == (0, 0)
    finally:
        await service.aclose()
        await db.aclose()
