"""`mesh tasks`, `mesh reply`, and `mesh chat` / `mesh call` meeting a task that waits for input,
as a user runs them: a real registry, plain a2a-sdk agents that ask (tests.asking_node: not mesh
nodes, so any A2A agent using the standard states works), the commands as processes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.registry_support import instances, registry
from tests.support import ROOT, Proc, clean_env, free_port, wait_for

pytestmark = pytest.mark.integration

APPROVE = "Approve APP-738 for 600,000?"


@dataclass
class Mesh:
    registry: str
    alpha: str  # any A2A agent
    beta: str  # says what a mesh node says of its questions (ids)
    ghost: str  # registered, passing, but no A2A endpoint


def _node(tmp: Any, registry_url: str, name: str, *flags: str) -> tuple[Proc, str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.asking_node", "--name", name, "--port", str(port)]
    proc = Proc.start([*argv, "--registry", registry_url, *flags], name=name, tmp=tmp)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("cli-tasks")
    with registry(tmp) as reg:
        nodes = [
            _node(tmp, reg.url, "alpha"),
            _node(tmp, reg.url, "beta", "--mesh"),
            _node(tmp, reg.url, "ghost", "--no-rpc"),
        ]
        try:
            wait_for(
                lambda: len(instances(reg.url)) == 3,
                timeout=30,
                what="alpha, beta and ghost passing in the registry",
            )
            yield Mesh(reg.url, nodes[0][1], nodes[1][1], nodes[2][1])
        finally:
            for proc, _ in nodes:
                proc.terminate()


def _mesh(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean_env(),
        input=stdin,
    )


def _rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = httpx.post(url, json=body, headers={"A2A-Version": "1.0"}, timeout=10).json()
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


def _send(url: str, text: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A first message to the agent at ``url``: its task."""
    message: dict[str, Any] = {
        "role": "ROLE_USER",
        "messageId": uuid.uuid4().hex,
        "parts": [{"text": text}],
    }
    if metadata:
        message["metadata"] = metadata
    task: dict[str, Any] = _rpc(url, "SendMessage", {"message": message})["task"]
    return task


def _get(url: str, task_id: str) -> dict[str, Any]:
    return _rpc(url, "GetTask", {"id": task_id})


def _row(stdout: str, task_id: str) -> str:
    return next(line for line in stdout.splitlines() if task_id in line)


def test_tasks_lists_the_waiting_tasks_of_every_agent_topmost_of_a_chain(mesh: Mesh) -> None:
    asks = _send(mesh.alpha, "please decide")
    done = _send(mesh.alpha, "plain one")
    consent = _send(mesh.alpha, "auth me")
    top = _send(mesh.beta, "free question")
    # alpha's task as a hop of beta's: the caller's task is beta's waiting one.
    hop = _send(mesh.alpha, "please decide", {"caller": "beta", "callerTask": top["id"]})
    assert asks["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"

    r = _mesh("tasks", "--waiting", "--registry", mesh.registry)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == [
        "AGENT", "TASK", "STATE", "AGE", "SKILL", "CALLER", "ASKS",
    ]  # fmt: skip
    row = _row(r.stdout, asks["id"])
    assert row.startswith("alpha ")
    assert "input-required" in row
    assert row.endswith(APPROVE)
    assert "auth-required" in _row(r.stdout, consent["id"])
    assert "What is the reference number?" in _row(r.stdout, top["id"])
    assert done["id"] not in r.stdout
    # The hop is folded under the topmost waiting task of its chain.
    assert hop["id"] not in r.stdout
    assert "more down their chains; --all shows every hop" in r.stdout
    # The agent that does not answer is named in one line, no traceback.
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"mesh: could not list the tasks of ghost at {mesh.ghost}: ")

    r = _mesh("tasks", "alpha", "beta", "--waiting", "--all", "--registry", mesh.registry)
    assert r.returncode == 0
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    at = lines.index(_row(r.stdout, top["id"]))
    assert lines[at + 1].startswith("  alpha ")
    assert hop["id"] in lines[at + 1]
    assert lines[at + 1].split()[4] == "beta"  # CALLER (a plain agent names no SKILL)

    r = _mesh("tasks", "--waiting", "--all", "--json", "--registry", mesh.registry)
    listed = json.loads(r.stdout)
    by_id = {t["task_id"]: t for t in listed["tasks"]}
    assert by_id[hop["id"]]["caller_task"] == top["id"]
    assert by_id[asks["id"]]["questions"][0]["schema"]["required"] == ["decision"]
    assert by_id[asks["id"]]["questions"][0]["text"] == APPROVE
    assert by_id[top["id"]]["questions"][0]["id"] == "q-0"
    assert [u["agent"] for u in listed["unreachable"]] == ["ghost"]

    r = _mesh("tasks", "alpha", "--state", "completed", "--registry", mesh.registry)
    assert done["id"] in r.stdout
    assert asks["id"] not in r.stdout


