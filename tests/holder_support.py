"""A real ``mesh serve tests.node_agents:holder`` node whose ``hold`` skill a test can hold
mid-run (while the hold file exists), for the crash and shutdown tests.

    node = Holder(tmp_path)
    node.hold()                        # tasks started now wait in their skill
    with node.serve(grace=1) as proc:  # real process on a free port, data in tmp_path/data
        task = await node.send(http, "k1", message_id="m-1", wait=False)
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support import Proc, clean_env, free_port, running

HEADERS = {"A2A-Version": "1.0"}
UNSETTLED = {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_UNSPECIFIED"}


def message(key: str, message_id: str) -> dict[str, Any]:
    return {
        "role": "ROLE_USER",
        "messageId": message_id,
        "parts": [{"data": {"key": key}}],
        "metadata": {"skill": "hold", "caller": "tester"},
    }


def rpc(method: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def error_of(task: dict[str, Any]) -> dict[str, Any]:
    """``metadata.error`` of a task in its JSON form ({} when absent)."""
    return dict(task.get("metadata", {}).get("error", {}))


def status_text(task: dict[str, Any]) -> str:
    parts = task.get("status", {}).get("message", {}).get("parts", [])
    return " ".join(p.get("text", "") for p in parts)


class Holder:
    """One node's port, data dir, hold file and call log; it can be started several times."""

    def __init__(self, tmp: Path, name: str = "holder") -> None:
        self.tmp = tmp
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp / f"{name}-data"
        self.hold_file = tmp / f"{name}.hold"
        self.calls_file = tmp / f"{name}-calls.txt"
        self.runs = 0

    def hold(self) -> None:
        self.hold_file.touch()

    def release(self) -> None:
        self.hold_file.unlink(missing_ok=True)

    def calls(self, prefix: str) -> list[str]:
        if not self.calls_file.exists():
            return []
        return [
            line for line in self.calls_file.read_text().splitlines() if line.startswith(prefix)
        ]

    @contextlib.contextmanager
    def serve(self, *, grace: float = 10.0, **env: str) -> Iterator[Proc]:
        self.runs += 1
        argv = [
            "mesh", "serve", "tests.node_agents:holder", "--port", str(self.port),
            "--data-dir", str(self.data), "--no-register", "--grace", str(grace),
        ]  # fmt: skip
        child_env = clean_env(
            NODE_TEST_CALLS=str(self.calls_file), NODE_TEST_HOLD=str(self.hold_file), **env
        )
        with running(
            argv,
            name=f"{self.name}-{self.runs}",
            tmp=self.tmp,
            env=child_env,
            health=f"{self.url}/health",
        ) as proc:
            yield proc

    def disk_states(self) -> dict[str, int]:
        """``{task id: state}`` as another process reads node.db right now."""
        conn = sqlite3.connect(self.data / "node.db", timeout=5)
        try:
            return dict(conn.execute("select id, state from a2a_tasks").fetchall())
        finally:
            conn.close()

    async def send(
        self, http: httpx.AsyncClient, key: str, *, message_id: str, wait: bool = True
    ) -> httpx.Response:
        params: dict[str, Any] = {"message": message(key, message_id)}
        if not wait:
            params["configuration"] = {"returnImmediately": True}
        return await http.post(self.url + "/", json=rpc("SendMessage", params), headers=HEADERS)

    async def get_task(self, http: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
        r = await http.post(self.url + "/", json=rpc("GetTask", {"id": task_id}), headers=HEADERS)
        assert r.status_code == 200, r.text
        return dict(r.json()["result"])

    async def list_tasks(self, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        r = await http.post(
            self.url + "/", json=rpc("ListTasks", {"pageSize": 100}), headers=HEADERS
        )
        assert r.status_code == 200, r.text
        return list(r.json()["result"].get("tasks", []))

    async def stream(
        self, http: httpx.AsyncClient, key: str, *, message_id: str, events: list[dict[str, Any]]
    ) -> None:
        """SendStreamingMessage; each JSON-RPC result is appended to ``events`` as it arrives.
        Returns when the server ends the stream (raises if it is cut)."""
        body = rpc("SendStreamingMessage", {"message": message(key, message_id)})
        headers = {**HEADERS, "Accept": "text/event-stream"}
        async with http.stream("POST", self.url + "/", json=body, headers=headers) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:])["result"])
