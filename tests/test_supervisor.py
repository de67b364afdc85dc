"""``Supervisor`` with real processes on 127.0.0.1: what it calls healthy, exited, failed, crashed."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from mesh._errors import ConfigError
from mesh._meshfile import ProcessSpec
from mesh._supervisor import RUN_MARKER, Child, Supervisor
from tests.support import ROOT, Proc, clean_env, eventually, free_port, wait_for

pytestmark = pytest.mark.integration


def pid_server(name: str, port: int, kind: str = "node", *, health_port: int = 0) -> ProcessSpec:
    """A spec for ``tests.pid_server`` on ``port`` (health asked of ``health_port`` if given)."""
    health = f"http://127.0.0.1:{health_port or port}/health"
    return ProcessSpec(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        agent=name,
        argv=(sys.executable, "-m", "tests.pid_server", str(port)),
        url=f"http://127.0.0.1:{port}",
        health_url=health,
        listen=("127.0.0.1", port),
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def starts(child: Child) -> int:
    return child.log.read_text().count(RUN_MARKER)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, child: Child) -> None:
        self.seen.append((child.spec.name, child.status))


@pytest.fixture
async def stopping() -> AsyncIterator[list[Supervisor]]:
    """Supervisors a test made: stopped at the end, whatever happened."""
    made: list[Supervisor] = []
    yield made
    for sup in made:
        await sup.stop()


async def test_supervisor_starts_restarts_and_stops(tmp_path: Path) -> None:
    specs = [pid_server("registry", free_port(), "registry"), pid_server("a", free_port())]
    rec = Recorder()
    sup = Supervisor(
        specs, log_dir=tmp_path / "logs", cwd=ROOT, on_change=rec, restart_backoff=(0.1, 1.0)
    )
    await sup.start()
    registry, node = sup.children
    assert (registry.status, node.status) == ("healthy", "healthy")
    # the registry was healthy before the node started
    assert rec.seen.index(("registry", "healthy")) < rec.seen.index(("a", "starting"))
    assert (tmp_path / "logs" / "a.log").exists()

    watcher = asyncio.create_task(sup.watch())
    first_pid = node.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    await eventually(lambda: node.restarts == 1 and node.status == "healthy")
    assert node.pid != first_pid
    assert ("a", "crashed") in rec.seen
    async with httpx.AsyncClient(trust_env=False) as http:
        assert (await http.get(specs[1].health_url)).json()["pid"] == node.pid

    pids = [c.pid for c in sup.children]
    await sup.stop()
    await watcher
    assert all(c.status == "stopped" for c in sup.children)
    assert not any(alive(p) for p in pids if p)
    # nodes stop before the registry
    stops = [name for name, status in rec.seen if status == "stopped"]
    assert stops == ["a", "registry"]


async def test_a_process_that_dies_at_start_fails_with_its_log(tmp_path: Path) -> None:
    port = free_port()
    bad = ProcessSpec(
        name="bad",
        kind="node",
        agent="bad",
        argv=(sys.executable, "-c", "import sys; print('boom: no such module'); sys.exit(3)"),
        url=f"http://127.0.0.1:{port}",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    good = pid_server("good", free_port())
    sup = Supervisor([good, bad], log_dir=tmp_path / "logs", cwd=ROOT)
    with pytest.raises(ConfigError, match=r"(?s)bad exited with code 3.*boom: no such module"):
        await sup.start()
    # what had started was stopped
    assert sup.children[0].status == "stopped"
    assert sup.children[0].pid is not None
    assert not alive(sup.children[0].pid)


async def test_health_answered_by_another_pid_fails_the_start_for_good(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    """A 200 from a process the supervisor did not start is not "healthy" (a second mesh up
    used to see the first one's nodes answer and report all ✓)."""
    foreign_port = free_port()
    foreign = Proc.start(
        [sys.executable, "-m", "tests.pid_server", str(foreign_port)], name="foreign", tmp=tmp_path
    )
    try:
        health = f"http://127.0.0.1:{foreign_port}/health"
        wait_for(
            lambda: httpx.get(health, trust_env=False).status_code == 200,
            what="the foreign server",
        )
        # Ours listens elsewhere, but its health URL is the port the foreign process holds.
        spec = pid_server("node", free_port(), health_port=foreign_port)
        rec = Recorder()
        sup = Supervisor([spec], log_dir=tmp_path / "logs", cwd=ROOT, on_change=rec)
        stopping.append(sup)
        with pytest.raises(
            ConfigError, match=rf"answered by another process \(pid {foreign.pid}\)"
        ):
            await sup.start()
        child = sup.children[0]
        assert child.status == "failed"
        assert child.detail == f"port taken by another process (pid {foreign.pid})"
        assert child.pid is not None
        assert not alive(child.pid)
        assert ("node", "healthy") not in rec.seen
        assert starts(child) == 1
        assert foreign.popen.poll() is None  # not ours: left alone
    finally:
        foreign.kill()


async def test_a_clean_exit_is_exited_not_crashed_and_not_restarted(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    spec = pid_server("node", free_port())
    rec = Recorder()
    sup = Supervisor(
        [spec], log_dir=tmp_path / "logs", cwd=ROOT, on_change=rec, restart_backoff=(0.05, 0.1)
    )
    stopping.append(sup)
    await sup.start()
    watcher = asyncio.create_task(sup.watch())
    child = sup.children[0]
    async with httpx.AsyncClient(trust_env=False) as http:
        await http.get(f"{spec.url}/exit/0")
    await eventually(lambda: child.status == "exited", what="the exit to be seen")
    assert child.detail == "exited with code 0"
    assert ("node", "crashed") not in rec.seen
    # Nothing to await for a restart that must not happen: give the watcher several backoff
    # periods in which it would have restarted a crash.
    await asyncio.sleep(0.5)
    assert (child.status, child.restarts, starts(child)) == ("exited", 0, 1)
    await sup.stop()
    await watcher


async def test_a_crash_reports_the_log_of_its_latest_start_only(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    spec = pid_server("node", free_port())
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node.log").write_text("an older run: Traceback ... OLD ERROR\n")
    sup = Supervisor([spec], log_dir=logs, cwd=ROOT, restart_backoff=(5.0, 5.0))
    stopping.append(sup)
    await sup.start()
    watcher = asyncio.create_task(sup.watch())
    child = sup.children[0]
    assert child.pid is not None
    pid = child.pid
    os.kill(pid, signal.SIGKILL)
    await eventually(lambda: child.status == "crashed", what="the crash")
    assert child.detail == "exited with code -9"
    tail = child.tail()
    assert tail.startswith(RUN_MARKER)
    assert f"pid_server {pid} listening" in tail
    assert "OLD ERROR" not in tail
    await sup.stop()
    await watcher


async def test_a_bind_error_fails_for_good_instead_of_restarting(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    """A real `mesh serve` that finds its port taken exits with EX_CONFIG: shown failed with
    its error line, never restarted (it used to cycle between healthy and crashed)."""
    port = free_port()
    spec = ProcessSpec(
        name="bureau",
        kind="node",
        agent="credit-bureau",
        argv=(
            sys.executable, "-m", "mesh", "serve", "agents.credit_bureau:agent",
            "--port", str(port), "--data-dir", str(tmp_path / "data"), "--no-register",
        ),
        url=f"http://127.0.0.1:{port}",
        health_url=f"http://127.0.0.1:{port}/health",
        env=clean_env(),
        listen=("127.0.0.1", port),
    )  # fmt: skip
    rec = Recorder()
    sup = Supervisor(
        [spec], log_dir=tmp_path / "logs", cwd=ROOT, on_change=rec, restart_backoff=(0.2, 0.2)
    )
    stopping.append(sup)
    await sup.start()
    watcher = asyncio.create_task(sup.watch())
    child = sup.children[0]
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    # Someone else takes the port before the restart binds it (0.2 s of backoff, then the
    # second of imports a `mesh serve` takes before it binds).
    squatter = socket.socket()
    # The killed server's connections may leave the port in TIME_WAIT.
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        await eventually(lambda: _try_bind(squatter, port), what="the freed port")
        squatter.listen()
        await eventually(lambda: child.status == "failed", within=30, what="the failed restart")
        assert child.exit_code == os.EX_CONFIG
        assert child.detail.startswith(f"port {port} on 127.0.0.1 is already in use")
        assert child.restarts == 1
        # Five backoff periods in which a restart loop would have spawned it again (a spawn
        # writes its RUN_MARKER at once).
        await asyncio.sleep(1.0)
        assert (child.status, child.restarts, starts(child)) == ("failed", 1, 2)
        assert [s for n, s in rec.seen].count("healthy") == 1
    finally:
        squatter.close()
    await sup.stop()
    await watcher


def _try_bind(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_children_do_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    port = free_port()
    script = f"""
import asyncio, sys
from pathlib import Path
from mesh._meshfile import ProcessSpec
from mesh._supervisor import Supervisor

async def main():
    spec = ProcessSpec(name="child", kind="node", agent="child",
        argv=(sys.executable, "-m", "tests.pid_server", "{port}"),
        url="http://127.0.0.1:{port}", health_url="http://127.0.0.1:{port}/health")
    sup = Supervisor([spec], log_dir=Path({str(tmp_path)!r}))
    await sup.start()
    print("child pid", sup.children[0].pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""
    parent = Proc.start([sys.executable, "-c", script], name="parent", tmp=tmp_path)
    try:
        line = wait_for(
            lambda: next((ln for ln in parent.output().splitlines() if "child pid" in ln), None),
            what="the child to start",
        )
        child = int(line.split()[-1])
        assert alive(child)
        parent.kill()  # SIGKILL: the supervisor gets no chance to stop anything
        wait_for(lambda: not alive(child), what="the orphan to exit")
    finally:
        parent.kill()


async def test_siblings_stopped_after_a_failed_start_are_stopped_not_crashed(
    tmp_path: Path,
) -> None:
    """When one node cannot start, mesh up stops the others: each is "stopped" (it used to be
    shown "stopped", then "crashed exited with code -15" by a wait still watching it)."""
    port = free_port()
    bad = ProcessSpec(
        name="bad",
        kind="node",
        agent="bad",
        argv=(
            sys.executable,
            "-c",
            "import sys; print('no module named agents.typo'); sys.exit(1)",
        ),
        url=f"http://127.0.0.1:{port}",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    # Still starting when its sibling fails: its health is asked where nothing answers.
    good = pid_server("good", free_port(), health_port=free_port())
    rec = Recorder()
    sup = Supervisor([good, bad], log_dir=tmp_path / "logs", cwd=ROOT, on_change=rec)
    with pytest.raises(ConfigError, match="bad exited with code 1"):
        await sup.start()
    # Nothing of start() outlives it (a wait left behind is what called the stop a crash).
    me = asyncio.current_task()
    await eventually(
        lambda: all(t.done() for t in asyncio.all_tasks() if t is not me),
        what="start()'s waits to end",
    )
    assert [s for n, s in rec.seen if n == "good"] == ["starting", "stopped"]
    assert sup.children[0].status == "stopped"


def _bureau_mesh(tmp_path: Path) -> list[ProcessSpec]:
    from mesh._meshfile import MeshFile

    meshfile = MeshFile.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "registry": {"port": free_port()},
            "nodes": {
                "credit-bureau": {"module": "agents.credit_bureau:agent", "port": free_port()}
            },
        }
    )
    return [dataclasses.replace(s, env={**clean_env(), **s.env}) for s in meshfile.plan(ROOT)]


async def _listed(registry: ProcessSpec, agent: str) -> list[str]:
    async with httpx.AsyncClient(trust_env=False) as http:
        answer = await http.get(f"{registry.url}/v1/instances", params={"agent": agent})
    return [i["instance_id"] for i in answer.json()["instances"] if i["status"] == "passing"]


async def _instance_id(spec: ProcessSpec) -> str:
    async with httpx.AsyncClient(trust_env=False) as http:
        return str((await http.get(spec.health_url)).json()["instance_id"])


async def test_a_node_is_healthy_once_the_registry_lists_it(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    """Healthy means callers find it by name: at start and after a restart, the registry
    lists the instance that answers (a call right after `mesh restart` used to find nobody)."""
    registry, bureau = _bureau_mesh(tmp_path)
    assert bureau.registry_url == registry.url
    sup = Supervisor([registry, bureau], log_dir=tmp_path / "logs", cwd=ROOT)
    stopping.append(sup)
    await sup.start()
    first = await _instance_id(bureau)
    assert await _listed(registry, "credit-bureau") == [first]

    [child] = await sup.restart_process("credit-bureau")
    assert child.status == "healthy"
    second = await _instance_id(bureau)
    assert second != first
    assert second in await _listed(registry, "credit-bureau")


async def test_a_node_the_registry_never_lists_is_not_healthy(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    registry, bureau = _bureau_mesh(tmp_path)
    # It serves (its /health says ok) but never registers.
    silent = dataclasses.replace(bureau, argv=(*bureau.argv, "--no-register"))
    rec = Recorder()
    sup = Supervisor(
        [registry, silent], log_dir=tmp_path / "logs", cwd=ROOT, on_change=rec, start_timeout=8
    )
    stopping.append(sup)
    with pytest.raises(
        ConfigError,
        match=rf"credit-bureau answers on {bureau.health_url}, but the registry at "
        rf"{registry.url} did not list it as passing within 8s",
    ):
        await sup.start()
    bureau_seen = [s for n, s in rec.seen if n == "credit-bureau"]
    assert bureau_seen == ["starting", "starting", "unhealthy", "stopped"]  # up; not listed


async def test_a_crash_loop_waits_longer_each_time_until_a_stable_run_resets_it(
    tmp_path: Path, stopping: list[Supervisor]
) -> None:
    port = free_port()
    broken = tmp_path / "broken"
    # A pid_server that exits at once (code 1: a crash) while ``broken`` exists.
    code = (
        "import os, runpy, sys\n"
        f"if os.path.exists({str(broken)!r}): sys.exit(1)\n"
        f"sys.argv = ['pid_server', '{port}']\n"
        "runpy.run_module('tests.pid_server', run_name='__main__')\n"
    )
    spec = dataclasses.replace(pid_server("node", port), argv=(sys.executable, "-c", code))
    events: list[tuple[float, str]] = []
    sup = Supervisor(
        [spec],
        log_dir=tmp_path / "logs",
        cwd=ROOT,
        on_change=lambda c: events.append((time.monotonic(), c.status)),
        restart_backoff=(0.1, 0.8),
        stable_after=1.0,
    )
    stopping.append(sup)
    await sup.start()
    watcher = asyncio.create_task(sup.watch())
    child = sup.children[0]

    def waits() -> list[float]:
        """Seconds from each crash to the start after it."""
        return [
            later - at
            for (at, status), (later, next_status) in itertools.pairwise(events)
            if status == "crashed" and next_status == "starting"
        ]

    broken.touch()
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    await eventually(
        lambda: child.restarts == 4 and child.status == "crashed", what="four restarts that crash"
    )
    broken.unlink()
    await eventually(lambda: child.status == "healthy", what="a restart that stays up")
    # The streak doubles from 0.1 to the 0.8 cap: 0.1, 0.2, 0.4, 0.8, 0.8 (the last one stays).
    streak = waits()
    assert len(streak) >= 5
    for waited, least in zip(streak, [0.1, 0.2, 0.4, 0.8, 0.8], strict=False):
        assert waited >= least - 0.01, streak
    # Up for longer than stable_after: the next crash starts a new streak at 0.1, not 0.8.
    await eventually(
        lambda: time.monotonic() - child.started_at > 1.2, what="a run past stable_after"
    )
    before = len(waits())
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    await eventually(lambda: len(waits()) > before, what="the restart after the new crash")
    assert waits()[before] < 0.6, waits()
    await sup.stop()
    await watcher
