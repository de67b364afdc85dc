"""``mesh ps`` / ``restart`` / ``stop`` / ``logs`` against a running ``mesh up`` (real processes)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from mesh._supervisor import RUN_MARKER
from tests.support import Proc, wait_for
from tests.up_support import mesh, mesh_up, small_mesh

pytestmark = pytest.mark.integration


def _ps(meshfile: Path) -> dict[str, dict[str, object]]:
    result = mesh("ps", "--meshfile", str(meshfile), "--json")
    assert result.returncode == 0, result.stderr
    return {p["name"]: p for p in json.loads(result.stdout)["processes"]}


def test_ps_stop_restart_and_logs_against_a_running_mesh(tmp_path: Path) -> None:
    meshfile, ports = small_mesh(tmp_path)
    bureau = f"http://127.0.0.1:{ports['bureau']}"
    flag = ("--meshfile", str(meshfile))
    with mesh_up(meshfile, tmp_path) as up:
        # ps: every process with the pid that answers its health URL.
        table = mesh("ps", *flag)
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split() == [
            "NAME", "AGENT", "PID", "URL", "STATUS", "RESTARTS", "UPTIME", "DETAIL"
        ]  # fmt: skip
        first_pid = httpx.get(f"{bureau}/health", trust_env=False).json()["pid"]
        assert [r.split()[:6] for r in rows] == [
            ["registry", "registry", str(_pid(f"http://127.0.0.1:{ports['registry']}")),
             f"http://127.0.0.1:{ports['registry']}", "healthy", "0"],
            ["credit-bureau", "credit-bureau", str(first_pid), bureau, "healthy", "0"],
        ]  # fmt: skip

        follow = Proc.start(
            ["mesh", "logs", "credit-bureau", "-f", *flag], name="follow", tmp=tmp_path
        )
        try:
            wait_for(lambda: RUN_MARKER in follow.output(), what="the log so far")

            # stop: the process ends, and the watcher leaves it stopped.
            stopped = mesh("stop", "credit-bureau", *flag)
            assert stopped.returncode == 0, stopped.stderr
            assert "stopped" in stopped.stdout
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{bureau}/health", trust_env=False)
            wait_for(lambda: "credit-bureau        stopped   by mesh stop" in up.output(),
                     what="mesh up to show the stop")  # fmt: skip
            info = _ps(meshfile)["credit-bureau"]
            assert (info["status"], info["pid"], info["restarts"]) == ("stopped", None, 0)

            # restart: a new process, healthy when the command returns.
            restarted = mesh("restart", "credit-bureau", *flag)
            assert restarted.returncode == 0, restarted.stderr
            info = _ps(meshfile)["credit-bureau"]
            assert info["status"] == "healthy"
            assert info["pid"] != first_pid
            assert info["pid"] == _pid(bureau)
            # ...and callers find it: the registry lists the instance that answers (and only it).
            registry = f"http://127.0.0.1:{ports['registry']}"
            listed = httpx.get(
                f"{registry}/v1/instances", params={"agent": "credit-bureau"}, trust_env=False
            ).json()["instances"]
            health = httpx.get(f"{bureau}/health", trust_env=False).json()
            assert [i["instance_id"] for i in listed] == [health["instance_id"]]

            # logs -f followed the file across the restart; logs shows the current run only.
            wait_for(lambda: follow.output().count(RUN_MARKER) == 2, what="the followed restart")
        finally:
            follow.terminate()
        log = tmp_path / "state" / "logs" / "credit-bureau.log"
        assert log.read_text().count(RUN_MARKER) == 2
        current = mesh("logs", "credit-bureau", *flag)
        assert current.returncode == 0, current.stderr
        assert current.stdout.startswith(RUN_MARKER)
        assert current.stdout.count(RUN_MARKER) == 1
        assert mesh("logs", "credit-bureau", "--all", *flag).stdout.count(RUN_MARKER) == 2

        # A crash is shown with the last lines of its current run, then restarted.
        pid = _pid(bureau)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "credit-bureau        crashed   exited with code -9" in up.output(),
                 what="the crash report")  # fmt: skip
        crash = up.output().split("crashed   exited with code -9", 1)[1].splitlines()[1:]
        assert crash[0].startswith("      | ")
        wait_for(lambda: _ps(meshfile)["credit-bureau"]["status"] == "healthy", timeout=60,
                 what="the restart after the crash")  # fmt: skip
        assert _ps(meshfile)["credit-bureau"]["restarts"] == 1

        # Names that are not in the mesh say which are.
        unknown = mesh("stop", "nope", *flag)
        assert unknown.returncode == 1
        names = "(it has: registry, credit-bureau)"
        assert f"no process or agent named 'nope' in this mesh {names}" in unknown.stderr

    # No mesh running: a clear message, for each command that needs one.
    for command in (("ps",), ("restart", "credit-bureau"), ("stop", "credit-bureau")):
        gone = mesh(*command, *flag)
        assert gone.returncode == 1
        assert f"no `mesh up` is running for {meshfile}" in gone.stderr
        assert f"start it with `mesh up {meshfile}`" in gone.stderr
        assert "Traceback" not in gone.stderr
    # The logs stay readable after the mesh stopped.
    assert mesh("logs", "credit-bureau", *flag).stdout.startswith(RUN_MARKER)


def _pid(url: str) -> int:
    return int(httpx.get(f"{url}/health", trust_env=False).json()["pid"])