def test_reply_json_completes_the_task(mesh: Mesh) -> None:
    task = _send(mesh.beta, "please decide")
    r = _mesh(
        "reply", task["id"], "--json", '{"decision": "approve", "note": "checked"}',
        "--registry", mesh.registry,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    # Found by asking every agent; a mesh node's question id named as the one answered.
    assert json.loads(r.stdout) == {
        "answer": {"decision": "approve", "note": "checked"},
        "answers": "q-0",
    }
    assert _get(mesh.beta, task["id"])["status"]["state"] == "TASK_STATE_COMPLETED"


def test_reply_to_a_hop_of_a_chain_names_the_task_above(mesh: Mesh) -> None:
    top = _send(mesh.beta, "free question")
    hop = _send(mesh.alpha, "please decide", {"caller": "beta", "callerTask": top["id"]})
    r = _mesh("reply", hop["id"], "--json", '{"decision": "approve"}', "--url", mesh.alpha)
    assert r.returncode == 0, r.stderr
    assert f"mesh: note: task {hop['id']} works for beta's task {top['id']}; " in r.stderr


def test_reply_with_an_invalid_answer_is_refused_before_sending(mesh: Mesh) -> None:
    task = _send(mesh.alpha, "please decide")
    before = len(_get(mesh.alpha, task["id"])["history"])
    r = _mesh("reply", task["id"], "--json", '{"decision": "maybe"}', "--agent", "alpha",
              "--registry", mesh.registry)  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.startswith("mesh: error: invalid answer: decision:"), r.stderr
    r = _mesh("reply", task["id"], "--text", "yes", "--agent", "alpha",
              "--registry", mesh.registry)  # fmt: skip
    assert r.returncode == 1
    assert "answer with --json" in r.stderr
    after = _get(mesh.alpha, task["id"])
    assert after["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert len(after["history"]) == before  # nothing was sent


def test_reply_to_an_unknown_task_exits_3(mesh: Mesh) -> None:
    r = _mesh("reply", "no-such-task", "--text", "hi", "--registry", mesh.registry)
    assert r.returncode == 3
    assert "no agent has task no-such-task (asked: alpha, beta, ghost)" in r.stderr
    assert "Traceback" not in r.stderr


def test_reply_to_a_completed_task_exits_1_with_the_agents_message(mesh: Mesh) -> None:
    task = _send(mesh.alpha, "plain two")
    r = _mesh("reply", task["id"], "--text", "late", "--url", mesh.alpha)
    assert r.returncode == 1
    assert f"Task {task['id']} is in terminal state: TASK_STATE_COMPLETED" in r.stderr
    assert "Traceback" not in r.stderr


def test_reply_to_a_task_that_asks_again_exits_4_with_the_next_question(mesh: Mesh) -> None:
    task = _send(mesh.alpha, "free question")
    r = _mesh("reply", task["id"], "--text", "again", "--url", mesh.alpha)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "  ? alpha asks: And the note for the file?" in r.stdout
    assert f"reply {task['id']} --text ... --url {mesh.alpha}" in r.stdout
    r = _mesh("reply", task["id"], "--text", "R-17", "--url", mesh.alpha)
    assert r.returncode == 0
    assert json.loads(r.stdout)["answer"] == "R-17"


def test_chat_shows_the_question_and_sends_the_next_line_as_the_answer(mesh: Mesh) -> None:
    lines = ["please decide", "not json", '{"decision": "perhaps"}', '{"decision": "decline"}']
    r = _mesh("chat", "alpha", "--registry", mesh.registry, stdin="\n".join(lines) + "\nexit\n")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"  ? alpha asks: {APPROVE}" in out
    assert "    answer with JSON: {decision*: approve|decline, note: string} (* required)" in out
    assert '  ! the answer must be JSON (Expecting value), e.g. {"decision": "approve"}' in out
    assert "  ! invalid answer: decision:" in out
    said = out.split("agent> ", 1)[1].splitlines()[0]
    assert json.loads(said) == {"answer": {"decision": "decline"}, "answers": ""}
    assert out.index("! invalid answer") < out.index("agent> {")


def test_call_prints_the_question_and_the_reply_command(mesh: Mesh) -> None:
    r = _mesh("call", "alpha", "--text", "please decide", "--registry", mesh.registry)
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"  ? alpha asks: {APPROVE}" in r.stdout
    command = r.stdout.split("reply with: ", 1)[1].strip()
    argv = shlex.split(command)
    at = argv.index("reply")
    assert argv[at + 2 :] == [
        "--json", '{"decision": "approve"}', "--agent", "alpha", "--registry", mesh.registry,
    ]  # fmt: skip
    # The command as printed answers the task.
    done = _mesh(*argv[at:])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == {"decision": "approve"}


def test_reply_without_an_answer_is_a_usage_error() -> None:
    r = _mesh("reply", "some-task")
    assert r.returncode == 2
    assert "one of the arguments --json --text is required" in r.stderr


def test_call_and_reply_drive_a_mesh_node_whose_typed_skill_asks(tmp_path: Any) -> None:
    """The same commands against a real `mesh serve` node whose skill asks twice (ctx.ask):
    call shows the first question, a reply the second, the last reply completes the task."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable, "-m", "mesh", "serve", "tests.ask_agents:agent", "--port", str(port),
        "--data-dir", str(tmp_path / "node"), "--no-register",
    ]  # fmt: skip
    node = Proc.start(argv, name="asker", tmp=tmp_path, env=clean_env())
    try:
        wait_for(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, timeout=30,
                 what="the asking node's /health")  # fmt: skip
        args = '{"applicant_id": "APP-738", "amount": 600000}'
        r = _mesh("call", url, "--skill", "review", "--json", args)
        assert r.returncode == 4, r.stdout + r.stderr
        assert "Approve APP-738 for 600,000?" in r.stdout
        argv = shlex.split(r.stdout.split("reply with: ", 1)[1].strip())
        task_id = argv[argv.index("reply") + 1]

        bad = _mesh("reply", task_id, "--url", url, "--json", '{"decision": "perhaps"}')
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "decision" in bad.stdout + bad.stderr

        again = _mesh("reply", task_id, "--url", url, "--json", '{"decision": "approve"}')
        assert again.returncode == 4, again.stdout + again.stderr
        assert "Who approves?" in again.stdout

        done = _mesh("reply", task_id, "--url", url, "--text", "Ann Lee")
        assert done.returncode == 0, done.stdout + done.stderr
        task = _get(url, task_id)
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        assert "Ann Lee" in json.dumps(task["artifacts"])
    finally:
        node.terminate()
