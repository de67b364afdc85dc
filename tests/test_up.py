"""``mesh up`` with real processes on 127.0.0.1 (the ``Supervisor`` itself: test_supervisor.py)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from mesh._supervisor import RUN_MARKER
from tests.support import BIN, ROOT, Proc, clean_env, free_port, running, wait_for
from tests.up_support import mesh, mesh_up, small_mesh

pytestmark = pytest.mark.integration


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
            with socket.socket() as s:
                s.bind(("127.0.0.1", low + 1))
            break
        except OSError:
            continue
    ports["bureau"] = low
    # The typed specialist first: `mesh up` must not suggest chatting with it.
    text = f"""
state_dir = "{tmp / "state"}"
[registry]
port = {ports["registry"]}
[nodes.credit-bureau]
module = "agents.credit_bureau:agent"
port = "{low}-{low + 1}"
replicas = 2
[nodes.loan-officer]
module = "agents.loan_officer:agent"
port = {ports["officer"]}
[nodes.income-verifier]
module = "agents.income_verifier:agent"
port = {ports["verifier"]}
"""
    path = tmp / "mesh.toml"
    path.write_text(text)
    return path, ports


def _venv_not_active() -> dict[str, str]:
    """A shell's environment after `make run`: the venv's bin is not on PATH."""
    path = os.environ.get("PATH", "").split(os.pathsep)
    return clean_env(
        PATH=os.pathsep.join(p for p in path if p and Path(p).resolve() != BIN.resolve())
    )


def _venv_active() -> dict[str, str]:
    return clean_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def _said(output: str, label: str) -> str:
    """What the banner line ``label`` (e.g. "try:") says."""
    line = next(ln for ln in output.splitlines() if ln.startswith(label))
    return line.removeprefix(label).strip()


def _shell(command: str, *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` as the user would paste it into their shell."""
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd=cwd, env=env
    )


def test_mesh_up_runs_the_loan_desk_restarts_a_crash_and_stops_cleanly(tmp_path: Path) -> None:
    meshfile, ports = _desk_file(tmp_path)
    registry = f"http://127.0.0.1:{ports['registry']}"
    shell = _venv_not_active()
    up = Proc.start(["mesh", "up", str(meshfile)], name="up", tmp=tmp_path, env=shell)
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

        # What to try: chat with the agent that takes text (not the first, typed, one), with
        # the mesh command that works in this shell, where the venv is not active.
        suggested = _said(out, "try:")
        assert suggested == f".venv/bin/mesh chat loan-officer --registry {registry}"
        assert _said(out, "manage:") == (
            f".venv/bin/mesh ps --meshfile {meshfile}; "
            f".venv/bin/mesh logs|restart|stop NAME --meshfile {meshfile}"
        )
        # As suggested, by name through the registry: two messages in one context.
        messages = (
            "Should we approve APP-612 for 400,000 over 48 months?",
            "Tell me about APP-501",
        )
        chat = _shell(
            f"{suggested} " + " ".join(f"-m {shlex.quote(m)}" for m in messages),
            cwd=ROOT,
            env=shell,
        )
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

        # Its new registration at the same URL superseded the killed one: no ghost.
        def verifiers() -> list[str]:
            found = httpx.get(f"{registry}/v1/instances", trust_env=False).json()["instances"]
            return [i["instance_id"] for i in found if i["agent"] == "income-verifier"]

        wait_for(lambda: len(verifiers()) == 1 and verifiers() != killed,
                 what="one verifier instance, the restarted one")  # fmt: skip

        up.popen.send_signal(signal.SIGINT)
        assert up.popen.wait(30) == 0
    finally:
        up.terminate()  # SIGTERM: mesh up stops its children too
    assert "mesh up: stopped" in up.output()
    for port in ports.values():
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False)
    # Every node deregistered before the registry stopped, and the SIGKILLed instance left no
    # ghost (superseded by its restart): the database lists none.
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
    assert left == []


# -- one mesh per state dir, ports checked before anything starts -------------------------------


def _log_contents(logs: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(logs.iterdir())}


