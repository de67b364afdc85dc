"""Configuration is read once, at the edge: mesh's library code neither reads nor writes the
process environment (issue 12 item 3)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, clean_env, free_port, running

# Where mesh may touch os.environ, and why. Everything else receives settings.
ALLOWED = {
    # The settings module: MESH_ENV_FILE, and pydantic-settings reading the rest.
    "mesh/_settings/settings.py",
    # `mesh serve`, the node's entry point: it owns its process and turns off a2a-sdk's no-op
    # tracing there before `a2a` is imported (the SDK reads its switch only from the
    # environment).
    "mesh/_cli/serve.py",
    # `mesh up` starts its children with its environment: that is how they inherit the
    # configuration.
    "mesh/_supervisor.py",
}


def _environment_uses(tree: ast.AST) -> list[int]:
    """Lines of ``os.environ``, ``os.getenv``/``putenv``/``unsetenv``, ``os.environb`` and
    ``from os import environ`` (and the like) in ``tree``."""
    names = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in names
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in names for alias in node.names)
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_nothing_outside_the_settings_and_the_entry_points_reads_the_environment() -> None:
    found = {}
    for path in sorted((ROOT / "mesh").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        lines = _environment_uses(ast.parse(path.read_text(), filename=where))
        if lines and where not in ALLOWED:
            found[where] = lines
    assert found == {}, f"read the environment through mesh._settings instead: {found}"


def test_the_check_sees_each_way_of_reading_the_environment() -> None:
    code = textwrap.dedent(
        """
        import os
        from os import getenv
        a = os.environ.get("X")
        b = os.getenv("Y")
        os.environ.setdefault("Z", "1")
        """
    )
    assert _environment_uses(ast.parse(code)) == [3, 4, 5, 6]


@pytest.mark.integration
def test_importing_mesh_leaves_the_environment_unchanged() -> None:
    """Importing mesh._a2a set OTEL_INSTRUMENTATION_A2A_SDK_ENABLED in whatever process
    imported mesh (an app embedding a node, a test runner)."""
    code = textwrap.dedent(
        """
        import json, os, sys
        before = dict(os.environ)
        import mesh, mesh._a2a, mesh._node, mesh._runner, mesh._a2a.server, mesh._a2a.client
        from mesh import Agent, Node, NodeSettings, remote
        after = dict(os.environ)
        print(json.dumps({k: after.get(k) for k in set(before) ^ set(after) | {
            k for k in before if before[k] != after.get(k)}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {}


_PROBE_AGENT = """
import json
from pathlib import Path

from a2a.utils import telemetry  # what a2a-sdk decided when it was first imported

from pydantic import BaseModel

from mesh import Agent, skill

Path(__file__).with_name("otel.json").write_text(json.dumps(telemetry.otel_enabled))


class Ping(BaseModel):
    text: str


@skill
def ping(request: Ping) -> Ping:
    \"\"\"Answer.\"\"\"
    return request


agent = Agent(name="probe", skills=[ping])
"""


@pytest.mark.integration
@pytest.mark.parametrize(("operator", "expected"), [(None, False), ("true", True)])
def test_a_node_runs_without_the_sdks_no_op_tracing_unless_the_operator_asks(
    tmp_path: Path, operator: str | None, expected: bool
) -> None:
    """``mesh serve`` turns the SDK's tracing off before a2a is imported (it cost ~12 % of a
    node's CPU); an operator's OTEL_INSTRUMENTATION_A2A_SDK_ENABLED still wins."""
    (tmp_path / "probe_agent.py").write_text(_PROBE_AGENT)
    env = clean_env(PYTHONPATH=str(tmp_path))
    env.pop("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", None)
    if operator is not None:
        env["OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"] = operator
    port = free_port()
    argv = [
        sys.executable, "-m", "mesh", "serve", "probe_agent:agent", "--port", str(port),
        "--data-dir", str(tmp_path / "data"), "--no-register",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running(argv, name="probe", tmp=tmp_path, health=f"{url}/health", env=env):
        card = httpx.get(f"{url}/.well-known/agent-card.json", trust_env=False, timeout=10)
        assert card.json()["name"] == "probe"
    assert json.loads((tmp_path / "otel.json").read_text()) is expected
