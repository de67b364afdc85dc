"""`mesh serve`, `mesh card`, `mesh call` as a user runs them."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, Proc, clean_env, free_port, running, wait_for

pytestmark = pytest.mark.integration


def _mesh(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env or clean_env(),
    )


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("agents.nope:agent", "no module named 'agents.nope'"),
        ("agents.credit_bureau:missing", "has no attribute 'missing'"),
        ("agents.credit_bureau", "MODULE:ATTR"),
        ("agents.credit_bureau:ScoreRequest", "not a mesh Agent"),
    ],
)
def test_bad_target_is_one_line_error(target: str, expected: str) -> None:
    r = _mesh("serve", target, "--port", str(free_port()))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert expected in lines[0]
    assert lines[0].startswith("mesh: error:")


def test_a_blank_mesh_token_stops_the_start_with_one_line(tmp_path: Path) -> None:
    r = _mesh(
        "serve", "agents.credit_bureau:agent", "--port", str(free_port()),
        "--data-dir", str(tmp_path), "--no-register",
        env=clean_env(MESH_TOKEN="  "),
    )  # fmt: skip
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "MESH_TOKEN has only spaces" in lines[0]


def test_port_in_use_is_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _mesh(
            "serve", "agents.credit_bureau:agent", "--port", str(port), "--data-dir", str(tmp_path)
        )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"port {port}" in lines[0]
    assert "in use" in lines[0]


def test_help_of_each_command() -> None:
    for command in ("serve", "card", "call"):
        r = _mesh(command, "--help")
        assert r.returncode == 0
        assert "usage: mesh " + command in r.stdout


def test_card_and_call(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data")]
    with running(argv, name="bureau", tmp=tmp_path, health=url + "/health"):
        card = _mesh("card", url)
        assert card.returncode == 0
        assert json.loads(card.stdout)["name"] == "credit-bureau"

        call = _mesh(
            "call",
            url,
            "--skill",
            "score",
            "--json",
            '{"applicant_id": "APP-501", "amount": 250000}',
        )
        assert call.returncode == 0, call.stderr
        report = json.loads(call.stdout)
        assert report["applicant_id"] == "APP-501"
        assert isinstance(report["score"], int)

        stream = _mesh(
            "call", url, "--json", '{"applicant_id": "APP-738", "amount": 1}', "--stream"
        )
        assert stream.returncode == 0, stream.stderr
        assert "[working]" in stream.stderr
        assert json.loads(stream.stdout)["applicant_id"] == "APP-738"

        bad = _mesh("call", url, "--skill", "score", "--json", '{"applicant_id": "APP-2"}')
        assert bad.returncode == 1
        assert "rejected" in bad.stderr
        assert "amount" in bad.stderr

    gone = _mesh("card", url)
    assert gone.returncode == 1
    assert "is the node running?" in gone.stderr


def test_sigterm_lets_an_in_flight_task_finish(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    calls = tmp_path / "calls.txt"
    env = clean_env(NODE_TEST_CALLS=str(calls))
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data"), "--grace", "10"]
    proc = Proc.start(argv, name="worker", tmp=tmp_path, env=env)
    try:
        wait_for(lambda: httpx.get(url + "/health").status_code == 200, what="node ready")
        message = {
            "role": "ROLE_USER",
            "messageId": uuid.uuid4().hex,
            "parts": [{"data": {"seconds": 1.5}}],
            "metadata": {"skill": "slow"},
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        headers = {"A2A-Version": "1.0"}
        with httpx.Client(timeout=30) as client:
            # Keep-alive connection opened before the signal, reused for the refused send.
            client.get(url + "/health")
            with httpx.Client(timeout=30) as other:
                pending = _send_in_thread(other, url, body, headers)
                wait_for(
                    lambda: calls.exists() and "slow start" in calls.read_text(), what="task start"
                )
                proc.popen.send_signal(signal.SIGTERM)
                wait_for(lambda: client.get(url + "/health").status_code == 503, what="draining")
                body2 = {**body, "params": {"message": {**message, "messageId": "late"}}}
                refused = client.post(url + "/", json=body2, headers=headers)
                assert refused.status_code == 503
                answer = pending.result(timeout=20)
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert proc.popen.wait(20) == 0
        assert "slow end" in calls.read_text()
    finally:
        proc.kill()


def _send_in_thread(client: httpx.Client, url: str, body: dict, headers: dict):  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(lambda: client.post(url + "/", json=body, headers=headers).json())
    pool.shutdown(wait=False)
    return future


def test_startup_is_fast_without_genai(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "agents.assistant:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp_path / "data")]
    started = time.monotonic()
    with running(argv, name="assistant", tmp=tmp_path, health=url + "/health"):
        elapsed = time.monotonic() - started
        intro = httpx.get(url + "/introspect").json()
        assert intro["agent"]["model"]["kind"] == "ScriptedModel"
    assert elapsed < 10


def test_every_bad_variable_is_listed_in_one_error(tmp_path: Path) -> None:
    """The first bad variable stopped `mesh serve`; fixing it only showed the next one."""
    bad = {
        "MESH_LOG_LEVEL": "chatty",
        "MESH_MAX_BODY_BYTES": "10MB",
        "MESH_BODY_TIMEOUT": "-1",
        "MESH_DISCOVERY": "etcd://x",
        "MESH_TOKEN": "s3cr3t value",
    }
    r = _mesh(
        "serve", "agents.credit_bureau:agent", "--port", str(free_port()),
        "--data-dir", str(tmp_path), "--no-register",
        env=clean_env(**bad),
    )  # fmt: skip
    assert r.returncode == 78, r.stderr  # EX_CONFIG: `mesh up` does not restart it
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("mesh: error: 5 bad settings:"), r.stderr
    lines = r.stderr.strip().splitlines()[1:]
    assert sorted(line.split("=")[0].split()[0] for line in lines) == sorted(bad)
    assert "s3cr3t" not in r.stderr  # never a secret's value
