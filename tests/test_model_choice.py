"""The offline model is a choice, not what a missing key silently gives (issue 12 item 7a).

A node naming a real model with no key ran the scripted model and said ``ok`` on /health: a
production node missing its secret answered canned text and looked healthy. Now a node beyond
loopback, or one told ``MESH_REQUIRE_MODEL=1``, refuses to start without a key unless the
offline model was chosen (``MESH_MODEL=scripted`` / ``--offline``), and /health says when a node
runs offline. The demo on loopback keeps running with no key.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from mesh import Node, NodeSettings
from mesh._errors import ConfigError
from mesh._settings import MeshSettings, ModelSettings
from tests.support import ROOT, clean_env, free_port, running

ASSISTANT = "agents.assistant:agent"  # names gemini-2.5-flash, and has an offline script


def _assistant() -> Any:
    from agents.assistant import agent

    return agent


def _serve(tmp: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "mesh", "serve", ASSISTANT, "--port", str(free_port()),
        "--data-dir", str(tmp), "--no-register", *flags,
    ]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean_env(**env)
    )


def _health(tmp: Path, *flags: str, **env: str) -> dict[str, Any]:
    port = free_port()
    argv = [
        sys.executable, "-m", "mesh", "serve", ASSISTANT, "--port", str(port),
        "--data-dir", str(tmp / "data"), "--no-register", *flags,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}/health"
    with running(argv, name="assistant", tmp=tmp, health=url, env=clean_env(**env)):
        body: dict[str, Any] = httpx.get(url, trust_env=False, timeout=10).json()
    return body


@pytest.mark.integration
def test_a_node_required_to_run_a_real_model_without_a_key_refuses_to_start(
    tmp_path: Path,
) -> None:
    done = _serve(tmp_path, MESH_REQUIRE_MODEL="1")
    assert done.returncode == 78, done.stderr  # EX_CONFIG: `mesh up` does not restart it
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mesh: error: agent 'assistant' names the model 'gemini-2.5-flash'")
    assert "set GOOGLE_API_KEY" in lines[0]
    assert "MESH_MODEL=scripted (mesh serve --offline)" in lines[0]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flags", "env"),
    [((), {}), (("--offline",), {}), ((), {"MESH_MODEL": "scripted"})],
    ids=["loopback-demo", "--offline", "MESH_MODEL=scripted"],
)
def test_a_node_on_the_scripted_model_says_so_on_health(
    tmp_path: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    body = _health(tmp_path, *flags, **env)
    assert body["status"] == "ok"
    assert body["checks"]["model"] == {"ok": True, "detail": "scripted (offline)"}


@pytest.mark.integration
def test_requiring_a_model_and_choosing_the_offline_one_contradict(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--offline", MESH_REQUIRE_MODEL="1")
    assert done.returncode == 78, done.stderr
    assert "contradict each other" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_node_beyond_loopback_needs_a_key_or_the_offline_choice(tmp_path: Path) -> None:
    """Checked as the node is built, before `mesh serve` binds anything (no address beyond
    loopback is bound here)."""
    agent = _assistant()
    exposed = NodeSettings(host="0.0.0.0", data_dir=tmp_path)
    with pytest.raises(ConfigError, match="set GOOGLE_API_KEY, or run it offline on purpose"):
        Node(agent, exposed)
    offline = NodeSettings(host="0.0.0.0", data_dir=tmp_path, models=ModelSettings(offline=True))
    assert Node(agent, offline).models.offline
    keyed = NodeSettings.build(
        MeshSettings.from_env({"GOOGLE_API_KEY": "k"}), agent_name="assistant", host="0.0.0.0"
    )
    assert Node(agent, keyed).models.gemini
    # On loopback nothing is required: the demo and the tests run on the script.
    assert not Node(agent, NodeSettings(data_dir=tmp_path)).models.require


def test_the_demo_deployments_choose_the_offline_model_out_loud() -> None:
    """They listen beyond loopback with no key: without the choice written down, the officer
    would refuse to start there."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    nodes = {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("command", "")).startswith("serve ") and "0.0.0.0" in svc["command"]
    }
    assert "loan-officer" in nodes
    for name, svc in nodes.items():
        # Unset on the host: scripted; `MESH_MODEL= docker compose up` with a key: Gemini.
        assert svc["environment"]["MESH_MODEL"] == "${MESH_MODEL-scripted}", name
    k8s = yaml.safe_load((ROOT / "deploy" / "k8s" / "config.yaml").read_text())
    assert k8s["data"]["MESH_MODEL"] == "scripted"
