"""Call policy (issue 16 item 4): ``MESH_ALLOW`` says which callers may call which skills.

Unit tests pin the rule syntax and matching; the integration test runs the real loan officer's
stand-in, the credit bureau and a worker with three skills, all with keys and one shared
``MESH_ALLOW``: the allowed delegation works, every other call is a 403 naming the caller, the
skill and the rules (JSON-RPC error on JSON-RPC, the REST shape on REST), counted in
``mesh_calls_denied_total``, and ``/introspect`` shows the rules. A malformed rule stops the node
before it listens.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mesh._a2a import jsonrpc
from mesh._a2a.client import A2APeer
from mesh._errors import ConfigError, RemoteError
from mesh._gate import POLICY_DENIED
from mesh._identity import CallerIdentity
from mesh._keys import AgentKeys, init_mesh, issue_agent
from mesh._policy import CallPolicy
from mesh._settings import MeshSettings
from tests.registry_support import registry
from tests.support import BUREAU_SCORES, Proc, clean_env, free_port, running, wait_for

USER_TOKEN = "policy-user-token-5c1d"
POLICY = (
    "test-officer -> credit-bureau:score; @token -> test-officer:*;\n"
    "test-officer -> test-worker:echo, * -> test-worker:broken"
)


def test_rules_parse_and_match() -> None:
    policy = CallPolicy.parse(POLICY)
    assert [str(r) for r in policy.for_agent("test-worker").rules] == [
        "test-officer -> test-worker:echo",
        "* -> test-worker:broken",
    ]
    worker = policy.for_agent("test-worker")
    assert worker.allows("test-officer", "echo")
    assert not worker.allows("test-officer", "slow")
    # '*' is any agent with a verified call token, never a call without one.
    assert worker.allows("fx-desk", "broken")
    assert not worker.allows("@token", "broken")
    assert worker.allows("fx-desk", None)  # some skill: the task methods
    assert not worker.allows_all("test-officer", ["echo", "slow", "broken"])
    assert CallPolicy.parse("a -> b").rules[0].skill == "*"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("test-officer credit-bureau:score", "not a rule"),
        ("Officer -> credit-bureau:score", "the caller 'Officer' is not an agent name"),
        ("a -> credit bureau:score", "the agent 'credit bureau' is not an agent name"),
        ("a -> credit-bureau:Score!", "the skill 'Score!' is not a skill id"),
        ("-> credit-bureau:score", "not a rule"),
    ],
)
def test_a_malformed_rule_is_named(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match="MESH_ALLOW=") as raised:
        MeshSettings.from_env({"MESH_ALLOW": f"a -> b:c; {text}"})
    assert why in str(raised.value)
    assert "CALLER -> AGENT:SKILL" in str(raised.value)


def test_a_rule_naming_a_skill_the_agent_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"test-worker has no skill 'eco' \(it offers: "):
        CallPolicy.parse("a -> test-worker:eco").check("test-worker", ["echo", "slow"])


@dataclass
class Mesh:
    officer: str
    bureau: str
    worker: str
    keys: dict[str, AgentKeys]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("policy")
    init_mesh(tmp / "mesh")
    folders = {
        name: issue_agent(tmp / "mesh", name)
        for name in ("test-officer", "credit-bureau", "test-worker", "fx-desk")
    }
    keys = {name: AgentKeys.load(folder, name) for name, folder in folders.items()}
    with registry(tmp) as reg:
        bport, oport, wport = free_port(), free_port(), free_port()
        urls = [f"http://127.0.0.1:{p}" for p in (bport, oport, wport)]
        bureau_env = clean_env(MESH_ALLOW=POLICY, MESH_KEYS=str(folders["credit-bureau"]))
        serve = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(bport)]
        serve += ["--data-dir", str(tmp / "bureau"), "--registry", reg.url]
        with running(serve, name="bureau", tmp=tmp, health=f"{urls[0]}/health", env=bureau_env):
            env = clean_env(
                MESH_TOKEN=USER_TOKEN,
                MESH_REGISTRY=reg.url,
                MESH_PEER_NETWORKS="127.0.0.1/32",
                MESH_KEYS=str(folders["test-officer"]),
                MESH_ALLOW=POLICY,
            )
            serve = ["mesh", "serve", "tests.trust_agents:officer", "--port", str(oport)]
            serve += ["--data-dir", str(tmp / "officer"), "--grace", "1"]
            with running(serve, name="officer", tmp=tmp, health=f"{urls[1]}/health", env=env):
                env = clean_env(
                    MESH_TOKEN=USER_TOKEN,
                    MESH_KEYS=str(folders["test-worker"]),
                    MESH_ALLOW=POLICY,
                )
                serve = ["mesh", "serve", "tests.node_agents:agent", "--port", str(wport)]
                serve += ["--data-dir", str(tmp / "worker"), "--no-register", "--grace", "1"]
                health = f"{urls[2]}/health"
                with running(serve, name="worker", tmp=tmp, health=health, env=env):
                    yield Mesh(urls[1], urls[0], urls[2], keys)


def _send(
    url: str, token: str, skill: str | None, *, rest: bool = False, task_id: str | None = None
) -> httpx.Response:
    payload = {"key": "k", "n": 2} if skill != "score" else {"applicant_id": "APP-501"}
    body = jsonrpc.send_message_body(
        payload,
        skill=skill,
        message_id=uuid.uuid4().hex,
        context_id=None,
        metadata=None,
        wait=True,
        task_id=task_id,
    )
    headers = {**jsonrpc.HEADERS, "Authorization": f"Bearer {token}"}
    if rest:
        params = json.loads(body)["params"]
        return httpx.post(f"{url}/a2a/rest/message:send", json=params, headers=headers, timeout=10)
    return httpx.post(url + "/", content=body, headers=headers, timeout=10)


def _denied(mesh: Mesh, caller: str, skill: str) -> float:
    text = httpx.get(mesh.worker + "/metrics", timeout=5).text
    series = f'mesh_calls_denied_total{{agent="test-worker",caller="{caller}",skill="{skill}"}} '
    for line in text.splitlines():
        if line.startswith(series):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.integration
async def test_the_policy_allows_a_delegation_its_rules_name(mesh: Mesh) -> None:
    # Allowed end to end: the user (the mesh token, @token) asks the officer, whose own call
    # token opens the bureau's score.
    headers = {"Authorization": f"Bearer {USER_TOKEN}"}
    async with httpx.AsyncClient(timeout=60, trust_env=False, headers=headers) as http:
        peer = A2APeer(http, mesh.officer)
        try:
            result = await peer.send("score APP-501")
        finally:
            await peer.aclose()
    assert result.ok, result
    assert result.text == f"score {BUREAU_SCORES['APP-501']}"


@pytest.mark.integration
async def test_a_caller_refused_by_the_policy_is_told_why(mesh: Mesh) -> None:
    # mesh's own client (what remote() and mesh call use) passes the callee's reason on.
    headers = {"Authorization": f"Bearer {USER_TOKEN}"}
    async with httpx.AsyncClient(timeout=30, trust_env=False, headers=headers) as http:
        peer = A2APeer(http, mesh.worker)
        try:
            with pytest.raises(RemoteError) as refused:
                await peer.send({"key": "k", "n": 1}, skill="echo")
        finally:
            await peer.aclose()
    assert refused.value.reason == "rejected"
    assert str(refused.value).startswith(
        f"{mesh.worker} refused the call (HTTP 403): a caller without a call token (@token) may "
        "not call test-worker:echo"
    )


@pytest.mark.integration
def test_the_policy_refuses_what_no_rule_allows(mesh: Mesh) -> None:
    officer = CallerIdentity(mesh.keys["test-officer"])
    intruder = CallerIdentity(mesh.keys["fx-desk"])
    # Another agent of the same mesh, verified, but no rule lets it score.
    r = _send(mesh.bureau, intruder.token("credit-bureau"), "score")
    assert r.status_code == 403, r.text
    assert "fx-desk may not call credit-bureau:score" in r.json()["error"]["message"]

    assert _send(mesh.worker, officer.token("test-worker"), "echo").status_code == 200
    before = _denied(mesh, "test-officer", "slow")
    r = _send(mesh.worker, officer.token("test-worker"), "slow")
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == POLICY_DENIED
    assert r.json()["id"] == json.loads(r.request.content)["id"]
    assert error["message"].startswith(
        "test-officer may not call test-worker:slow: no MESH_ALLOW rule allows it (the rules "
        "for test-worker: test-officer -> test-worker:echo; * -> test-worker:broken)"
    )
    assert _denied(mesh, "test-officer", "slow") == before + 1

    # The mesh token names no caller: only @token rules admit it. The REST shape on REST.
    r = _send(mesh.worker, USER_TOKEN, "echo", rest=True)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["status"] == "PERMISSION_DENIED"
    assert r.json()["error"]["message"].startswith(
        "a caller without a call token (@token) may not call test-worker:echo"
    )
    assert _denied(mesh, "@token", "echo") >= 1
    # '*' admits any verified agent to broken (which fails, but is called).
    r = _send(mesh.worker, intruder.token("test-worker"), "broken")
    assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_FAILED", r.text
    # A message naming no skill needs them all (the node would pick one from its parts).
    r = _send(mesh.worker, officer.token("test-worker"), None)
    assert r.status_code == 403
    assert "test-worker without naming a skill (that needs test-worker:*)" in r.text
    # Task methods need some skill of the agent.
    get = {"jsonrpc": "2.0", "id": 7, "method": "GetTask", "params": {"id": "t-1"}}
    headers = {**jsonrpc.HEADERS, "Authorization": f"Bearer {USER_TOKEN}"}
    r = httpx.post(mesh.worker + "/", json=get, headers=headers, timeout=10)
    assert r.status_code == 403
    assert "test-worker (GetTask)" in r.text

    policy = httpx.get(mesh.worker + "/introspect", timeout=5).json()["policy"]
    assert policy == {
        "allow": ["test-officer -> test-worker:echo", "* -> test-worker:broken"],
        "otherwise": "denied (403)",
    }


@pytest.mark.integration
@pytest.mark.parametrize(
    ("allow", "said"),
    [
        ("test-officer test-worker:echo", "rule 'test-officer test-worker:echo': not a rule"),
        ("test-officer -> test-worker:eco", "test-worker has no skill 'eco'"),
    ],
)
def test_a_malformed_policy_stops_the_node_at_start(tmp_path: Path, allow: str, said: str) -> None:
    serve = ["mesh", "serve", "tests.node_agents:agent", "--port", str(free_port())]
    serve += ["--data-dir", str(tmp_path / "worker"), "--no-register"]
    with Proc.start(serve, name="worker", tmp=tmp_path, env=clean_env(MESH_ALLOW=allow)) as proc:
        wait_for(lambda: proc.popen.poll() is not None, timeout=30)
        assert proc.popen.returncode != 0
        assert said in proc.output()
        assert "Traceback" not in proc.output()
