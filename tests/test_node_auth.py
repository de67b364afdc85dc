"""A mesh with MESH_TOKEN: nodes refuse A2A calls without the token, publish the requirement
in their card (never the token), and present it to their peers, so delegation still works."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from mesh._a2a.client import A2APeer, auth_headers
from mesh._errors import RemoteError
from tests.support import BUREAU_SCORES, ROOT, clean_env
from tests.test_delegation_e2e import QUESTION, Desk, loan_desk

pytestmark = pytest.mark.integration

TOKEN = "mesh-test-token-5c1d"


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desk]:
    with loan_desk(tmp_path_factory.mktemp("authdesk"), token=TOKEN) as d:
        yield d


def _bureau(desk: Desk) -> str:
    return next(iter(desk.bureaus))


def test_card_declares_bearer_and_public_routes_stay_open(desk: Desk) -> None:
    url = _bureau(desk)
    card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=5)
    assert card.status_code == 200
    body = card.json()
    assert body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    assert body["securityRequirements"] == [{"schemes": {"bearer": {}}}]
    assert TOKEN not in card.text
    for path in ("/health", "/metrics", "/introspect"):
        assert httpx.get(f"{url}{path}", timeout=5).status_code == 200, path
        assert TOKEN not in httpx.get(f"{url}{path}", timeout=5).text


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]
)
def test_a2a_calls_without_the_token_get_401(desk: Desk, headers: dict[str, str]) -> None:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    r = httpx.post(
        _bureau(desk) + "/", json=rpc, headers={"A2A-Version": "1.0", **headers}, timeout=5
    )
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "Authorization: Bearer" in r.json()["error"]


async def test_the_sdk_client_works_with_the_token_and_is_told_without(desk: Desk) -> None:
    url = _bureau(desk)
    payload = {"applicant_id": "APP-501", "amount": 250000}
    async with httpx.AsyncClient(timeout=10, headers=auth_headers(TOKEN)) as http:
        peer = A2APeer(http, url)
        result = await peer.send(payload, skill="score")
        await peer.aclose()
    assert result.ok, result.error
    assert result.data is not None
    assert result.data["score"] == BUREAU_SCORES["APP-501"]
    async with httpx.AsyncClient(timeout=10) as http:
        peer = A2APeer(http, url)
        with pytest.raises(RemoteError) as info:
            await peer.send(payload, skill="score")
        await peer.aclose()
    assert info.value.reason == "rejected"
    assert "MESH_TOKEN" in str(info.value)


def test_delegation_presents_the_token_to_peers(desk: Desk) -> None:
    """The officer reaches both specialists (they also require the token)."""

    def call(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mesh", "call", desk.officer, "--text", QUESTION]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)

    answered = call(clean_env(MESH_TOKEN=TOKEN))
    assert answered.returncode == 0, answered.stderr
    assert f"score {BUREAU_SCORES['APP-612']}" in answered.stdout
    assert "Income verifier: discrepancy" in answered.stdout

    refused = call(clean_env())
    assert refused.returncode == 1
    assert "MESH_TOKEN" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_token_never_reaches_the_logs(desk: Desk) -> None:
    for proc in desk.procs:
        assert TOKEN not in proc.output(), proc.name


def test_mesh_call_sends_the_token_from_the_environment(desk: Desk) -> None:
    env = clean_env(MESH_TOKEN=TOKEN)
    argv = [sys.executable, "-m", "mesh", "call", _bureau(desk), "--skill", "score"]
    argv += ["--json", '{"applicant_id": "APP-847", "amount": 100000}']
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["score"] == BUREAU_SCORES["APP-847"]
