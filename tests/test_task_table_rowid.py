"""Version 5 of the ``tasks`` component: ``a2a_tasks`` becomes a rowid table (a WITHOUT ROWID
row over ~1,000 bytes took a 4 KiB overflow page of its own). A node.db written at version 4
opens under this code, is migrated in place, and the node serves what it held: its tasks
(GetTask, ListTasks), its idempotency keys and its resume points. Real SQLite file, real node."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from a2a.types import Artifact, Message, Part, Role, Task, TaskState, TaskStatus
from google.protobuf.json_format import ParseDict

from mesh._a2a import idempotency, store
from mesh._a2a.waits import TASKS_SCHEMA_V2, WaitStore
from mesh._asks import Question
from mesh._sqlite import Database
from tests.holder_support import Holder, error_of

pytestmark = pytest.mark.integration

OLD_TASKS = 120  # more than one ListTasks page (100)
# The steps a version-4 mesh ran for the tasks component, as it ran them.
V4_STEPS = [store._SCHEMA, TASKS_SCHEMA_V2, store.TASKS_SCHEMA_V3, store.TASKS_SCHEMA_V4]


def _old_task(i: int) -> Task:
    """A finished task of the holder's skill, ~1.5 KiB stored (an overflowing row at v4)."""
    task = Task(
        id=f"old-{i:03d}",
        context_id=f"ctx-{i:03d}",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
    )
    # An hour ago, a second apart: within retention's defaults.
    task.status.timestamp.FromNanoseconds(time.time_ns() - 3600 * 10**9 + i * 10**9)
    task.history.append(
        Message(
            role=Role.ROLE_USER,
            message_id=f"m-old-{i:03d}",
            parts=[Part(text="x" * 1200)],
        )
    )
    artifact = Artifact(artifact_id="a-0")
    ParseDict({"data": {"key": f"old-{i:03d}"}}, artifact.parts.add())
    task.artifacts.append(artifact)
    return task


def _schema_sql(path: Path, name: str) -> str:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("select sql from sqlite_schema where name = ?", (name,)).fetchone()
        version = conn.execute("select version from mesh_schema where component = 'tasks'")
        return f"{row[0]}\nversion {version.fetchone()[0]}"
    finally:
        conn.close()


async def _write_v4_file(path: Path) -> None:
    """node.db as a version-4 node left it: tasks, their keys, one waiting task's resume
    point (its deadline passed while the node was down)."""
    db = await Database.open(path)
    try:
        assert await db.migrate("tasks", V4_STEPS) == 4
        await db.ensure_schema("a2a_message_keys", idempotency._SCHEMA)
        rows = []
        for i in range(OLD_TASKS):
            task = _old_task(i)
            ns = task.status.timestamp.ToNanoseconds()
            rows.append(("", task.id, task.context_id, int(task.status.state), ns,
                         task.SerializeToString(), None, ns))  # fmt: skip
        waiting = Task(
            id="old-wait",
            context_id="ctx-wait",
            status=TaskStatus(state=TaskState.TASK_STATE_INPUT_REQUIRED),
        )
        rows.append(("", "old-wait", "ctx-wait", int(waiting.status.state), 1,
                     waiting.SerializeToString(), None, 1))  # fmt: skip

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany("insert into a2a_tasks values (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            conn.executemany(
                "insert into a2a_message_keys values ('', 'tester', ?, ?)",
                [(f"m-old-{i:03d}", f"old-{i:03d}") for i in range(OLD_TASKS)],
            )

        await db.write(write)
        await WaitStore(db).suspend(
            owner="",
            task_id="old-wait",
            context_id="ctx-wait",
            skill="hold",
            request=b"",
            deadline=time.time() - 1,
            question=Question(id="q-0", text="Approve?"),
            seq=0,
        )
    finally:
        await db.aclose()


async def test_a_version_4_file_is_migrated_and_its_tasks_keys_and_resume_points_served(
    tmp_path: Path,
) -> None:
    node = Holder(tmp_path)
    node.data.mkdir()
    path = node.data / "node.db"
    await _write_v4_file(path)
    assert "without rowid" in _schema_sql(path, "a2a_tasks")

    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        with node.serve():
            # The tasks, whole, by id and in the listing's order (its index was rebuilt).
            for i in (0, 57, OLD_TASKS - 1):
                got = await node.get_task(http, f"old-{i:03d}")
                assert got["status"]["state"] == "TASK_STATE_COMPLETED"
                assert got["history"][0]["parts"][0]["text"] == "x" * 1200
                assert got["artifacts"][0]["parts"][0]["data"] == {"key": f"old-{i:03d}"}
            # The waiting task ended at start-up (below): it is the newest.
            listed = [t["id"] for t in await node.list_tasks(http)]
            assert listed == ["old-wait", *(f"old-{i:03d}" for i in range(OLD_TASKS - 1, 20, -1))]
            # The idempotency key: the same message gets the old task back, nothing runs.
            r = await node.send(http, "old-005", message_id="m-old-005")
            assert r.json()["result"]["task"]["id"] == "old-005", r.text
            assert node.calls("hold ran") == []
            # The resume point: recovery found it (deadline passed: FAILED deadline; without
            # it the task would have been left waiting).
            ended = await node.get_task(http, "old-wait")
            assert ended["status"]["state"] == "TASK_STATE_FAILED"
            assert error_of(ended)["reason"] == "deadline"
            # New tasks land in the new table.
            r = await node.send(http, "new", message_id="m-new")
            new = r.json()["result"]["task"]
            assert new["status"]["state"] == "TASK_STATE_COMPLETED"

    sql = _schema_sql(path, "a2a_tasks")
    assert "without rowid" not in sql.lower()
    assert sql.endswith("version 7")  # and on to versions 6 and 7 (two indexes made again)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("select count(*) from a2a_tasks").fetchone()[0] == OLD_TASKS + 2
        indexes = {
            r[0]
            for r in conn.execute(
                "select name from sqlite_schema where type = 'index' and tbl_name = 'a2a_tasks'"
            )
        }
        assert indexes == {
            "sqlite_autoindex_a2a_tasks_1",  # the primary key (owner, id), unique
            "a2a_tasks_by_time",
            "a2a_tasks_by_context",
            "a2a_tasks_by_trace",
            "a2a_tasks_ended",
        }
        # The rows no longer spill: no overflow page for ~1.5 KiB tasks.
        overflow = conn.execute(
            "select count(*) from dbstat where name = 'a2a_tasks' and pagetype = 'overflow'"
        ).fetchone()[0]
        assert overflow == 0
    finally:
        conn.close()
