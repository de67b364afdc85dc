"""A function skill's first task save held in memory for ``FIRST_SAVE_WAIT_S`` (ad616a6) and
written with its final one: attacked through a real node (``mesh serve``, its SQLite file),
its process killed inside the window and right after the answers.

The agent below is served by the node: ``count`` records each run in a file (so a test counts
real executions across restarts); ``die`` kills its own process with SIGKILL the first time it
runs, microseconds after its task's first save, which is then still only in memory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from mesh import Agent, skill
from tests.support import clean_env, free_port, running

pytestmark = pytest.mark.integration

_CALLS = "S26_WINDOW_CALLS"
HEADERS = {"A2A-Version": "1.0"}


class Item(BaseModel):
    key: str


class Counted(BaseModel):
    key: str


def _runs(key: str) -> int:
    path = Path(os.environ[_CALLS])
    return path.read_text().split().count(key) if path.exists() else 0


def _record(key: str) -> None:
    with Path(os.environ[_CALLS]).open("a") as fh:
        fh.write(key + "\n")


@skill
def count(req: Item) -> Counted:
    """Record the run and answer at once (well inside the window)."""
    _record(req.key)
    return Counted(key=req.key)


@skill
def die(req: Item) -> Counted:
    """The first run kills the node inside its task's window; a run after that answers."""
    first = _runs(req.key) == 0
    _record(req.key)
    if first:
        os.kill(os.getpid(), signal.SIGKILL)
    return Counted(key=req.key)


agent = Agent(name="s26-window", skills=[count, die])


def _send(skill_id: str, key: str, message_id: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": message_id,
                "parts": [{"data": {"key": key}}],
                "metadata": {"skill": skill_id, "caller": "attacker"},
            }
        },
    }


def _stored(path: Path) -> list[tuple[str, int]]:
    """Every task row another process (a restarted node, the CLI) reads: (id, state)."""
    conn = sqlite3.connect(path)
    try:
        return [(str(r[0]), int(r[1])) for r in conn.execute("select id, state from a2a_tasks")]
    finally:
        conn.close()


def _node(tmp_path: Path, port: int, calls: Path) -> tuple[list[str], dict[str, str], str]:
    argv = ["mesh", "serve", f"{__name__}:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data")]
    return argv, clean_env(**{_CALLS: str(calls)}), f"http://127.0.0.1:{port}"


async def test_copies_sent_at_once_inside_the_window_run_once_and_survive_kill_9(
    tmp_path: Path,
) -> None:
    port = free_port()
    calls = tmp_path / "calls"
    argv, env, url = _node(tmp_path, port, calls)
    mid = uuid.uuid4().hex
    body = _send("count", "k1", mid)
    with running(argv, name="first", tmp=tmp_path, env=env, health=f"{url}/health") as proc:
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            # All copies arrive while the first one's task is in memory only.
            answers = await asyncio.gather(
                *(http.post(url + "/", json=body, headers=HEADERS) for _ in range(8))
            )
        proc.kill()  # right after the answers: no shutdown writes anything more
    tasks = [a.json()["result"]["task"] for a in answers]
    assert {t["id"] for t in tasks} == {tasks[0]["id"]}
    assert {t["status"]["state"] for t in tasks} == {"TASK_STATE_COMPLETED"}
    assert calls.read_text().split() == ["k1"]
    # The answered task is on disk, completed, with its key (the Bloom filter of known keys is
    # rebuilt from the file at start: the copy sent again is found, not run).
    assert _stored(tmp_path / "data" / "node.db") == [(tasks[0]["id"], 3)]
    with running(argv, name="second", tmp=tmp_path, env=env, health=f"{url}/health"):
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            again = (await http.post(url + "/", json=body, headers=HEADERS)).json()
    assert again["result"]["task"]["id"] == tasks[0]["id"]
    assert calls.read_text().split() == ["k1"]


async def test_a_node_killed_inside_the_window_leaves_the_message_free_to_run_again(
    tmp_path: Path,
) -> None:
    port = free_port()
    calls = tmp_path / "calls"
    argv, env, url = _node(tmp_path, port, calls)
    mid = uuid.uuid4().hex
    body = _send("die", "k2", mid)
    with running(argv, name="first", tmp=tmp_path, env=env, health=f"{url}/health") as proc:
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            with pytest.raises(httpx.TransportError):  # the node died answering
                await http.post(url + "/", json=body, headers=HEADERS)
        assert proc.popen.wait(timeout=10) == -signal.SIGKILL
    # Nobody heard of the task; its first state is in memory only (unless a loaded host let
    # the window pass first: then on disk, and ended as interrupted by the restart below).
    assert all(state != 3 for _, state in _stored(tmp_path / "data" / "node.db"))
    with running(argv, name="second", tmp=tmp_path, env=env, health=f"{url}/health"):
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            again = (await http.post(url + "/", json=body, headers=HEADERS)).json()
            task = again["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"
            listing = {"jsonrpc": "2.0", "id": 2, "method": "ListTasks", "params": {}}
            listed = (await http.post(url + "/", json=listing, headers=HEADERS)).json()
    # Cut by the crash, done again through the caller's retry (at least once); no task is
    # left looking as if it still ran.
    assert calls.read_text().split() == ["k2", "k2"]
    states = {t["id"]: t["status"]["state"] for t in listed["result"]["tasks"]}
    assert states.pop(task["id"]) == "TASK_STATE_COMPLETED"
    assert set(states.values()) <= {"TASK_STATE_FAILED"}
