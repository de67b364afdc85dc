"""Long-running delegations (issue 13 item 5): two real ``mesh serve`` nodes of
tests.long_agents, the coordinator reaching its child through a TCP proxy in this test that can
cut the connections under it.

``long-child``'s skill is declared ``long_running`` on its card, so the coordinator sends without
waiting and follows the child by ``SubscribeToTask``: a stream cut under it is read again and the
call completes with the child's answer (the skill ran once); a cancel at the top and a deadline
passing reach the child while it works. A child lost with its node (the node killed, or ended the
task ``interrupted`` at its restart) is sent again, as a blocking call would be."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import CancelTaskRequest, ListTasksRequest, SendMessageRequest, Task, TaskState
from google.protobuf.json_format import MessageToDict

from tests.registry_support import instances, registry
from tests.support import Proc, clean_env, eventually, free_port, wait_until_ok
from tests.test_node_ask import get, message, send

pytestmark = pytest.mark.integration

EXT = "urn:mesh:tasks:v1"

ENDED = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
}


@dataclass
class Proxy:
    """A TCP proxy to ``upstream``: counts the connections that carried a SubscribeToTask and
    can cut those open now (``cut``)."""

    upstream: int
    port: int = 0
    subscribes: int = 0
    _subscribed: set[asyncio.StreamWriter] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _handlers: set[asyncio.Task[None]] = field(default_factory=set)
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    def cut(self) -> int:
        """Abort every connection that carried a subscription; how many there were."""
        cut = len(self._subscribed)
        for writer in self._subscribed:
            writer.transport.abort()
        self._subscribed.clear()
        return cut

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await src.read(65536):
                    if up and b"SubscribeToTask" in chunk:
                        self.subscribes += 1
                        self._subscribed.add(writer)
                    dst.write(chunk)
                    await dst.drain()
            # One side ended: so does the other (a cut client connection cuts upstream too).
            dst.transport.abort()

        await asyncio.gather(
            pump(reader, up_writer, True), pump(up_reader, writer, False), return_exceptions=True
        )
        self._subscribed.discard(writer)


@dataclass
class Pair:
    tmp: Path
    top: str
    child: str
    proxy: Proxy
    top_argv: list[str]
    child_argv: list[str]
    env: dict[str, str]
    top_proc: Proc | None = None
    child_proc: Proc | None = None
    runs: int = 0

    def start_top(self) -> Proc:
        self.runs += 1
        proc = Proc.start(self.top_argv, name=f"top-{self.runs}", tmp=self.tmp, env=self.env)
        wait_until_ok(f"{self.top}/health", proc=proc)
        self.top_proc = proc
        return proc

    def start_child(self) -> Proc:
        proc = Proc.start(self.child_argv, name=f"child-{self.runs}", tmp=self.tmp, env=self.env)
        wait_until_ok(f"{self.child}/health", proc=proc)
        self.child_proc = proc
        return proc

    def waits(self) -> list[tuple[str, str]]:
        """(task id, state) of the coordinator's resume points on disk."""
        return waits(self.tmp / "top")

    def calls(self) -> list[str]:
        return calls(self.tmp)

    def release(self, job: str) -> None:
        (self.tmp / f"{job}.go").touch()


def waits(data_dir: Path) -> list[tuple[str, str]]:
    """(task id, state) of the resume points on disk of the node of ``data_dir``."""
    conn = sqlite3.connect(data_dir / "node.db", timeout=5)
    try:
        return list(conn.execute("select task_id, state from mesh_waits").fetchall())
    finally:
        conn.close()


def calls(tmp: Path) -> list[str]:
    """What long-child's skills noted, in order."""
    path = tmp / "calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    child_port, top_port = free_port(), free_port()
    proxy = Proxy(child_port)
    await proxy.start()
    env = clean_env(
        LONG_TEST_DIR=str(tmp_path), LONG_TEST_CHILD_URL=f"http://127.0.0.1:{proxy.port}"
    )
    argv = {
        name: ["mesh", "serve", f"tests.long_agents:{name}", "--port", str(port),
               "--data-dir", str(tmp_path / name), "--no-register", "--grace", "1"]
        for name, port in (("child", child_port), ("top", top_port))
    }  # fmt: skip
    pair = Pair(
        tmp_path,
        f"http://127.0.0.1:{top_port}",
        f"http://127.0.0.1:{child_port}",
        proxy,
        argv["top"],
        argv["child"],
        env,
    )
    try:
        pair.start_child()
        pair.start_top()
        yield pair
    finally:
        for proc in (pair.top_proc, pair.child_proc):
            if proc is not None:
                proc.terminate()
        await proxy.close()


async def client_for(http: httpx.AsyncClient, url: str) -> Client:
    card = await A2ACardResolver(http, url).get_agent_card()
    return ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)


async def child_tasks(client: Client) -> list[Task]:
    return list((await client.list_tasks(ListTasksRequest(page_size=50))).tasks)


async def ended(client: Client, task_id: str) -> Task | None:
    task = await get(client, task_id)
    return task if task.status.state in ENDED else None


