"""The registry's HTTP API against real processes: validation, auth, SD, metrics, OpenAPI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.registry_support import instances, registry, start_node
from tests.support import Proc, free_port, wait_for, wait_until_ok

pytestmark = pytest.mark.integration


def _static_server(tmp: Path, card: str) -> tuple[Proc, str]:
    """A plain HTTP server whose agent card is ``card`` (whatever text that is)."""
    root = tmp / "static"
    (root / ".well-known").mkdir(parents=True)
    (root / ".well-known" / "agent-card.json").write_text(card)
    (root / "health").write_text("ok")
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
            "--directory", str(root)]  # fmt: skip
    proc = Proc.start(argv, name=f"static-{port}", tmp=tmp)
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", proc=proc)
    return proc, url


def _register(reg: str, body: dict[str, object], token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{reg}/v1/instances", json=body, headers=headers, timeout=10)


@pytest.fixture
def reg(tmp_path: Path):  # type: ignore[no-untyped-def]
    with registry(tmp_path) as service:
        yield service.url


def test_missing_field_names_the_field(reg: str) -> None:
    r = _register(reg, {"instance_id": "x", "agent": "echo"})
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid_request"
    assert "url: Field required" in body["message"]


def test_body_that_is_not_json_is_a_clear_422(reg: str) -> None:
    r = httpx.post(
        f"{reg}/v1/instances", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert r.json()["message"].startswith("body: not valid JSON")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"instance_id": "\xff\xfe", "url": "http://127.0.0.1:1", "agent": "a"}', "UTF-8"),
        (b"[" * 20_000, "nested too deeply"),
    ],
)
def test_a_body_json_cannot_decode_is_the_documented_422_naming_body(
    reg: str, body: bytes, why: str
) -> None:
    """Not a 400 'There was an error parsing the body' (FastAPI's answer when json.loads fails
    other than on syntax): the API's one shape for a bad request."""
    r = httpx.post(
        f"{reg}/v1/instances", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"
    assert r.json()["fields"][0]["field"] == "body"
    assert why in r.json()["message"]


def test_bad_url_and_agent_name_are_named(reg: str) -> None:
    r = _register(reg, {"instance_id": "x", "agent": "Echo!", "url": "ftp://nowhere"})
    assert r.status_code == 422
    fields = {f["field"] for f in r.json()["fields"]}
    assert fields == {"url", "agent"}


def test_url_that_does_not_answer_is_refused_with_a_reason(reg: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    r = _register(reg, {"instance_id": "x", "agent": "echo", "url": dead})
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_card"
    assert (
        f"could not fetch the agent card from {dead}/.well-known/agent-card.json"
        in (r.json()["message"])
    )
    assert instances(reg, status="any") == []


@pytest.mark.parametrize(
    ("card", "expected"),
    [
        ("<html>not json</html>", "is not JSON"),
        ('["a", "list"]', "is not a JSON object"),
        ('{"name": "echo", "skills": "not-a-list"}', "does not parse as an A2A 1.0 card"),
        ('{"name": "someone-else"}', "names another agent, not 'echo'"),
    ],
)
def test_bad_cards_are_refused(reg: str, tmp_path: Path, card: str, expected: str) -> None:
    proc, url = _static_server(tmp_path, card)
    with proc:
        r = _register(reg, {"instance_id": "x", "agent": "echo", "url": url})
        assert r.status_code == 422, r.text
        assert expected in r.json()["message"]


def test_heartbeat_unknown_and_deregister_unknown(reg: str) -> None:
    r = httpx.put(f"{reg}/v1/instances/ghost/heartbeat")
    assert r.status_code == 404
    assert r.json()["error"] == "unknown_instance"
    assert httpx.delete(f"{reg}/v1/instances/ghost").status_code == 204
    r = httpx.get(f"{reg}/v1/agents/ghost")
    assert r.status_code == 404
    assert r.json() == {"error": "unknown_agent", "message": "no agent named 'ghost' is registered"}
    r = httpx.get(f"{reg}/v1/instances", params={"status": "sleepy"})
    assert r.status_code == 422
    assert r.json()["message"].startswith("status:")


def test_agent_detail_filters_and_prometheus_targets(reg: str, tmp_path: Path) -> None:
    a = start_node(tmp_path, reg, name="alpha", instance_id="alpha-1", extra=["--skill", "shout"])
    b = start_node(tmp_path, reg, name="beta", instance_id="beta-1",
                   extra=["--description", "Counts beans carefully."])  # fmt: skip
    with a.proc, b.proc:
        wait_for(lambda: len(instances(reg)) == 2, what="both registered")
        agents = httpx.get(f"{reg}/v1/agents").json()["agents"]
        assert [x["name"] for x in agents] == ["alpha", "beta"]
        assert agents[0]["instances"] == {"passing": 1, "total": 1}

        def names(**params: str) -> list[str]:
            r = httpx.get(f"{reg}/v1/agents", params=params)
            return [x["name"] for x in r.json()["agents"]]

        assert names(skill="shout") == ["alpha"]
        assert names(q="BEANS") == ["beta"]
        assert names(tag="echo") == ["alpha", "beta"]
        assert names(tag="nope") == []
        assert [i["agent"] for i in instances(reg, skill="shout")] == ["alpha"]

        detail = httpx.get(f"{reg}/v1/agents/alpha").json()
        assert detail["card"]["name"] == "alpha"
        skill = detail["skills"][0]
        assert skill["id"] == "shout"
        assert skill["input_schema"]["properties"]["text"]["type"] == "string"
        assert skill["output_schema"]["required"] == ["echo"]
        assert detail["instances"][0]["url"] == a.url

        groups = httpx.get(f"{reg}/v1/prometheus/targets").json()
        assert sorted(groups, key=lambda g: g["labels"]["agent"]) == [
            {"targets": [f"127.0.0.1:{a.port}"],
             "labels": {"agent": "alpha", "version": "1.2.3", "instance": "alpha-1"}},
            {"targets": [f"127.0.0.1:{b.port}"],
             "labels": {"agent": "beta", "version": "1.2.3", "instance": "beta-1"}},
        ]  # fmt: skip
        b.proc.kill()
        wait_for(
            lambda: len(httpx.get(f"{reg}/v1/prometheus/targets").json()) == 1,
            what="dead instance out of SD",
        )


def test_prometheus_accepts_the_targets_file(reg: str, tmp_path: Path) -> None:
    promtool = Path("/usr/bin/promtool")
    if not promtool.exists():
        pytest.skip("promtool is not installed (.ci/system-deps installs it)")
    node = start_node(tmp_path, reg)
    with node.proc:
        wait_for(lambda: instances(reg), what="registered")
        groups = httpx.get(f"{reg}/v1/prometheus/targets").json()
    # The same JSON, as a file_sd file: promtool validates target groups the way HTTP SD reads them.
    sd = tmp_path / "targets.json"
    sd.write_text(json.dumps(groups))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "scrape_configs:\n  - job_name: mesh\n    file_sd_configs:\n"
        f"      - files: ['{sd}']\n"
        "  - job_name: mesh-http\n    http_sd_configs:\n"
        f"      - url: '{reg}/v1/prometheus/targets'\n"
    )
    result = subprocess.run(
        [str(promtool), "check", "config", str(config)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_registry_health_metrics_and_openapi(reg: str) -> None:
    health = httpx.get(f"{reg}/health").json()
    assert (health["status"], health["store"]) == ("ok", "ok")
    assert isinstance(health["pid"], int)
    httpx.put(f"{reg}/v1/instances/ghost/heartbeat")
    metrics = httpx.get(f"{reg}/metrics").text
    assert (
        'mesh_registry_requests_total{route="/v1/instances/{instance_id}/heartbeat",status="404"} 1.0'
        in metrics
    )
    spec = httpx.get(f"{reg}/openapi.json").json()
    paths = set(spec["paths"])
    assert {"/v1/instances", "/v1/agents", "/v1/agents/{name}", "/v1/prometheus/targets"} <= paths
    assert "/" not in paths  # the operator page is not API
    # /metrics is Prometheus text, and the schema says so (it said application/json).
    documented = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    served = httpx.get(f"{reg}/metrics").headers["content-type"]
    assert "application/json" not in documented
    assert served in documented
    assert "text/plain" in documented


def test_token_guards_writes_not_reads(tmp_path: Path) -> None:
    with registry(tmp_path, token="s3cret") as reg:
        body = {"instance_id": "x", "agent": "echo", "url": "http://127.0.0.1:1"}
        r = _register(reg.url, body)
        assert r.status_code == 401
        assert "Authorization: Bearer" in r.json()["message"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert _register(reg.url, body, token="wrong").status_code == 403
        assert httpx.delete(f"{reg.url}/v1/instances/x").status_code == 401
        assert httpx.put(f"{reg.url}/v1/instances/x/heartbeat").status_code == 401
        assert httpx.get(f"{reg.url}/v1/agents").status_code == 200

        refused = start_node(tmp_path, reg.url, name="echo", log="no-token")
        allowed = start_node(tmp_path, reg.url, name="echo", token="s3cret", instance_id="ok-1")
        with refused.proc, allowed.proc:
            found = wait_for(lambda: instances(reg.url), what="node with token registered")
            assert [i["instance_id"] for i in found] == ["ok-1"]
            wait_for(lambda: "refused the request" in refused.proc.output(), what="refusal log")
            assert "s3cret" not in reg.proc.output()
