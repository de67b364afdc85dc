"""A follower on replica B sees the progress of a task replica A runs (issue 17; one real
PostgreSQL, two real ``mesh serve`` processes of tests.replica_progress_agents): each state A
makes while followed reaches B through the replicas' feed (NOTIFY/LISTEN,
``mesh._a2a.task_feed``), in order, and B's stream ends at the task's end exactly once.

Each step is held until the test has seen the one before on B, so a progress report that does
not reach B stops the test (before the feed, B saw the first and the settled state only)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.postgres_support import PostgresServer
from tests.support import wait_for
from tests.test_replicas_pg import _HEADERS, Replicas, _pair, _rpc

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

STEPS = 3


@pytest.fixture(scope="module")
def replicas(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    with _pair(
        postgres_server,
        tmp_path_factory.mktemp("progress"),
        "tests.replica_progress_agents:agent",
    ) as pair:
        yield pair


def _subscribe(url: str, task_id: str, on_event: Any) -> list[tuple[str, dict[str, Any]]]:
    """B's SSE stream of ``task_id`` to its end: each result's kind and event, each handed to
    ``on_event(kind, event)`` as it comes."""
    body = {"jsonrpc": "2.0", "id": 3, "method": "SubscribeToTask", "params": {"id": task_id}}
    events: list[tuple[str, dict[str, Any]]] = []
    # Bounded: the stream ends with the task (the skill's gates wait at most max_s each).
    with httpx.stream("POST", url + "/", json=body, headers=_HEADERS, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data:"):
                continue
            answer = json.loads(line[5:])
            assert "error" not in answer, answer
            ((kind, event),) = answer["result"].items()
            events.append((kind, event))
            on_event(kind, event)
    return events


def _status_texts(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [
        part["text"]
        for kind, e in events
        if kind == "statusUpdate" and e["status"]["state"] == "TASK_STATE_WORKING"
        for part in e["status"].get("message", {}).get("parts", [])
        if "text" in part
    ]


def _ends(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [
        e["status"]["state"]
        for kind, e in events
        if kind == "statusUpdate" and e["status"]["state"] != "TASK_STATE_WORKING"
    ]


def _start_steps(replicas: Replicas, job: str, **extra: Any) -> str:
    """Send ``steps`` to A (not blocking): its task id, once it works."""
    message = {
        "role": "ROLE_USER",
        "messageId": str(uuid.uuid4()),
        "parts": [{"data": {"job": job, "count": STEPS, "max_s": 6, **extra}}],
        "metadata": {"skill": "steps"},
    }
    sent = _rpc(
        replicas.a,
        "SendMessage",
        {"message": message, "configuration": {"returnImmediately": True}},
    )
    task_id = str(sent["task"]["id"])
    wait_for(
        lambda: (
            _rpc(replicas.a, "GetTask", {"id": task_id})["status"]["state"] == "TASK_STATE_WORKING"
        ),
        what="the task working on A",
    )
    return task_id


def _feed_rows(replicas: Replicas, task_id: str) -> int:
    """States of ``task_id`` published by pointer (too big for a notification)."""
    import psycopg

    with psycopg.connect(replicas.store, autocommit=True) as conn:
        row = conn.execute(
            "select count(*) from mesh_task_feed where task_id = %s", (task_id,)
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("pad", [0, 9000], ids=["whole", "by-pointer"])
def test_a_follower_on_b_gets_each_progress_report_of_a_in_order(
    replicas: Replicas, pad: int
) -> None:
    """``by-pointer``: from step 2 on, each state is over NOTIFY's 8000 bytes, so B reads it
    from the row A wrote before notifying its pointer."""
    job = f"p{uuid.uuid4().hex[:6]}"
    task_id = _start_steps(replicas, job, pad=pad)
    opened = 0

    def step(kind: str, event: dict[str, Any]) -> None:
        nonlocal opened
        # The first event says B follows; each step seen on B lets A make the next one.
        texts = _status_texts([(kind, event)])
        seen = opened == 0 or (texts and texts[-1].rstrip(".") == f"{job} step {opened}")
        if seen and opened < STEPS:
            opened += 1
            (replicas.dir / f"{job}.{opened}").touch()

    events = _subscribe(replicas.b, task_id, step)
    assert events[0][0] == "task"
    assert events[0][1]["id"] == task_id
    texts = _status_texts(events)
    assert [t.rstrip(".") for t in texts] == [f"{job} step {i}" for i in range(1, STEPS + 1)]
    assert [len(t) - len(t.rstrip(".")) for t in texts] == [0, pad, pad]
    # One end, the last event; the answer came before it, whole.
    assert _ends(events) == ["TASK_STATE_COMPLETED"]
    assert events[-1][0] == "statusUpdate"
    last = [e for kind, e in events if kind == "artifactUpdate" and e.get("lastChunk")]
    assert last[-1]["artifact"]["parts"][0]["data"] == {"job": job, "steps": STEPS}
    assert (_feed_rows(replicas, task_id) > 0) == (pad > 0)


def test_a_follow_whose_listen_connections_drop_still_ends_once(replicas: Replicas) -> None:
    """NOTIFY is not durable: with every replica's LISTEN connection cut mid-task, what was
    sent meanwhile is lost, and B's poll of the stored task still ends the stream, once."""
    import psycopg

    job = f"d{uuid.uuid4().hex[:6]}"
    task_id = _start_steps(replicas, job)

    def cut_then_release(kind: str, event: dict[str, Any]) -> None:
        if kind != "task":
            return
        with psycopg.connect(replicas.store, autocommit=True) as conn:
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity "
                "where application_name = 'mesh-task-feed' and datname = current_database()"
            )
        for i in range(1, STEPS + 1):
            (replicas.dir / f"{job}.{i}").touch()

    events = _subscribe(replicas.b, task_id, cut_then_release)
    assert _ends(events) == ["TASK_STATE_COMPLETED"]
    assert events[-1][0] == "statusUpdate"
    last = [e for kind, e in events if kind == "artifactUpdate" and e.get("lastChunk")]
    assert last[-1]["artifact"]["parts"][0]["data"] == {"job": job, "steps": STEPS}


def test_a_follower_on_b_gets_the_answer_a_streams_in_chunks(replicas: Replicas) -> None:
    context = f"ctx-{uuid.uuid4().hex[:8]}"
    message = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "contextId": context,
        "parts": [{"text": "wait please"}],
    }
    sent = _rpc(
        replicas.a,
        "SendMessage",
        {"message": message, "configuration": {"returnImmediately": True}},
    )
    task_id = sent["task"]["id"]

    def release(kind: str, event: dict[str, Any]) -> None:
        (replicas.dir / f"{context}.go").touch()  # B follows: let the turn go on

    events = _subscribe(replicas.b, task_id, release)
    chunks = [
        e["artifact"]["parts"][0]["text"]
        for kind, e in events
        if kind == "artifactUpdate" and not e.get("lastChunk")
    ]
    # The scripted model's chunks, each as A made it, then the whole answer, then the end.
    assert chunks == ["released true ", "after the ", "gate"]
    appended = [e.get("append", False) for kind, e in events if kind == "artifactUpdate"]
    assert appended[:3] == [False, True, True]
    last = [e for kind, e in events if kind == "artifactUpdate" and e.get("lastChunk")]
    assert last[-1]["artifact"]["parts"][0]["text"] == "released true after the gate"
    assert _ends(events) == ["TASK_STATE_COMPLETED"]
    assert events[-1][0] == "statusUpdate"
