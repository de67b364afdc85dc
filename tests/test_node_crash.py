"""kill -9 with tasks in flight: after the restart no task is left SUBMITTED/WORKING. Each one
ended FAILED with reason ``interrupted``, and a re-send of its messageId runs the work again as a
new task (the caller's retry is how work cut by a crash resumes)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import httpx
import pytest
from a2a.types import TaskState

from tests.holder_support import UNSETTLED, Holder, error_of, status_text
from tests.support import eventually, wait_for

pytestmark = pytest.mark.integration

_ON_DISK_UNSETTLED = {TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING}


def _assert_interrupted(task: dict[str, object]) -> None:
    assert task["status"]["state"] == "TASK_STATE_FAILED", task  # type: ignore[index]
    error = error_of(task)  # type: ignore[arg-type]
    assert error["reason"] == "interrupted"
    text = status_text(task)  # type: ignore[arg-type]
    assert "stopped while" in text
    assert "send the message again" in text
    assert error["message"] == text


async def _resend_runs_again(
    node: Holder, http: httpx.AsyncClient, key: str, old_id: str | None
) -> None:
    r = await node.send(http, key, message_id=f"m-{key}")
    assert r.status_code == 200, r.text
    task = r.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["id"] != old_id  # a new task: the interrupted one did not hold the message
    assert task["artifacts"][0]["parts"][0]["data"] == {"key": key}
    assert len(node.calls(f"hold ran {key}")) == 1
    # Idempotency is otherwise unchanged: a duplicate of the completed task gets it back.
    again = await node.send(http, key, message_id=f"m-{key}")
    assert again.json()["result"]["task"]["id"] == task["id"]


async def test_tasks_in_their_skill_at_a_kill_9_end_interrupted_and_run_again_when_resent(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    node.hold()
    known: dict[str, str] = {}  # key -> task id, of the tasks the client learned of
    blocking = [f"b{i}" for i in range(3)]
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        with node.serve() as proc:
            for key in ("n0", "n1", "n2", "n3"):
                r = await node.send(http, key, message_id=f"m-{key}", wait=False)
                known[key] = r.json()["result"]["task"]["id"]
            # Blocking callers too: their first save is queued, not awaited (write-behind).
            waiting = [
                asyncio.create_task(node.send(http, key, message_id=f"m-{key}")) for key in blocking
            ]
            await eventually(
                lambda: len(node.calls("hold start")) == 7, what="every skill to start"
            )
            states = node.disk_states()
            assert {states[t] for t in known.values()} <= _ON_DISK_UNSETTLED
            proc.kill()
            for call in waiting:
                with contextlib.suppress(httpx.HTTPError):
                    await call
        assert node.calls("hold ran") == []
        node.release()
        with node.serve():
            for task_id in known.values():
                _assert_interrupted(await node.get_task(http, task_id))
            listed = await node.list_tasks(http)
            assert {t["id"] for t in listed} >= set(known.values())
            # A blocking send's task may be absent (nobody heard of it); present, it ended too.
            for task in listed:
                assert task["status"]["state"] not in UNSETTLED
                _assert_interrupted(task)
            for key, task_id in known.items():
                await _resend_runs_again(node, http, key, task_id)
            for key in blocking:
                await _resend_runs_again(node, http, key, None)


async def test_a_task_whose_skill_ran_but_whose_end_was_not_saved_is_interrupted(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    node.hold()
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        with node.serve() as proc:
            r = await node.send(http, "k", message_id="m-k", wait=False)
            task_id = r.json()["result"]["task"]["id"]
            await eventually(lambda: node.calls("hold start k"), what="the skill to start")
            assert node.disk_states()[task_id] in _ON_DISK_UNSETTLED
            # Another connection holds SQLite's write lock: the node's final save cannot land.
            lock = sqlite3.connect(node.data / "node.db", timeout=5, isolation_level=None)
            try:
                lock.execute("begin immediate")
                node.release()  # the skill does its work and returns
                wait_for(lambda: node.calls("hold ran k"), what="the skill to finish")
                proc.kill()
            finally:
                lock.execute("rollback")
                lock.close()
        assert node.disk_states()[task_id] in _ON_DISK_UNSETTLED
        with node.serve():
            _assert_interrupted(await node.get_task(http, task_id))
            # The work ran once before the crash; the re-send runs it again (at-least-once).
            r = await node.send(http, "k", message_id="m-k")
            task = r.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"
            assert task["id"] != task_id
            assert len(node.calls("hold ran k")) == 2
