"""SIGTERM past the drain grace: every task still running ends FAILED with reason ``shutdown``,
on disk before the process exits; blocking callers get a JSON-RPC answer with that task (never
an HTTP 500), streams get that final status and a clean end; and ``remote()`` takes the answer
as "this instance is unavailable", so the same message goes to another instance."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh._remote import remote
from mesh._resilience import RetryPolicy
from mesh._tools import ToolContext
from tests.holder_support import Holder, error_of, status_text
from tests.support import StaticDiscovery, eventually

pytestmark = pytest.mark.integration


def _assert_shutdown(task: dict[str, Any]) -> None:
    assert task["status"]["state"] == "TASK_STATE_FAILED", task
    assert error_of(task)["reason"] == "shutdown"
    assert "shut down" in status_text(task)


@pytest.mark.parametrize("fastpath", ["1", "0"], ids=["fast-path", "sdk-path"])
async def test_tasks_past_the_grace_end_failed_shutdown_and_every_caller_hears_it(
    tmp_path: Path, fastpath: str
) -> None:
    node = Holder(tmp_path)
    node.hold()
    blocking = [f"b{i}" for i in range(4)]
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        with node.serve(grace=1, MESH_FASTPATH=fastpath) as proc:
            r = await node.send(http, "n0", message_id="m-n0", wait=False)
            detached = r.json()["result"]["task"]["id"]  # nobody waits for this one
            calls = [
                asyncio.create_task(node.send(http, key, message_id=f"m-{key}")) for key in blocking
            ]
            stream = asyncio.create_task(node.stream(http, "s0", message_id="m-s0", events=events))
            await eventually(lambda: len(node.calls("hold start")) == 6, what="skills to start")
            proc.popen.send_signal(signal.SIGTERM)
            answers = await asyncio.wait_for(asyncio.gather(*calls), 20)
            await asyncio.wait_for(stream, 20)  # ends cleanly (raises if the stream is cut)
            assert await asyncio.to_thread(proc.popen.wait, 20) == 0
        assert node.calls("hold ran") == []
        task_ids = [detached]
        for answer in answers:
            assert answer.status_code == 200, answer.text
            task = answer.json()["result"]["task"]
            _assert_shutdown(task)
            task_ids.append(task["id"])
        final = events[-1]["statusUpdate"]
        assert final["status"]["state"] == "TASK_STATE_FAILED"
        assert final["metadata"]["error"]["reason"] == "shutdown"
        task_ids.append(final["taskId"])
        node.release()
        with node.serve():
            for task_id in task_ids:
                _assert_shutdown(await node.get_task(http, task_id))
            # The message of a task ended by the shutdown is free: a re-send runs it.
            again = await node.send(http, "b0", message_id="m-b0")
            task = again.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"
            assert task["id"] not in task_ids
            assert node.calls("hold ran") == ["hold ran b0"]


async def test_a_delegation_cut_by_a_shutdown_completes_on_another_instance(
    tmp_path: Path,
) -> None:
    stopping = Holder(tmp_path, "stopping")
    healthy = Holder(tmp_path, "healthy")
    stopping.hold()
    with stopping.serve(grace=1) as proc, healthy.serve():
        rem = remote("test-holder", policy=RetryPolicy(initial_delay=0.05))
        # The first try of a fresh toolset goes to the second instance listed.
        rem.bind(discovery=StaticDiscovery([healthy.url, stopping.url]))  # type: ignore[arg-type]
        ctx = ToolContext(agent_name="tester", user_id="u", session_id="s", invocation_id="i")
        try:
            tools = {t.name: t for t in await rem.tools(ctx)}
            call = asyncio.create_task(tools["test_holder_hold"].call({"key": "d1"}, ctx))
            await eventually(lambda: stopping.calls("hold start d1"), what="the first try")
            proc.popen.send_signal(signal.SIGTERM)
            result = await asyncio.wait_for(call, 20)
        finally:
            await rem.aclose()
        assert await asyncio.to_thread(proc.popen.wait, 20) == 0
    assert result == {"key": "d1"}
    record = rem.recent[-1]
    assert (record.attempts, record.target, record.outcome) == (2, healthy.url, "ok")
    assert healthy.calls("hold ran d1") == ["hold ran d1"]
    assert stopping.calls("hold ran") == []


async def test_a_drain_returns_only_once_the_answers_are_sent(tmp_path: Path) -> None:
    """The server is told to exit when the drain returns, and exiting cuts open streams: so the
    drain, after the tasks, waits for the answers still being written (a stream's last event)."""
    from mesh._node import Node
    from mesh._settings import NodeSettings
    from tests.node_agents import agent

    node = Node(agent, NodeSettings(data_dir=tmp_path, registry=None, grace_seconds=0.1))
    async with node.app.router.lifespan_context(node.app):
        node.exchanges.begin()  # an answer the gate is still sending
        drain = asyncio.create_task(node.drain())
        done, _ = await asyncio.wait({drain}, timeout=0.5)
        assert not done, "the drain returned while an answer was still being sent"
        assert node.draining
        node.exchanges.end()
        assert await asyncio.wait_for(drain, 5) is True
