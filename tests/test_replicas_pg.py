"""Two replicas of one agent on one PostgreSQL database (issue 17): real ``mesh serve``
processes, one given ``--store postgresql://...``, the other ``MESH_STORE``. A task created on
replica A is read, listed and canceled on replica B; a message id accepted by A is a duplicate
on B (the skill runs once); a follow-up in the same context on B continues A's conversation.
The database URL carries a password that no log, /health or /introspect shows."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.postgres_support import PostgresServer
from tests.support import clean_env, free_port, running, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

_HEADERS = {"A2A-Version": "1.0"}
_PASSWORD = "pw-never-shown-3f9a"


@dataclass
class Replicas:
    a: str
    b: str
    dir: Path
    logs: list[Any]
    store: str = ""

    def calls(self) -> list[str]:
        path = self.dir / "calls"
        return path.read_text().splitlines() if path.exists() else []


@contextlib.contextmanager
def _pair(server: PostgresServer, tmp: Path, target: str, **env: str) -> Iterator[Replicas]:
    """Replicas A and B of ``target`` on a new database of ``server`` (dropped after)."""
    import psycopg

    name = f"r_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"create database {name}")
    # Trust authentication ignores the password: it is there to be hidden.
    url = f"postgresql://postgres:{_PASSWORD}@127.0.0.1:{server.port}/{name}"
    ports = free_port(), free_port()
    child_env = clean_env(REPLICA_TEST_DIR=str(tmp), **env)
    with contextlib.ExitStack() as stack:
        procs = []
        for label, port in zip("ab", ports, strict=True):
            argv = ["mesh", "serve", target, "--port", str(port)]
            argv += ["--data-dir", str(tmp / label), "--no-register", "--grace", "1"]
            if label == "a":
                argv += ["--store", url]
                proc_env = child_env
            else:
                proc_env = {**child_env, "MESH_STORE": url}
            health = f"http://127.0.0.1:{port}/health"
            procs.append(
                stack.enter_context(
                    running(argv, name=f"replica-{label}", tmp=tmp, env=proc_env, health=health)
                )
            )
        a, b = (f"http://127.0.0.1:{p}" for p in ports)
        yield Replicas(a, b, tmp, procs, url)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"drop database if exists {name} with (force)")


@pytest.fixture(scope="module")
def replicas(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    with _pair(
        postgres_server, tmp_path_factory.mktemp("replicas"), "tests.replica_agents:agent"
    ) as pair:
        yield pair


def _rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    r = httpx.post(url + "/", json=body, headers=_HEADERS, timeout=30)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert "error" not in answer, answer
    return dict(answer["result"])


def _crunch(job: str, message_id: str | None = None) -> dict[str, Any]:
    return {
        "role": "ROLE_USER",
        "messageId": message_id or str(uuid.uuid4()),
        "parts": [{"data": {"job": job}}],
        "metadata": {"skill": "crunch"},
    }


def _texts(value: Any) -> list[str]:
    """Every text part anywhere in an answer."""
    if isinstance(value, dict):
        found = [value["text"]] if isinstance(value.get("text"), str) else []
        return found + [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def test_a_task_of_replica_a_is_read_listed_and_canceled_on_replica_b(replicas: Replicas) -> None:
    sent = _rpc(
        replicas.a,
        "SendMessage",
        {"message": _crunch("j1"), "configuration": {"returnImmediately": True}},
    )
    task_id = sent["task"]["id"]
    wait_for(lambda: any(c.startswith("start j1") for c in replicas.calls()), what="j1 started")
    on_b = _rpc(replicas.b, "GetTask", {"id": task_id})
    assert on_b["id"] == task_id
    assert on_b["status"]["state"] in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}
    listed = _rpc(replicas.b, "ListTasks", {"pageSize": 100})
    assert task_id in [t["id"] for t in listed["tasks"]]
    canceled = _rpc(replicas.b, "CancelTask", {"id": task_id})
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    # A's run goes on to its end; its COMPLETED does not undo B's cancel.
    (replicas.dir / "j1.go").touch()
    wait_for(lambda: any(c.startswith("done j1") for c in replicas.calls()), what="j1 done")
    for url in (replicas.a, replicas.b):
        task = wait_for(
            lambda url=url: _rpc(url, "GetTask", {"id": task_id}),
            what=f"task {task_id} on {url}",
        )
        assert task["status"]["state"] == "TASK_STATE_CANCELED"


def test_a_message_id_accepted_by_a_is_a_duplicate_on_b(replicas: Replicas) -> None:
    (replicas.dir / "j2.go").touch()
    message = _crunch("j2")
    first = _rpc(replicas.a, "SendMessage", {"message": message})
    again = _rpc(replicas.b, "SendMessage", {"message": message})
    assert first["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert again["task"]["id"] == first["task"]["id"]
    assert again["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert len([c for c in replicas.calls() if c.startswith("start j2")]) == 1
    # B answered with A's run (the same artifacts), not a run of its own.
    assert again["task"]["artifacts"] == first["task"]["artifacts"]


def test_a_follow_up_on_b_continues_the_conversation_of_a(replicas: Replicas) -> None:
    context_id = str(uuid.uuid4())

    def say(url: str, text: str) -> list[str]:
        message = {
            "role": "ROLE_USER",
            "messageId": str(uuid.uuid4()),
            "contextId": context_id,
            "parts": [{"text": text}],
        }
        return _texts(_rpc(url, "SendMessage", {"message": message}))

    assert "Noted, Ada." in say(replicas.a, "my name is Ada")
    assert "You are Ada." in say(replicas.b, "who am I?")
    # Another context knows no name, on either replica.
    context_id = str(uuid.uuid4())
    assert "I do not know you yet." in say(replicas.b, "who am I?")


def test_the_database_password_is_never_shown(replicas: Replicas) -> None:
    for url in (replicas.a, replicas.b):
        for path in ("/health", "/introspect"):
            r = httpx.get(url + path, timeout=10)
            assert r.status_code == 200
            assert _PASSWORD not in r.text
        assert "postgresql" in httpx.get(url + "/introspect", timeout=10).text
    for proc in replicas.logs:
        assert _PASSWORD not in proc.output()


def test_a_task_waiting_on_a_is_answered_on_b(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.txt"
    with _pair(
        postgres_server, tmp_path, "tests.ask_agents:agent", NODE_TEST_CALLS=str(calls)
    ) as pair:
        started = _rpc(
            pair.a,
            "SendMessage",
            {
                "message": {
                    "role": "ROLE_USER",
                    "messageId": str(uuid.uuid4()),
                    "parts": [{"data": {"applicant_id": "APP-7", "amount": 1000}}],
                    "metadata": {"skill": "review"},
                }
            },
        )["task"]
        assert started["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"

        def answer(url: str, part: dict[str, Any]) -> dict[str, Any]:
            message = {
                "role": "ROLE_USER",
                "messageId": str(uuid.uuid4()),
                "taskId": started["id"],
                "contextId": started["contextId"],
                "parts": [part],
            }
            return dict(_rpc(url, "SendMessage", {"message": message})["task"])

        second = answer(pair.b, {"data": {"decision": "approve", "note": "fine"}})
        assert second["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", second
        assert "Who approves?" in _texts(second["status"])
        done = answer(pair.a, {"text": "Grace"})
        assert done["status"]["state"] == "TASK_STATE_COMPLETED", done
        assert "review decided APP-7 approve" in calls.read_text().splitlines()


def test_two_registry_replicas_serve_one_view(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    import psycopg

    from tests.registry_support import instances, registry, start_node

    name = f"g_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f"create database {name}")
    store = ["--backend", postgres_server.url(name)]
    try:
        with (
            registry(tmp_path, name="registry-a", extra=store) as a,
            registry(tmp_path, name="registry-b", extra=store) as b,
        ):
            node = start_node(tmp_path, a.url, name="echo-pg")
            try:
                seen = wait_for(
                    lambda: [i for i in instances(b.url) if i["agent"] == "echo-pg"],
                    what="echo-pg registered at A, listed by B",
                )
                assert seen[0]["url"] == node.url
                r = httpx.get(f"{b.url}/v1/agents/echo-pg", timeout=5)
                assert r.status_code == 200, r.text
            finally:
                node.proc.terminate()
            # Its deregistration at A leaves B's view too.
            wait_for(
                lambda: not [i for i in instances(b.url, status="any") if i["agent"] == "echo-pg"],
                what="echo-pg gone from B",
            )
    finally:
        with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
            conn.execute(f"drop database if exists {name} with (force)")


def test_the_tasks_of_a_replica_killed_mid_task_end_interrupted_on_another(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    target = "tests.replica_agents:agent"
    with _pair(postgres_server, tmp_path, target, MESH_REPLICA_LEASE="2") as pair:
        message = _crunch("j3")
        sent = _rpc(
            pair.a,
            "SendMessage",
            {"message": message, "configuration": {"returnImmediately": True}},
        )
        task_id = sent["task"]["id"]
        wait_for(lambda: any(c.startswith("start j3") for c in pair.calls()), what="j3 started")
        # A alive: B's sweeps (every 2/3 s) leave A's running task alone for several leases.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            state = _rpc(pair.b, "GetTask", {"id": task_id})["status"]["state"]
            assert state in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}
            time.sleep(0.25)
        pair.logs[0].popen.kill()  # kill -9 mid-task
        pair.logs[0].popen.wait(timeout=10)
        ended = wait_for(
            lambda: (
                (t := _rpc(pair.b, "GetTask", {"id": task_id}))["status"]["state"]
                == "TASK_STATE_FAILED"
                and t
            ),
            what="A's task ended by B",
        )
        assert ended["metadata"]["error"]["reason"] == "interrupted"
        assert "send the message again" in " ".join(_texts(ended["status"]))
        # Its message id no longer holds it: sent again (to B), the work runs, once more.
        (pair.dir / "j3.go").touch()
        again = _rpc(pair.b, "SendMessage", {"message": message})
        assert again["task"]["id"] != task_id
        assert again["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert len([c for c in pair.calls() if c.startswith("start j3")]) == 2


def test_a_subscriber_on_b_follows_a_task_of_a_to_its_end(replicas: Replicas) -> None:
    sent = _rpc(
        replicas.a,
        "SendMessage",
        {"message": _crunch("j4"), "configuration": {"returnImmediately": True}},
    )
    task_id = sent["task"]["id"]
    wait_for(lambda: any(c.startswith("start j4") for c in replicas.calls()), what="j4 started")
    body = {"jsonrpc": "2.0", "id": 3, "method": "SubscribeToTask", "params": {"id": task_id}}
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", replicas.b + "/", json=body, headers=_HEADERS, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():  # bounded: the stream ends when the task does (or 30 s)
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            assert "error" not in event, event
            events.append(event["result"])
            if len(events) == 1:
                (replicas.dir / "j4.go").touch()  # subscribed: let A finish
    assert events[0]["task"]["id"] == task_id
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    artifacts = [e["artifactUpdate"]["artifact"] for e in events if "artifactUpdate" in e]
    assert artifacts
    assert artifacts[0]["parts"][0]["data"]["job"] == "j4"


def test_one_message_sent_to_both_replicas_at_once_runs_once(replicas: Replicas) -> None:
    """Two copies of one messageId, one to each replica within milliseconds: the key row is
    claimed before the run, so one replica runs the skill and the other answers its task."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    jobs = [f"race{i}" for i in range(6)]
    for job in jobs:
        (replicas.dir / f"{job}.go").touch()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for job in jobs:  # bounded: six messages
            message = _crunch(job)
            line = threading.Barrier(2, timeout=10)
            both = [pool.submit(_send_at, url, message, line) for url in (replicas.a, replicas.b)]
            first, second = (f.result(timeout=60) for f in both)
            assert first["task"]["id"] == second["task"]["id"], job
            assert first["task"]["status"]["state"] == "TASK_STATE_COMPLETED", first
            assert second["task"]["status"]["state"] == "TASK_STATE_COMPLETED", second
    for job in jobs:
        runs = [c for c in replicas.calls() if c.startswith(f"start {job} ")]
        assert len(runs) == 1, (job, runs)


