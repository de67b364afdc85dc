"""``Supervisor`` and ``mesh up`` with real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from mesh.errors import ConfigError
from mesh.meshfile import ProcessSpec
from mesh.supervisor import Child, Supervisor
from tests.support import free_port

pytestmark = pytest.mark.integration


def http_server(name: str, port: int, kind: str = "node") -> ProcessSpec:
    url = f"http://127.0.0.1:{port}"
    return ProcessSpec(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        agent=name,
        argv=(sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"),
        url=url,
        health_url=f"{url}/",
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def eventually(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_supervisor_starts_restarts_and_stops(tmp_path: Path) -> None:
    specs = [http_server("registry", free_port(), "registry"), http_server("a", free_port())]
    seen: list[tuple[str, str]] = []

    def on_change(child: Child) -> None:
        seen.append((child.spec.name, child.status))

    sup = Supervisor(
        specs, log_dir=tmp_path / "logs", on_change=on_change, restart_backoff=(0.1, 1.0)
    )
    await sup.start()
    registry, node = sup.children
    assert (registry.status, node.status) == ("healthy", "healthy")
    # the registry was healthy before the node started
    assert seen.index(("registry", "healthy")) < seen.index(("a", "starting"))
    assert (tmp_path / "logs" / "a.log").exists()

    watcher = asyncio.create_task(sup.watch())
    first_pid = node.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    await eventually(lambda: node.restarts == 1 and node.status == "healthy")
    assert node.pid != first_pid
    assert ("a", "crashed") in seen
    async with httpx.AsyncClient(trust_env=False) as http:
        assert (await http.get(specs[1].health_url)).status_code == 200

    pids = [c.pid for c in sup.children]
    await sup.stop()
    await watcher
    assert all(c.status == "stopped" for c in sup.children)
    assert not any(alive(p) for p in pids if p)
    # nodes stop before the registry
    stops = [name for name, status in seen if status == "stopped"]
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
    good = http_server("good", free_port())
    sup = Supervisor([good, bad], log_dir=tmp_path / "logs")
    with pytest.raises(ConfigError, match=r"(?s)bad exited with code 3.*boom: no such module"):
        await sup.start()
    # what had started was stopped
    assert sup.children[0].status == "stopped"
    assert sup.children[0].pid is not None and not alive(sup.children[0].pid)