def test_a_second_mesh_up_fails_fast_and_leaves_the_first_alone(tmp_path: Path) -> None:
    meshfile, ports = small_mesh(tmp_path)
    health = {
        "registry": f"http://127.0.0.1:{ports['registry']}/health",
        "credit-bureau": f"http://127.0.0.1:{ports['bureau']}/health",
    }
    with mesh_up(meshfile, tmp_path) as first:
        logs = tmp_path / "state" / "logs"
        before = _log_contents(logs)
        pids = {n: httpx.get(url, trust_env=False).json()["pid"] for n, url in health.items()}

        # The same project: its lock answers at once, naming the running mesh up.
        began = time.monotonic()
        again = mesh("up", str(meshfile), timeout=30)
        assert again.returncode != 0
        lines = again.stderr.strip().splitlines()
        assert len(lines) == 1, again.stderr
        assert f"another `mesh up` (pid {first.pid}) is already running this mesh" in lines[0]
        assert "mesh ps" in lines[0]
        assert "✓" not in again.stdout

        # Another project (its own state dir) on the same ports: the port check answers.
        other = tmp_path / "other.toml"
        other.write_text(meshfile.read_text().replace(str(tmp_path / "state"), str(tmp_path / "o")))
        second = mesh("up", str(other), timeout=30)
        # Both well inside the 60 s start timeout the old run sat in before failing.
        assert time.monotonic() - began < 20
        assert second.returncode != 0
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert (
            f"port {ports['registry']} on 127.0.0.1 (for registry) is already in use (and 1 "
            f"more of this mesh's ports: {ports['bureau']}): is another `mesh up` running? "
            "see `mesh ps`"
        ) in lines[0]
        assert "starting" not in second.stdout
        assert not (tmp_path / "o" / "logs").exists()

        # The first mesh: same processes, still healthy, its logs only ever grew by its own lines.
        for name, url in health.items():
            answer = httpx.get(url, trust_env=False)
            assert (answer.status_code, answer.json()["pid"]) == (200, pids[name])
        after = _log_contents(logs)
        assert after.keys() == before.keys()
        for name, text in after.items():
            assert text.startswith(before[name])
            assert text.count(RUN_MARKER.encode()) == 1
        assert "crashed" not in first.output()


def test_a_busy_node_port_is_reported_before_anything_starts(tmp_path: Path) -> None:
    meshfile, ports = small_mesh(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports["bureau"]))
        squatter.listen()
        result = mesh("up", str(meshfile), timeout=30)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"mesh: error: port {ports['bureau']} on 127.0.0.1 (for credit-bureau) is already in "
        "use: is another `mesh up` running? see `mesh ps`, or stop what listens there"
    )
    # Nothing was started, no log written: not even the registry, which comes first.
    assert "starting" not in result.stdout
    assert not (tmp_path / "state" / "logs").exists()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{ports['registry']}/health", trust_env=False)


def test_mesh_serve_and_mesh_registry_exit_with_ex_config_on_a_busy_port(tmp_path: Path) -> None:
    """EX_CONFIG (78) tells `mesh up` not to restart: the same start would fail the same way."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        for argv in (
            ("serve", "agents.credit_bureau:agent", "--no-register"),
            ("registry",),
        ):
            result = mesh(*argv, "--port", str(port), "--data-dir", str(tmp_path / argv[0]))
            assert result.returncode == os.EX_CONFIG, result.stderr
            lines = result.stderr.strip().splitlines()
            assert lines == [
                f"mesh: error: port {port} on 127.0.0.1 is already in use; stop what runs there "
                "or pick another --port"
            ]


# -- which mesh file, and what the banner suggests ---------------------------------------------


def test_mesh_up_in_a_project_folder_finds_its_mesh_toml_and_suggests_what_works(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    meshfile, ports = small_mesh(tmp_path, name="project/mesh.toml")
    registry = f"http://127.0.0.1:{ports['registry']}"
    shell = _venv_active()
    with mesh_up(None, tmp_path, cwd=project, env=shell) as up:
        out = up.output()
        assert out.startswith("mesh up: starting 2 processes of mesh.toml (logs in ")
        # Its only agent has no chat skill: a typed call, with the skill's own example.
        suggested = _said(out, "try:")
        example = '{"applicant_id": "APP-501", "amount": 250000}'
        assert suggested == (
            f"mesh call credit-bureau --skill score --json '{example}' --registry {registry}"
        )
        called = _shell(suggested, cwd=project, env=shell)
        assert called.returncode == 0, called.stderr
        assert '"score": 445' in called.stdout
        # `mesh ps` here finds the same mesh file without being told.
        assert _said(out, "manage:") == "mesh ps; mesh logs|restart|stop NAME"
        ps = mesh("ps", cwd=project)
        assert ps.returncode == 0, ps.stderr
        assert ps.stderr.strip() == "(mesh file: mesh.toml)"
        assert "credit-bureau" in ps.stdout

        # Both places hold a mesh file: the one a running `mesh up` uses wins.
        both = tmp_path / "both"
        (both / "agents").mkdir(parents=True)
        (both / "agents" / "mesh.toml").write_text(meshfile.read_text())
        idle = meshfile.read_text().replace(str(tmp_path / "state"), str(tmp_path / "idle"))
        (both / "mesh.toml").write_text(idle)
        ps = mesh("ps", cwd=both)
        assert ps.returncode == 0, ps.stderr
        assert ps.stderr.strip() == "(mesh file: agents/mesh.toml)"

    # No mesh file where it looks: it says where it looked and what to do.
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in (("ps",), ("up",)):
        none = mesh(*command, cwd=empty)
        assert none.returncode == 1
        assert none.stderr.strip() == (
            f"mesh: error: no mesh file in {empty} (looked for mesh.toml or agents/mesh.toml): "
            "run this in the folder of your mesh.toml, or give its path"
        )