def _send_at(url: str, message: dict[str, Any], line: Any) -> dict[str, Any]:
    """``SendMessage`` once both threads are at the start ``line`` (a ``threading.Barrier``)."""
    line.wait()
    return _rpc(url, "SendMessage", {"message": message})


async def test_a_push_config_set_on_b_is_delivered_for_a_task_run_on_a(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """The webhook config and the outbox are in the shared database: B, where the caller set
    its webhook, delivers the end of the task A ran, once."""
    import asyncio

    from tests.support import eventually
    from tests.test_push import webhook

    env = {"MESH_PUSH_NETWORKS": "loopback"}
    async with webhook() as hook:
        with _pair(postgres_server, tmp_path, "tests.replica_agents:agent", **env) as pair:
            sent = await asyncio.to_thread(
                _rpc,
                pair.a,
                "SendMessage",
                {"message": _crunch("p1"), "configuration": {"returnImmediately": True}},
            )
            task_id = sent["task"]["id"]
            created = await asyncio.to_thread(
                _rpc,
                pair.b,
                "CreateTaskPushNotificationConfig",
                {"taskId": task_id, "url": hook.url},
            )
            assert created["id"] == task_id
            (pair.dir / "p1.go").touch()
            await eventually(lambda: hook.got, within=30, what="the end pushed from a replica")
            assert hook.got[0][1]["task"]["id"] == task_id
            assert hook.got[0][1]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            await eventually(lambda: _outbox_empty(pair), within=30, what="nothing left to push")
        assert len(hook.got) == 1, hook.got


def _outbox_empty(pair: Replicas) -> bool:
    import psycopg

    with psycopg.connect(pair.store) as conn:
        row = conn.execute("select count(*) from a2a_push_outbox").fetchone()
    return row is not None and row[0] == 0


def _ask_message(skill: str, data: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "role": "ROLE_USER",
        "messageId": str(uuid.uuid4()),
        "parts": [{"data": data}],
        "metadata": {"skill": skill, **meta},
    }


def _kill(pair: Replicas, index: int) -> None:
    proc = pair.logs[index].popen
    proc.kill()  # kill -9
    proc.wait(timeout=10)


def test_a_waiting_task_whose_replica_died_ends_at_its_deadline_on_another(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.txt"
    env = {"NODE_TEST_CALLS": str(calls), "MESH_REPLICA_LEASE": "2"}
    with _pair(postgres_server, tmp_path, "tests.ask_agents:agent", **env) as pair:
        message = _ask_message(
            "review", {"applicant_id": "APP-9", "amount": 1000}, deadline=time.time() + 3
        )
        started = _rpc(pair.a, "SendMessage", {"message": message})["task"]
        assert started["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        _kill(pair, 0)  # the only replica whose clock knew the deadline
        ended = wait_for(
            lambda: (
                (t := _rpc(pair.b, "GetTask", {"id": started["id"]}))["status"]["state"]
                == "TASK_STATE_FAILED"
                and t
            ),
            timeout=20,
            what="the waiting task ended at its deadline by B",
        )
        assert ended["metadata"]["error"]["reason"] == "deadline"


def test_a_task_resuming_when_its_replica_died_runs_again_on_another(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    calls, hold = tmp_path / "calls.txt", tmp_path / "hold"
    hold.touch()
    env = {"NODE_TEST_CALLS": str(calls), "NODE_TEST_HOLD": str(hold), "MESH_REPLICA_LEASE": "2"}
    with _pair(postgres_server, tmp_path, "tests.ask_agents:agent", **env) as pair:
        started = _rpc(pair.a, "SendMessage", {"message": _ask_message("careful", {})})["task"]
        assert started["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        answer = {
            "role": "ROLE_USER",
            "messageId": str(uuid.uuid4()),
            "taskId": started["id"],
            "contextId": started["contextId"],
            "parts": [{"text": "yes"}],
        }
        _rpc(
            pair.a, "SendMessage", {"message": answer, "configuration": {"returnImmediately": True}}
        )

        def lines() -> list[str]:
            return calls.read_text().splitlines() if calls.exists() else []

        wait_for(lambda: "careful holding yes" in lines(), what="A resuming the task")
        _kill(pair, 0)  # mid-resume: its answer is recorded, its run lost
        hold.unlink()
        done = wait_for(
            lambda: (
                (t := _rpc(pair.b, "GetTask", {"id": started["id"]}))["status"]["state"]
                == "TASK_STATE_COMPLETED"
                and t
            ),
            timeout=30,
            what="the task run again by B to its end",
        )
        assert "yes" in json.dumps(done["artifacts"])
        assert lines().count("careful holding yes") == 2  # A's run, then B's with the answer
        assert lines().count("careful done yes") == 1
