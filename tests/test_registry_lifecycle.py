"""The registry with real nodes (``mesh serve agents.credit_bureau:agent``, and the echo node
where a test needs to make a node unhealthy): register, fail, stop, restart, outage, recovery."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.registry_support import instances, registry, start_bureau, start_node
from tests.support import ROOT, clean_env, free_port, wait_for

pytestmark = pytest.mark.integration


def _mesh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args],
        capture_output=True, text=True, timeout=30, env=clean_env(), cwd=ROOT,
    )  # fmt: skip


def test_node_registers_and_appears_in_mesh_ls_and_show(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        node = start_bureau(tmp_path, reg.url)
        with node.proc:
            found = wait_for(lambda: instances(reg.url, agent="credit-bureau"), what="registered")
            assert found[0]["url"] == node.url
            assert found[0]["skills"] == ["score"]

            ls = _mesh("ls", "--registry", reg.url)
            assert ls.returncode == 0, ls.stderr
            header, row = ls.stdout.strip().splitlines()
            assert header.split() == ["AGENT", "VERSION", "UP", "SKILLS", "DESCRIPTION"]
            assert row.split()[:4] == ["credit-bureau", "0.1.0", "1/1", "score"]

            show = _mesh("show", "credit-bureau", "--registry", reg.url)
            assert show.returncode == 0, show.stderr
            assert "* applicant_id: string  (Applicant identifier, e.g. APP-501.)" in show.stdout
            assert f"{node.url}  passing" in show.stdout

            as_json = _mesh("ls", "--skill", "score", "--json", "--registry", reg.url)
            assert [a["name"] for a in json.loads(as_json.stdout)] == ["credit-bureau"]
            none = _mesh("ls", "--skill", "nope", "--registry", reg.url)
            assert "no agents registered" in none.stdout

            # `mesh call` and `mesh card` take an agent name, resolved through the registry.
            call = _mesh(
                "call",
                "credit-bureau",
                "--registry",
                reg.url,
                "--skill",
                "score",
                "--json",
                '{"applicant_id": "APP-501", "amount": 250000}',
            )
            assert call.returncode == 0, call.stderr
            assert 300 <= json.loads(call.stdout)["score"] <= 900
            card = _mesh("card", "credit-bureau", "--registry", reg.url)
            assert json.loads(card.stdout)["name"] == "credit-bureau"
            ghost = _mesh("call", "ghost", "--registry", reg.url, "--text", "hi")
            assert ghost.returncode == 1
            assert "no passing agent named 'ghost'" in ghost.stderr
            assert "mesh ls" in ghost.stderr


def test_cli_says_what_to_do_when_no_registry(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = _mesh("ls", "--registry", url)
    assert result.returncode == 1
    assert f"no registry at {url}: start one with `mesh registry` or set MESH_REGISTRY" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_show_unknown_agent_is_a_clear_error(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        result = _mesh("show", "ghost", "--registry", reg.url)
        assert result.returncode == 1
        assert "no agent named 'ghost'" in result.stderr
        assert "mesh ls" in result.stderr


def test_kill_9_goes_critical_within_the_probe_interval_and_leaves_lookups(
    tmp_path: Path,
) -> None:
    with registry(tmp_path, probe_interval=0.5) as reg:
        node = start_bureau(tmp_path, reg.url)
        with node.proc:
            (up,) = wait_for(lambda: instances(reg.url), what="bureau passing")
            node.proc.kill()
            # Probe every 0.5 s with a 0.4 s timeout: a refused connection is seen in one round.
            gone = wait_for(
                lambda: [i for i in instances(reg.url, status="any") if i["status"] == "critical"],
                timeout=2.0,
                what="critical after kill -9",
            )
            assert gone[0]["instance_id"] == up["instance_id"]
            assert "health check failed" in str(gone[0]["status_reason"])
            assert instances(reg.url, agent="credit-bureau") == []
            assert instances(reg.url, skill="score") == []
            agents = httpx.get(f"{reg.url}/v1/agents").json()["agents"]
            assert agents[0]["instances"] == {"passing": 0, "total": 1}


def test_unhealthy_node_is_warning_and_recovers(tmp_path: Path) -> None:
    flag = tmp_path / "unhealthy"
    with registry(tmp_path) as reg:
        node = start_node(tmp_path, reg.url, extra=["--unhealthy-file", str(flag)])
        with node.proc:
            wait_for(lambda: instances(reg.url), what="passing")
            flag.touch()
            warn = wait_for(
                lambda: [i for i in instances(reg.url, status="warning")], what="warning"
            )
            assert warn[0]["status_reason"] == "/health answered 503"
            assert instances(reg.url) == []
            flag.unlink()
            wait_for(lambda: instances(reg.url), what="passing again")


def test_critical_instance_is_removed_after_the_configured_time(tmp_path: Path) -> None:
    with registry(tmp_path, remove_after=1.0) as reg:
        node = start_node(tmp_path, reg.url)
        with node.proc:
            wait_for(lambda: instances(reg.url), what="passing")
            node.proc.kill()
            wait_for(lambda: instances(reg.url, status="critical"), what="critical")
            wait_for(lambda: instances(reg.url, status="any") == [], what="removed")
            assert httpx.get(f"{reg.url}/v1/agents").json() == {"agents": []}


def test_graceful_stop_deregisters(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        node = start_bureau(tmp_path, reg.url)
        with node.proc:
            wait_for(lambda: instances(reg.url), what="registered")
            # uvicorn re-raises SIGTERM after its graceful shutdown, so the code is -15.
            node.proc.terminate()
            # Deregistered by the node itself: gone at once, not critical first.
            assert instances(reg.url, status="any") == []
            assert "deregistered credit-bureau" in node.proc.output()


def test_registry_restart_on_same_data_dir_keeps_everything(tmp_path: Path) -> None:
    data = tmp_path / "reg-data"
    port = free_port()
    with registry(tmp_path, data_dir=data, port=port) as reg:
        node = start_bureau(tmp_path, reg.url)
        with node.proc:
            (up,) = wait_for(lambda: instances(reg.url), what="registered")
            reg.proc.terminate()
            with registry(tmp_path, data_dir=data, port=port, name="registry-2") as again:
                found = instances(again.url, status="any")
                assert [i["instance_id"] for i in found] == [up["instance_id"]]
                agent = httpx.get(f"{again.url}/v1/agents/credit-bureau").json()
                assert agent["skills"][0]["input_schema"]["required"] == ["applicant_id", "amount"]
                wait_for(lambda: instances(again.url), what="still passing after restart")


def test_node_survives_a_registry_outage_and_registers_again(tmp_path: Path) -> None:
    port = free_port()
    with registry(tmp_path, port=port, data_dir=tmp_path / "first") as reg:
        node = start_bureau(tmp_path, reg.url)
        with node.proc:
            (up,) = wait_for(lambda: instances(reg.url), what="registered")
            reg.proc.kill()
            wait_for(lambda: "discovery unavailable" in node.proc.output(), what="outage seen")
            # The node keeps serving while its registry is gone.
            assert httpx.get(f"{node.url}/health").status_code == 200
            # A fresh data dir: the new registry has never heard of the node.
            with registry(tmp_path, port=port, data_dir=tmp_path / "second", name="r2") as again:
                found = wait_for(lambda: instances(again.url), what="registered again")
                assert found[0]["instance_id"] == up["instance_id"]
            # One warning for the whole outage, not one per attempt.
            assert node.proc.output().count("discovery unavailable") == 1
