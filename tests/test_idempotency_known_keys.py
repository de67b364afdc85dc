"""On SQLite a new ``messageId`` is known absent without a read (``mesh._a2a.known_keys``),
and a repeated one still finds its task: in the same process, after a restart of the node,
and once its key was released."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh._a2a.idempotency import IdempotencyKeys
from mesh._a2a.known_keys import KnownKeys
from mesh._sqlite import Database
from tests.support import clean_env, free_port, running


class CountedReads:
    """The node's real database, counting what goes to its thread as a read."""

    def __init__(self, db: Database) -> None:
        self.db, self.reads = db, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)

    async def read(self, fn: Any) -> Any:
        self.reads += 1
        return await self.db.read(fn)


def test_a_key_added_is_always_maybe_and_most_new_keys_are_not() -> None:
    keys = [("", "caller", uuid.uuid4().hex) for _ in range(20_000)]
    known = KnownKeys(keys[:10_000], expected=10_000)
    for key in keys[10_000:15_000]:
        known.add(key)
    assert all(key in known for key in keys[:15_000])
    false_maybe = sum(key in known for key in keys[15_000:])
    assert false_maybe < 50  # of 5,000 new keys: the rate is ~0.01 % at this size


async def test_a_new_message_skips_the_read_and_a_recorded_one_is_found_after_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.db"
    key, other = ("", "coordinator", "m-1"), ("", "coordinator", "m-2")
    db = CountedReads(await Database.open(path))
    try:
        keys = IdempotencyKeys(db)  # type: ignore[arg-type]
        await keys.initialize()
        db.reads = 0
        assert await keys.claim(key) is None
        assert db.reads == 0, "a key never recorded went to the database thread"
        await keys.record(key, "task-1")
        keys.end(key)
        assert await keys.claim(key) == "task-1"
        assert db.reads == 1
    finally:
        await db.aclose()

    db = CountedReads(await Database.open(path))  # the node restarted: memory is gone
    try:
        keys = IdempotencyKeys(db)  # type: ignore[arg-type]
        await keys.initialize()
        assert await keys.claim(key) == "task-1"
        assert await keys.claim(other) is None
        keys.end(other)
        keys.release(key, "task-1")
        await db.write(lambda conn: None)  # the release is committed with the next write
        assert await keys.claim(key) is None  # released: the message runs again
    finally:
        await db.aclose()


@pytest.mark.integration
def test_a_message_sent_again_after_a_restart_runs_once(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    env = clean_env(NODE_TEST_CALLS=str(calls))
    message_id = uuid.uuid4().hex

    def send(url: str, message_id: str) -> dict[str, Any]:
        message = {
            "role": "ROLE_USER",
            "messageId": message_id,
            "parts": [{"data": {"key": message_id}}],
            "metadata": {"skill": "echo"},
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        r = httpx.post(url + "/", json=body, headers={"A2A-Version": "1.0"}, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json()["result"]["task"])

    tasks = []
    for life in range(2):
        port = free_port()
        argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
        argv += ["--data-dir", str(tmp_path / "data")]
        health = f"http://127.0.0.1:{port}/health"
        with running(argv, name=f"keys-{life}", tmp=tmp_path, env=env, health=health):
            tasks.append(send(f"http://127.0.0.1:{port}", message_id))
            tasks.append(send(f"http://127.0.0.1:{port}", message_id))
            if life == 1:
                send(f"http://127.0.0.1:{port}", uuid.uuid4().hex)
    assert {task["id"] for task in tasks} == {tasks[0]["id"]}
    assert all(task["status"]["state"] == "TASK_STATE_COMPLETED" for task in tasks)
    runs = calls.read_text().splitlines()
    assert runs.count(f"echo {message_id}") == 1
    assert len(runs) == 2
