"""``Supervisor`` and ``mesh up`` with real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mesh.errors import ConfigError
from mesh.meshfile import ProcessSpec
from mesh.supervisor import Child, Supervisor
from tests.support import eventually, free_port, running

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
    assert sup.children[0].pid is not None
    assert not alive(sup.children[0].pid)


# -- mesh up / mesh chat with the loan desk ---------------------------------------------------


def _desk_file(tmp: Path) -> tuple[Path, dict[str, int]]:
    ports = {
        "registry": free_port(),
        "officer": free_port(),
        "bureau": free_port(),
        "verifier": free_port(),
    }
    # Two consecutive free ports for the bureau replicas.
    while True:
        low = free_port()
        try:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", low + 1))
            break
        except OSError:
            continue
    ports["bureau"] = low
    text = f"""
state_dir = "{tmp / "state"}"
[registry]
port = {ports["registry"]}
[nodes.loan-officer]
module = "agents.loan_officer:agent"
port = {ports["officer"]}
[nodes.credit-bureau]
module = "agents.credit_bureau:agent"
port = "{low}-{low + 1}"
replicas = 2
[nodes.income-verifier]
module = "agents.income_verifier:agent"
port = {ports["verifier"]}
"""
    path = tmp / "mesh.toml"
    path.write_text(text)
    return path, ports


def test_mesh_up_runs_the_loan_desk_restarts_a_crash_and_stops_cleanly(tmp_path: Path) -> None:
    from tests.support import Proc, clean_env, wait_for

    meshfile, ports = _desk_file(tmp_path)
    registry = f"http://127.0.0.1:{ports['registry']}"
    up = Proc.start(["mesh", "up", str(meshfile)], name="up", tmp=tmp_path, env=clean_env())
    try:
        wait_for(lambda: "Ctrl-C stops everything" in up.output(), timeout=90, what="mesh up")
        out = up.output()
        for name in ("registry", "loan-officer", "credit-bureau-1", "credit-bureau-2"):
            assert f"✓ {name}" in out
        assert f"registry page: {registry}/" in out
        assert f"http://127.0.0.1:{ports['bureau'] + 1}" in out
        logs = tmp_path / "state" / "logs"
        assert {p.name for p in logs.iterdir()} >= {"registry.log", "loan-officer.log"}
        instances = httpx.get(f"{registry}/v1/instances", trust_env=False).json()["instances"]
        assert len(instances) == 4

        # `mesh chat` by name through the registry, two messages in one context.
        chat = subprocess.run(
            [
                sys.executable, "-m", "mesh", "chat", "loan-officer", "--registry", registry,
                "-m", "Should we approve APP-612 for 400,000 over 48 months?",
                "-m", "Tell me about APP-501",
            ],
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )  # fmt: skip
        assert chat.returncode == 0, chat.stderr
        assert "calling credit_bureau_score, income_verifier_verify, calculate_emi" in chat.stdout
        assert "Income verifier: discrepancy" in chat.stdout
        assert "Asha Rao (APP-501)" in chat.stdout
        assert chat.stdout.count("(context ") == 1

        # A crashed node comes back.
        verifier = f"http://127.0.0.1:{ports['verifier']}"
        pid = httpx.get(f"{verifier}/introspect", trust_env=False).json()["runtime"]["pid"]
        killed = [i["instance_id"] for i in instances if i["agent"] == "income-verifier"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "income-verifier      crashed" in up.output(), what="the crash report")
        wait_for(
            lambda: httpx.get(f"{verifier}/health", trust_env=False).status_code == 200,
            timeout=30,
            what="the restarted verifier",
        )
        wait_for(lambda: "(restart 1)" in up.output(), what="the restart report")

        up.popen.send_signal(signal.SIGINT)
        assert up.popen.wait(30) == 0
    finally:
        up.terminate()  # SIGTERM: mesh up stops its children too
    assert "mesh up: stopped" in up.output()
    for port in ports.values():
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False)
    # Every node deregistered before the registry stopped: its database lists none but the
    # instance that was SIGKILLed (it could not say goodbye; the prober would expire it).
    port = free_port()
    argv = [
        "mesh",
        "registry",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "state" / "registry"),
    ]
    with running(
        argv, name="registry-again", tmp=tmp_path, health=f"http://127.0.0.1:{port}/health"
    ):
        left = httpx.get(
            f"http://127.0.0.1:{port}/v1/instances", params={"status": "any"}, trust_env=False
        ).json()["instances"]
    assert [i["instance_id"] for i in left] == killed


def test_children_do_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    from tests.support import Proc, wait_for

    port = free_port()
    script = f"""
import asyncio, sys
from pathlib import Path
from mesh.meshfile import ProcessSpec
from mesh.supervisor import Supervisor

async def main():
    spec = ProcessSpec(name="child", kind="node", agent="child",
        argv=(sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"),
        url="http://127.0.0.1:{port}", health_url="http://127.0.0.1:{port}/")
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
        wait_for(lambda: not alive(child) or _zombie(child), what="the orphan to exit")
    finally:
        parent.kill()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True
