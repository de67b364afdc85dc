"""A real `mesh serve` node driven by the real a2a-sdk client (through mesh._a2a.client)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh._a2a.card import SKILL_SCHEMA_EXTENSION, skill_schemas
from mesh._a2a.client import A2APeer
from mesh._errors import RemoteError
from tests.support import (
    BUREAU_SCORES,
    Proc,
    clean_env,
    free_port,
    running,
    wait_for,
    wait_until_ok,
)

pytestmark = pytest.mark.integration


class Node:
    def __init__(self, proc: Proc, url: str, calls: Path, data_dir: Path) -> None:
        self.proc = proc
        self.url = url
        self.calls = calls
        self.data_dir = data_dir

    def count(self, prefix: str) -> int:
        if not self.calls.exists():
            return 0
        return sum(1 for line in self.calls.read_text().splitlines() if line.startswith(prefix))


def _serve(tmp: Path, target: str, name: str, data_dir: Path, port: int) -> Iterator[Proc]:
    env = clean_env(NODE_TEST_CALLS=str(tmp / "calls.txt"))
    argv = ["mesh", "serve", target, "--port", str(port), "--data-dir", str(data_dir)]
    return running(argv, name=name, tmp=tmp, env=env, health=f"http://127.0.0.1:{port}/health")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("worker")
    port = free_port()
    with _serve(tmp, "tests.node_agents:agent", "worker", tmp / "data", port) as proc:
        yield Node(proc, f"http://127.0.0.1:{port}", tmp / "calls.txt", tmp / "data")


@pytest.fixture(scope="module")
def bureau(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("bureau")
    port = free_port()
    with _serve(tmp, "agents.credit_bureau:agent", "bureau", tmp / "data", port) as proc:
        yield Node(proc, f"http://127.0.0.1:{port}", tmp / "calls.txt", tmp / "data")


def _rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    r = httpx.post(url + "/", json=body, headers={"A2A-Version": "1.0"}, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_card_publishes_skills_and_schemas_without_instruction(
    bureau: Node, http: httpx.AsyncClient
) -> None:
    r = await http.get(bureau.url + "/.well-known/agent-card.json")
    assert r.status_code == 200
    assert r.headers["cache-control"] == "public, max-age=30"
    card = r.json()
    assert card["name"] == "credit-bureau"
    assert card["capabilities"]["streaming"] is True
    skill = next(s for s in card["skills"] if s["id"] == "score")
    # A typed skill takes its JSON as a data part or as text (issue 14).
    assert skill["inputModes"] == ["application/json", "text/plain"]
    assert "credit" in skill["tags"]
    uris = [e["uri"] for e in card["capabilities"]["extensions"]]
    assert SKILL_SCHEMA_EXTENSION in uris
    schemas = skill_schemas(card)
    assert set(schemas["score"]["input"]["required"]) == {"applicant_id", "amount"}
    assert "tier" in schemas["score"]["output"]["properties"]
    assert "instruction" not in r.text.lower()


async def test_typed_message_completes_with_validated_artifact(
    bureau: Node, http: httpx.AsyncClient
) -> None:
    peer = A2APeer(http, bureau.url)
    result = await peer.send({"applicant_id": "APP-501", "amount": 250000}, skill="score")
    assert result.state == "completed", result
    from agents.credit_bureau import ScoreReport

    report = ScoreReport.model_validate(result.data)
    assert report.score == BUREAU_SCORES["APP-501"]
    assert result.metadata["skill"] == "score"
    assert "usage" in result.metadata
    # The single typed skill is inferred when metadata.skill is missing.
    again = await peer.send({"applicant_id": "APP-501", "amount": 1000})
    assert again.ok
    assert again.data is not None
    assert again.data["score"] == report.score
    await peer.aclose()


async def test_invalid_input_is_rejected_naming_the_field(
    bureau: Node, http: httpx.AsyncClient
) -> None:
    peer = A2APeer(http, bureau.url)
    result = await peer.send({"applicant_id": "APP-1", "amount": "lots"}, skill="score")
    assert result.state == "rejected"
    assert result.error is not None
    assert "amount" in result.error["message"]
    assert "number" in result.error["message"]
    missing = await peer.send({"amount": 5}, skill="score")
    assert missing.state == "rejected"
    assert missing.error is not None
    assert "applicant_id" in missing.error["message"]
    unknown = await peer.send({"x": 1}, skill="nope")
    assert unknown.state == "rejected"
    assert unknown.error is not None
    assert "score" in unknown.error["message"]
    await peer.aclose()


async def test_stream_yields_progress_then_the_artifact(
    bureau: Node, http: httpx.AsyncClient
) -> None:
    peer = A2APeer(http, bureau.url)
    updates = [
        u async for u in peer.stream({"applicant_id": "APP-902", "amount": 10}, skill="score")
    ]
    kinds = [u.kind for u in updates]
    assert kinds[0] == "task"
    assert "artifact" in kinds
    assert updates[-1].state == "completed"
    artifact = next(u for u in updates if u.kind == "artifact")
    assert artifact.data is not None
    assert artifact.data["applicant_id"] == "APP-902"
    await peer.aclose()


async def test_same_message_id_runs_the_skill_once(worker: Node, http: httpx.AsyncClient) -> None:
    peer = A2APeer(http, worker.url)
    key = uuid.uuid4().hex
    message_id = f"m-{key}"
    first = await peer.send({"key": key, "n": 2}, skill="echo", message_id=message_id)
    second = await peer.send({"key": key, "n": 2}, skill="echo", message_id=message_id)
    assert first.ok
    assert second.ok
    assert second.task_id == first.task_id
    assert worker.count(f"echo {key}") == 1
    # A different caller with the same message id is a different request.
    third = await peer.send(
        {"key": key, "n": 2}, skill="echo", message_id=message_id, metadata={"caller": "other"}
    )
    assert third.task_id != first.task_id
    assert worker.count(f"echo {key}") == 2
    await peer.aclose()


async def test_duplicate_of_a_running_task_waits_for_it(
    worker: Node, http: httpx.AsyncClient
) -> None:
    peer = A2APeer(http, worker.url)
    message_id = uuid.uuid4().hex
    started = await peer.send({"seconds": 0.6}, skill="slow", message_id=message_id, wait=False)
    assert not started.done
    duplicate = await peer.send({"seconds": 0.6}, skill="slow", message_id=message_id)
    assert duplicate.task_id == started.task_id
    assert duplicate.state == "completed"
    assert worker.count(f"slow start {started.task_id}") == 1
    await peer.aclose()


async def test_list_tasks_filters_by_context(worker: Node, http: httpx.AsyncClient) -> None:
    peer = A2APeer(http, worker.url)
    context = uuid.uuid4().hex
    ids = set()
    for i in range(3):
        r = await peer.send({"key": f"list-{i}"}, skill="echo", context_id=context)
        ids.add(r.task_id)
    page = await peer.list_tasks(context_id=context, page_size=2)
    assert page.total_size == 3
    assert len(page.tasks) == 2
    assert page.next_page_token
    rest = await peer.list_tasks(context_id=context, page_size=2, page_token=page.next_page_token)
    assert {t.task_id for t in page.tasks + rest.tasks} == ids
    assert all(t.data is not None for t in page.tasks)


async def test_cancel_a_slow_task(worker: Node, http: httpx.AsyncClient) -> None:
    peer = A2APeer(http, worker.url)
    task = await peer.send({"seconds": 30}, skill="slow", wait=False)
    wait_for(lambda: worker.count(f"slow start {task.task_id}") == 1, what="slow task to start")
    canceled = await peer.cancel(task.task_id)
    assert canceled.state == "canceled"
    again = await peer.get_task(task.task_id)
    assert again.state == "canceled"
    assert worker.count(f"slow end {task.task_id}") == 0
    with pytest.raises(RemoteError):
        await peer.cancel(task.task_id)
    await peer.aclose()


async def test_deadline_passed_or_passing(worker: Node, http: httpx.AsyncClient) -> None:
    peer = A2APeer(http, worker.url)
    late = await peer.send({"key": "late"}, skill="echo", metadata={"deadline": time.time() - 1})
    assert late.state == "rejected"
    assert late.error == {"reason": "deadline", "message": "deadline exceeded"}
    slow = await peer.send({"seconds": 20}, skill="slow", metadata={"deadline": time.time() + 0.5})
    assert slow.state == "failed"
    assert slow.error is not None
    assert slow.error["message"] == "deadline exceeded"
    await peer.aclose()


async def test_handler_exception_fails_cleanly_without_leaking(worker: Node) -> None:
    body = _rpc(
        worker.url,
        "SendMessage",
        {
            "message": {
                "role": "ROLE_USER",
                "messageId": uuid.uuid4().hex,
                "parts": [{"data": {"key": "x"}}],
                "metadata": {
                    "skill": "broken",
                    "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
                },
            }
        },
    )
    assert "error" not in body
    task = body["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert "secret-token" not in str(body)
    assert task["metadata"]["traceparent"].startswith("00-aaaa")
    assert "internal error" in task["metadata"]["error"]["message"]


async def test_task_survives_a_restart(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    with _serve(tmp_path, "agents.credit_bureau:agent", "first", data, port):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            peer = A2APeer(http, f"http://127.0.0.1:{port}")
            before = await peer.send(
                {"applicant_id": "APP-847", "amount": 5}, message_id="restart-1"
            )
            await peer.aclose()
    assert (data / "node.db").exists()
    with _serve(tmp_path, "agents.credit_bureau:agent", "second", data, port):
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            peer = A2APeer(http, f"http://127.0.0.1:{port}")
            after = await peer.get_task(before.task_id)
            assert after.state == "completed"
            assert after.data == before.data
            # The idempotency key survived too: the same message returns the old task.
            replay = await peer.send(
                {"applicant_id": "APP-847", "amount": 5}, message_id="restart-1"
            )
            assert replay.task_id == before.task_id
            await peer.aclose()


async def test_health_metrics_and_introspect(worker: Node, http: httpx.AsyncClient) -> None:
    peer = A2APeer(http, worker.url)
    await peer.send({"key": "metrics"}, skill="echo")
    await peer.send({"nope": 1}, skill="echo")
    await peer.aclose()

    health = (await http.get(worker.url + "/health")).json()
    assert health["status"] == "ok"
    assert health["agent"] == "test-worker"
    assert health["checks"]["database"]["ok"] is True

    text = (await http.get(worker.url + "/metrics")).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    agent = ("agent", "test-worker")

    def value(name: str, **labels: str) -> float:
        key = (name, tuple(sorted([agent, *labels.items()])))
        return samples.get(key, 0.0)

    assert value("mesh_tasks_total", skill="echo", outcome="completed") >= 1
    assert value("mesh_tasks_total", skill="echo", outcome="rejected") >= 1
    assert value("mesh_requests_total", method="SendMessage", outcome="ok") >= 2
    assert value("mesh_task_duration_seconds_count", skill="echo") >= 2
    assert value("mesh_tasks_in_flight") == 0
    assert value("mesh_node_info", version="0.1.0") == 1
    names = {fam.name for fam in text_string_to_metric_families(text)}
    assert {"mesh_delegations", "mesh_circuit_breaker_state", "process_cpu_seconds"} <= names

    intro = (await http.get(worker.url + "/introspect")).json()
    assert intro["agent"]["name"] == "test-worker"
    assert {s["id"] for s in intro["agent"]["skills"]} == {"echo", "slow", "broken"}
    assert intro["agent"]["skills"][0]["input_schema"]["required"] == ["key"]
    assert intro["runtime"]["store"] == "sqlite"
    assert intro["runtime"]["pid"] == worker.proc.pid
    assert intro["peers"] == []
    assert "instruction" not in intro["agent"]


def test_bad_json_rpc_is_a_clean_error(worker: Node) -> None:
    r = httpx.post(worker.url + "/", content=b"{not json", headers={"A2A-Version": "1.0"})
    assert r.status_code == 200
    assert r.json()["error"]["code"] == -32700
    body = _rpc(worker.url, "GetTask", {"id": "does-not-exist"})
    assert body["error"]["code"] == -32001
    wait_until_ok(worker.url + "/health")
