"""README's walk-through of the underwriter's approval, run as written: the commands of its block
(marked not-run there: the demo's fixed ports) against `mesh up agents/mesh.toml` on free ports,
with the registry in MESH_REGISTRY and the mesh file given to `mesh restart`. The chat ends on
the underwriter's question, `mesh tasks --waiting` shows it before and after restarting the
underwriter and the officer, and `mesh reply` to the officer's task completes it with the
underwriter's decision."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, clean_env
from tests.test_eval import _loan_desk_meshfile
from tests.up_support import mesh_up

pytestmark = pytest.mark.integration

MARK = "tests/test_loan_desk_tour.py"


def tour() -> list[str]:
    """The commands of README's block that names this test, comments left out."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "not-run" in line and MARK in line)
    assert lines[start + 1] == "```sh"
    end = lines.index("```", start + 2)
    return [line.split("  #", 1)[0].strip() for line in lines[start + 2 : end]]


def run(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=90, cwd=ROOT, env=env
    )


def test_readme_walk_through_of_an_approval_pending_across_restarts(tmp_path: Path) -> None:
    commands = tour()
    assert [shlex.split(c)[1] for c in commands] == [
        "chat", "tasks", "restart", "restart", "tasks", "reply",
    ]  # fmt: skip
    meshfile = _loan_desk_meshfile(tmp_path)
    registry_port = int(meshfile.read_text().split("port = ", 2)[1].split()[0])
    env = clean_env(MESH_REGISTRY=f"http://127.0.0.1:{registry_port}")
    with mesh_up(meshfile, tmp_path, env=env) as up:
        assert "✓ underwriter" in up.output()
        chat, waiting, *restarts, still, reply = commands

        said = run(chat, env)
        assert said.returncode == 0, said.stderr
        assert (
            "  ? underwriter (via loan-officer) asks: Approve APP-738 for 600,000 over 60 months?"
            in said.stdout
        ), said.stdout
        assert "answer with JSON: {decision*: approve|decline, note: string}" in said.stdout

        listed = run(waiting, env)
        assert listed.returncode == 0, listed.stderr
        rows = [line for line in listed.stdout.splitlines() if line.startswith("loan-officer")]
        assert len(rows) == 1, listed.stdout
        task_id = rows[0].split()[1]
        assert "underwriter: Approve APP-738" in rows[0]
        assert "(1 more down their chains" in listed.stdout

        for restart in restarts:
            done = run(f"{restart} --meshfile {shlex.quote(str(meshfile))}", env)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "healthy" in done.stdout

        again = run(still, env)
        assert [ln.split()[1] for ln in again.stdout.splitlines() if ln.startswith("loan-")] == [
            task_id
        ], again.stdout

        # README's task id is an example: the user pastes theirs.
        example = shlex.split(reply)[2]
        answered = run(reply.replace(example, task_id), env)
        assert answered.returncode == 0, answered.stdout + answered.stderr
        assert "Meera Iyer (APP-738), loan of 600000 over 60 months: APPROVE." in answered.stdout
        assert "- Underwriter: APPROVE (collateral checked)." in answered.stdout
        assert json.loads(shlex.split(reply)[4]) == {
            "decision": "approve",
            "note": "collateral checked",
        }
        assert "no tasks" in run(waiting, env).stdout