async def test_a_stream_cut_under_the_coordinator_is_followed_again_and_completes(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    top = await client_for(http, pair.top)
    task = await send(top, message(text="crunch j1"), wait=False)
    await eventually(lambda: "start j1" in pair.calls() and pair.proxy.subscribes >= 1, within=20)
    before = pair.proxy.subscribes
    assert pair.proxy.cut() >= 1
    # The coordinator reads the child again (a new subscription), not a second run.
    await eventually(lambda: pair.proxy.subscribes > before, within=20, what="a new subscription")
    pair.release("j1")
    done = await eventually(lambda: ended(top, task.id), within=30)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    assert "top got j1" in done.artifacts[-1].parts[0].text
    assert pair.calls() == ["start j1", "done j1"]


async def test_a_cancel_at_the_top_reaches_the_long_child(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    top, child = await client_for(http, pair.top), await client_for(http, pair.child)
    task = await send(top, message(text="crunch j2"), wait=False)
    await eventually(lambda: "start j2" in pair.calls() and pair.proxy.subscribes >= 1, within=20)
    canceled = await top.cancel_task(CancelTaskRequest(id=task.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED

    async def child_canceled() -> bool:
        states = [t.status.state for t in await child_tasks(child)]
        return states == [TaskState.TASK_STATE_CANCELED]

    await eventually(child_canceled, within=15, what="the child task canceled")
    assert "done j2" not in pair.calls()


async def test_a_deadline_passing_ends_the_long_child(pair: Pair, http: httpx.AsyncClient) -> None:
    top, child = await client_for(http, pair.top), await client_for(http, pair.child)
    task = await send(
        top, message(text="crunch j3", metadata={"deadline": time.time() + 3}), wait=False
    )
    await eventually(lambda: "start j3" in pair.calls() and pair.proxy.subscribes >= 1, within=20)

    async def child_ended() -> Task | None:
        tasks = await child_tasks(child)
        return tasks[0] if tasks and tasks[0].status.state in ENDED else None

    ended_child = await eventually(child_ended, within=15, what="the child task ended")
    assert ended_child.status.state in (TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_FAILED)
    top_end = await eventually(lambda: ended(top, task.id), within=15)
    assert top_end.status.state != TaskState.TASK_STATE_COMPLETED
    assert "done j3" not in pair.calls()


async def _restart_top_while_followed(
    pair: Pair, http: httpx.AsyncClient, text: str, job: str
) -> None:
    """Send ``text`` (a call on job ``job``) to the top, kill -9 it once it follows the child
    from its resume point, restart it, and see it re-attach (a new subscription, the job not
    sent again) and complete with the child's answer."""
    top, child = await client_for(http, pair.top), await client_for(http, pair.child)
    task = await send(top, message(text=text), wait=False)
    await eventually(
        lambda: f"start {job}" in pair.calls() and pair.proxy.subscribes >= 1, within=20
    )
    # The child is in the coordinator's resume point before it is followed.
    assert pair.waits() == [(task.id, "children")]
    assert pair.top_proc is not None
    before = pair.proxy.subscribes
    pair.top_proc.kill()
    pair.start_top()
    # Recovery rule 4 runs the turn again: it follows the same child task (a new
    # subscription), it does not send the job again.
    await eventually(lambda: pair.proxy.subscribes > before, within=20, what="a re-attach")
    pair.release(job)
    top = await client_for(http, pair.top)
    done = await eventually(lambda: ended(top, task.id), within=30)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    assert f"top got {job}" in done.artifacts[-1].parts[0].text
    assert pair.calls() == [f"start {job}", f"done {job}"]
    assert len(await child_tasks(child)) == 1


async def test_a_coordinator_killed_while_the_child_works_re_attaches_after_its_restart(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    await _restart_top_while_followed(pair, http, "crunch j4", "j4")
    await eventually(lambda: pair.waits() == [], within=10, what="the resume point dropped")


async def test_a_call_past_long_after_s_goes_long_and_survives_a_coordinator_restart(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    # Not declared long: a blocking send first, then, past long_after_s, followed by
    # subscription; from there on as a declared long call.
    await _restart_top_while_followed(pair, http, "grind j5", "j5")


async def test_a_streamed_coordinator_relays_the_long_childs_progress(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    card = await A2ACardResolver(http, pair.top).get_agent_card()
    top = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
    request = SendMessageRequest(message=message(text="crunch j6"))

    async def read() -> list[dict[str, Any]]:
        return [MessageToDict(e) async for e in top.send_message(request)]

    reading = asyncio.create_task(read())
    await eventually(lambda: "start j6" in pair.calls() and pair.proxy.subscribes >= 1, within=20)
    pair.release("j6")
    events = await asyncio.wait_for(reading, 30)
    relayed = [
        (
            [hop["agent"] for hop in m["metadata"][EXT]["relay"]["from"]],
            "".join(p.get("text", "") for p in m.get("parts", [])),
        )
        for e in events
        if (m := e.get("statusUpdate", {}).get("status", {}).get("message", {}))
        and EXT in m.get("metadata", {})
        and "relay" in m["metadata"][EXT]
    ]
    assert (["long-child"], "j6: finishing") in relayed, relayed
    final = events[-1]["statusUpdate"]["status"]["state"]
    assert final == "TASK_STATE_COMPLETED", events[-1]


async def test_a_long_child_its_node_ended_interrupted_is_sent_again_after_re_attach(
    pair: Pair, http: httpx.AsyncClient
) -> None:
    top = await client_for(http, pair.top)
    task = await send(top, message(text="crunch j8"), wait=False)
    await eventually(lambda: "start j8" in pair.calls() and pair.proxy.subscribes >= 1, within=20)
    assert pair.waits() == [(task.id, "children")]
    assert pair.top_proc is not None
    assert pair.child_proc is not None
    pair.top_proc.kill()
    pair.child_proc.kill()
    pair.start_child()
    child = await client_for(http, pair.child)
    # Recovery ended the child's task: its node stopped under it (the message id released).
    (lost,) = await child_tasks(child)
    assert lost.status.state == TaskState.TASK_STATE_FAILED
    assert MessageToDict(lost.metadata)["error"]["reason"] == "interrupted"
    pair.start_top()
    # The coordinator re-attaches, finds the child interrupted and sends the same message
    # again: the child runs it as a new task.
    await eventually(lambda: pair.calls().count("start j8") == 2, within=30, what="a re-send")
    pair.release("j8")
    top = await client_for(http, pair.top)
    done = await eventually(lambda: ended(top, task.id), within=30)
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    assert "top got j8" in done.artifacts[-1].parts[0].text
    assert pair.calls() == ["start j8", "start j8", "done j8"]
    states = sorted(t.status.state for t in await child_tasks(child))
    assert states == sorted([TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_COMPLETED])


async def test_a_long_childs_node_killed_while_followed_the_message_runs_on_the_other_replica(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """Two replicas of long-child, each with its own SQLite store: the one running the job is
    killed (kill -9) while the coordinator follows it from its resume point; the coordinator
    sends the same message to the other replica, which runs it (once), and completes. Then a
    skill not declared long goes long by remote()'s default long_after_s."""
    env = clean_env(LONG_TEST_DIR=str(tmp_path))
    with registry(tmp_path, probe_interval=0.3) as reg:
        ports = {"a": free_port(), "b": free_port(), "top": free_port()}
        procs: dict[str, Proc] = {}

        def start(name: str, app: str, **extra: str) -> None:
            argv = ["mesh", "serve", f"tests.long_agents:{app}", "--port", str(ports[name]),
                    "--data-dir", str(tmp_path / name), "--registry", reg.url, "--grace", "1"]  # fmt: skip
            procs[name] = Proc.start(argv, name=name, tmp=tmp_path, env={**env, **extra})

        try:
            start("a", "child", LONG_TEST_REPLICA="a")
            start("b", "child", LONG_TEST_REPLICA="b")
            start("top", "found_top")
            for name, proc in procs.items():
                wait_until_ok(f"http://127.0.0.1:{ports[name]}/health", proc=proc)
            await eventually(
                lambda: len(instances(reg.url, agent="long-child")) == 2,
                within=20,
                what="both replicas registered",
            )
            top = await client_for(http, f"http://127.0.0.1:{ports['top']}")
            task = await send(top, message(text="crunch j7"), wait=False)
            started = await eventually(
                lambda: [c for c in calls(tmp_path) if c.startswith("start j7")], within=20
            )
            first = started[0].rsplit("@", 1)[1]
            other = "b" if first == "a" else "a"
            await eventually(
                lambda: waits(tmp_path / "top") == [(task.id, "children")],
                within=10,
                what="the child kept in the coordinator's resume point",
            )
            procs[first].kill()
            (tmp_path / "j7.go").touch()
            done = await eventually(lambda: ended(top, task.id), within=60)
            assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
            assert "top got j7" in done.artifacts[-1].parts[0].text
            assert calls(tmp_path) == [
                f"start j7 @{first}",
                f"start j7 @{other}",
                f"done j7 @{other}",
            ]
            survivor = await client_for(http, f"http://127.0.0.1:{ports[other]}")
            (ran,) = await child_tasks(survivor)
            assert ran.status.state == TaskState.TASK_STATE_COMPLETED
            await eventually(lambda: waits(tmp_path / "top") == [], within=10)

            # grind is not declared long: with remote()'s default long_after_s (5 s) the
            # blocking call goes long, kept in the resume point, and completes when released.
            task = await send(top, message(text="grind j9"), wait=False)
            await eventually(
                lambda: waits(tmp_path / "top") == [(task.id, "children")],
                within=20,
                what="the call gone long after 5 s",
            )
            (tmp_path / "j9.go").touch()
            done = await eventually(lambda: ended(top, task.id), within=30)
            assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
            assert calls(tmp_path)[-2:] == [f"start j9 @{other}", f"done j9 @{other}"]
        finally:
            for proc in procs.values():
                proc.terminate()
