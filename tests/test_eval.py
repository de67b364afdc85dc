"""``mesh eval`` against real meshes: a three-hop trajectory read from the nodes' tasks of the
case's trace (tests.stream_agents, registered with a real registry), a wrong expected argument
failing with expected vs actual, the JSON and JUnit reports read back, the trace route's
refusals, and the loan desk's cases (a fault case included) against a fresh ``mesh up``, as
``make eval`` runs them."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.registry_support import instances, registry
from tests.support import ROOT, clean_env, free_port, running, wait_for

pytestmark = pytest.mark.integration


@dataclass
class Mesh:
    registry: str
    top: str
    middle: str
    bottom: str


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("eval")
    urls = {name: f"http://127.0.0.1:{free_port()}" for name in ("bottom", "middle", "top")}
    env = clean_env(STREAM_TEST_BOTTOM=urls["bottom"], STREAM_TEST_MIDDLE=urls["middle"])
    with contextlib.ExitStack() as stack:
        reg = stack.enter_context(registry(tmp))
        for name in ("bottom", "middle", "top"):
            port = urls[name].rsplit(":", 1)[1]
            argv = ["mesh", "serve", f"tests.stream_agents:{name}", "--port", port]
            argv += ["--data-dir", str(tmp / name), "--registry", reg.url, "--grace", "1"]
            stack.enter_context(
                running(argv, name=name, tmp=tmp, env=env, health=f"{urls[name]}/health")
            )
        wait_for(lambda: len(instances(reg.url)) == 3, what="three nodes registered")
        yield Mesh(reg.url, **urls)


def mesh_eval(
    cases: dict[str, Any], tmp: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], ET.Element]:
    """Run ``mesh eval`` on ``cases`` (written as JSON); the output, JSON report, JUnit root."""
    path = tmp / "cases.json"
    path.write_text(json.dumps(cases))
    report, junit = tmp / "report.json", tmp / "junit.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mesh",
            "eval",
            str(path),
            "--json",
            str(report),
            "--junit",
            str(junit),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env or clean_env(),
        cwd=ROOT,
    )
    assert report.exists(), done.stdout + done.stderr
    return done, json.loads(report.read_text()), ET.parse(junit).getroot()


def chain_case(**changes: Any) -> dict[str, Any]:
    case: dict[str, Any] = {
        "name": "report-through-three-hops",
        "agent": "stream-top",
        "turns": ["report alpha"],
        "expect": {"contains": ["middle has the alpha report (3 steps)"]},
        "trajectory": {
            "order": "in_order",
            "calls": [
                {
                    "tool": "ask_stream_middle",
                    "agent": "stream-top",
                    "args": {"text": "report alpha"},
                },
                {"skill": "chat", "agent": "stream-middle", "args": {"text": "report alpha"}},
                {
                    "tool": "stream_bottom_report",
                    "agent": "stream-middle",
                    "args": {"topic": "alpha"},
                },
                {"skill": "report", "agent": "stream-bottom", "args": {"topic": "alpha"}},
            ],
            "must_not_call": [{"skill": "confirm"}],
        },
        "bounds": {"min_delegations": 2, "max_delegations": 2, "latency_s": 30},
    }
    case.update(changes)
    return case


def test_a_three_hop_trajectory_is_assembled_from_the_nodes(mesh: Mesh, tmp_path: Path) -> None:
    case = chain_case()
    case["expect"]["rubric"] = "Says which report the middle agent has."
    done, report, junit = mesh_eval({"cases": [case]}, tmp_path, "--registry", mesh.registry)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"report-through-three-hops\s+pass\s+1/1", done.stdout)
    run = report["cases"][0]["runs"][0]
    # No Gemini key in the test environment: the rubric is skipped, and says so.
    assert run["notes"] == ["rubric not judged: no Gemini key (set GOOGLE_API_KEY)"]
    # The tree: each hop under the task of its caller, read from three nodes.
    assert [(t["depth"], t["agent"], t["skill"]) for t in run["tasks"]] == [
        (0, "stream-top", "chat"),
        (1, "stream-middle", "chat"),
        (2, "stream-bottom", "report"),
    ]
    assert run["delegations"] == 2
    assert run["tokens"] > 0  # the two LLM hops' usage, rolled up
    steps = [(s["kind"], s["agent"], s["name"]) for s in run["trajectory"]]
    assert steps.index(("tool", "stream-top", "ask_stream_middle")) < steps.index(
        ("skill", "stream-bottom", "report")
    )
    # JUnit read back: one passing testcase with its pass rate.
    assert junit.tag == "testsuite"
    assert (junit.get("tests"), junit.get("failures")) == ("1", "0")
    (testcase,) = junit.findall("testcase")
    assert testcase.get("name") == "report-through-three-hops"
    assert testcase.find("failure") is None
    rate = testcase.find("properties/property[@name='pass_rate']")
    assert rate is not None
    assert rate.get("value") == "1.000"


def test_a_wrong_expected_argument_fails_showing_expected_and_actual(
    mesh: Mesh, tmp_path: Path
) -> None:
    wrong = chain_case(
        name="wrong-topic",
        trajectory={
            "calls": [{"skill": "report", "agent": "stream-bottom", "args": {"topic": "beta"}}]
        },
    )
    done, report, junit = mesh_eval(
        {"cases": [chain_case(), wrong]}, tmp_path, "--registry", mesh.registry
    )
    assert done.returncode == 1
    expected = 'expected skill report at stream-bottom with {"topic": "beta"}'
    actual = 'actual skill report args: {"topic": "alpha"} at stream-bottom'
    assert expected in done.stdout, done.stdout
    assert actual in done.stdout, done.stdout
    assert re.search(r"wrong-topic\s+FAIL\s+0/1", done.stdout)
    assert [c["passed"] for c in report["cases"]] == [True, False]
    assert junit.get("failures") == "1"
    failure = junit.find("testcase[@name='wrong-topic']/failure")
    assert failure is not None
    assert expected in failure.get("message", "")
    assert actual in failure.get("message", "")


def test_repeat_reports_the_pass_rate(mesh: Mesh, tmp_path: Path) -> None:
    done, report, _junit = mesh_eval(
        {"cases": [chain_case()]}, tmp_path, "--registry", mesh.registry, "--repeat", "2"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"report-through-three-hops\s+pass\s+2/2", done.stdout)
    assert report["cases"][0]["pass_rate"] == 1.0
    assert len({r["trace_id"] for r in report["cases"][0]["runs"]}) == 2  # a trace per run


def test_the_trace_route_refuses_bad_input(mesh: Mesh) -> None:
    with httpx.Client(timeout=10, trust_env=False) as http:
        bad = http.get(f"{mesh.bottom}/v1/traces/not-a-trace/tasks")
        assert bad.status_code == 400
        assert "trace_id" in bad.json()["error"]
        bad = http.get(f"{mesh.bottom}/v1/traces/{'a' * 32}/tasks", params={"limit": "0"})
        assert bad.status_code == 400
        assert "limit" in bad.json()["error"]
        empty = http.get(f"{mesh.bottom}/v1/traces/{'a' * 32}/tasks")
        assert empty.status_code == 200
        assert empty.json() == {
            "trace_id": "a" * 32,
            "agent": "stream-bottom",
            "tasks": [],
            "truncated": False,
        }


def test_the_trace_route_wants_the_mesh_token(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["mesh", "serve", "tests.stream_agents:bottom", "--port", url.rsplit(":", 1)[1]]
    argv += ["--data-dir", str(tmp_path / "node"), "--no-register"]
    env = clean_env(MESH_TOKEN="s3cret-token-for-eval")
    with (
        running(argv, name="bottom", tmp=tmp_path, env=env, health=f"{url}/health"),
        httpx.Client(timeout=10, trust_env=False) as http,
    ):
        route = f"{url}/v1/traces/{'b' * 32}/tasks"
        assert http.get(route).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert http.get(route, headers=wrong).status_code == 401
        right = {"Authorization": "Bearer s3cret-token-for-eval"}
        assert http.get(route, headers=right).status_code == 200


def _loan_desk_meshfile(tmp: Path) -> Path:
    """agents/mesh.toml on free ports, its state in ``tmp`` (the demo may be running)."""
    text = (ROOT / "agents" / "mesh.toml").read_text()
    bureau = free_port()
    while not _free(bureau + 1):
        bureau = free_port()
    text = text.replace('state_dir = ".mesh"', f'state_dir = "{tmp / "state"}"')
    text = text.replace("port = 8400", f"port = {free_port()}")
    text = text.replace("port = 8401", f"port = {free_port()}")
    text = text.replace('port = "8411-8412"', f'port = "{bureau}-{bureau + 1}"')
    text = text.replace("port = 8421", f"port = {free_port()}")
    text = text.replace("port = 8431", f"port = {free_port()}")
    path = tmp / "mesh.toml"
    path.write_text(text)
    return path


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_loan_desk_cases_pass_against_a_fresh_mesh_up(tmp_path: Path) -> None:
    """What ``make eval`` runs (on free ports): every case of agents/evals/loan_desk.yaml,
    the specialist-down case stopping and restarting the credit bureau."""
    meshfile = _loan_desk_meshfile(tmp_path)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mesh",
            "eval",
            "agents/evals/loan_desk.yaml",
            "--up",
            str(meshfile),
            "--json",
            str(report),
            "--junit",
            str(junit),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(MESH_MODEL="scripted"),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cases = {c["name"]: c for c in json.loads(report.read_text())["cases"]}
    assert len(cases) >= 11
    assert all(c["passed"] for c in cases.values())
    down = cases["credit-bureau-down-says-so"]["runs"][0]
    assert "right now" in down["answer"]["text"]
    assert not [s for s in down["trajectory"] if s["agent"] == "credit-bureau"]
    # Each turn of the follow-up shows its own calls once (the second turn's task does not
    # take the first turn's events of the same conversation).
    follow_up = cases["follow-up-keeps-the-applicant"]["runs"][0]["trajectory"]
    emis = [s["args"]["months"] for s in follow_up if s["name"] == "calculate_emi"]
    assert emis == [36, 60]
    assert ET.parse(junit).getroot().get("failures") == "0"
    # The mesh up it started is gone: nothing listens on its registry's port.
    registry_port = int(meshfile.read_text().split("port = ", 2)[1].split()[0])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", registry_port)) != 0


def test_answers_are_given_when_the_mesh_asks(mesh: Mesh, tmp_path: Path) -> None:
    asks = {
        "name": "bottom-asks",
        "agent": "stream-bottom",
        "turns": [{"data": {"topic": "gamma"}, "skill": "confirm"}],
        "answers": ["yes"],
        "expect": {"fields": {"topic": "gamma (yes)"}},
    }
    unanswered = {**asks, "name": "no-answer-left", "answers": []}
    done, report, _ = mesh_eval(
        {"cases": [asks, unanswered]}, tmp_path, "--registry", mesh.registry
    )
    assert done.returncode == 1
    assert [c["passed"] for c in report["cases"]] == [True, False]
    failures = report["cases"][1]["runs"][0]["failures"]
    assert failures[0] == (
        "turn 1: the mesh asked 'Write the report on gamma?' and the case has no answer left "
        "(add one to 'answers')"
    )
