"""HTTP details of a real node: the bearer scheme is case-insensitive (RFC 7235), every 405 says
what is allowed, /metrics speaks the format the scraper asks for, and the metric labels a caller
controls (JSON-RPC method, skill id) stay a closed set however many values it tries."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import clean_env, free_port, running

pytestmark = pytest.mark.integration

TOKEN = "http-test-token-9f2e"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("http")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "serve", "tests.node_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / "data"), "--no-register"]
    env = clean_env(MESH_TOKEN=TOKEN)
    with running(argv, name="node", tmp=tmp, health=f"{url}/health", env=env):
        yield url


def _rpc(method: str, params: dict[str, object]) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(node: str, scheme: str) -> None:
    r = httpx.post(
        node + "/",
        json=_rpc("GetTask", {"id": "no-such-task"}),
        headers={"A2A-Version": "1.0", "Authorization": f"{scheme} {TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["error"]["code"] == -32001  # task not found: the call got through


@pytest.mark.parametrize("value", [f"Basic {TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN}x", TOKEN])
def test_anything_else_is_still_refused(node: str, value: str) -> None:
    r = httpx.post(
        node + "/",
        json=_rpc("GetTask", {"id": "x"}),
        headers={"A2A-Version": "1.0", "Authorization": value},
        timeout=10,
    )
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/", "POST"),
        ("PUT", "/", "POST"),
        ("POST", "/health", "GET"),
        ("DELETE", "/metrics", "GET"),
        ("POST", "/introspect", "GET"),
        ("PUT", "/.well-known/agent-card.json", "GET"),
    ],
)
def test_405_answers_say_what_is_allowed(node: str, method: str, path: str, allowed: str) -> None:
    r = httpx.request(method, node + path, timeout=10)
    assert r.status_code == 405
    assert allowed in r.headers["allow"]


def test_metrics_speak_the_format_the_scraper_asks_for(node: str) -> None:
    plain = httpx.get(node + "/metrics", timeout=10)
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    names = {f.name for f in text_string_to_metric_families(plain.text)}
    assert "mesh_requests" in names
    # What Prometheus >= 2.5 sends: OpenMetrics first.
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    om = httpx.get(node + "/metrics", headers={"Accept": accept}, timeout=10)
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.rstrip().endswith("# EOF")


def _samples(url: str) -> dict[str, set[str]]:
    """Label values per label name of mesh_requests_total and mesh_tasks_total."""
    text = httpx.get(url + "/metrics", timeout=10).text
    seen: dict[str, set[str]] = {"method": set(), "skill": set()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name in seen:
                if name in sample.labels and family.name in ("mesh_requests", "mesh_tasks"):
                    seen[name].add(sample.labels[name])
    return seen


def test_labels_chosen_by_callers_stay_a_closed_set(node: str) -> None:
    auth = {"A2A-Version": "1.0", "Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=30, headers=auth) as http:
        http.post(node + "/", json=_rpc("GetTask", {"id": "warm-up"}))
        before = len(http.get(node + "/metrics").content)
        # Random method names, one of them 100 KB long.
        for i in range(300):
            name = "x" * 100_000 if i == 0 else f"Method{uuid.uuid4().hex}"
            http.post(node + "/", json=_rpc(name, {}))
        # Unknown skill ids (each task is REJECTED), one of them 100 KB long.
        for i in range(300):
            skill = "s" * 100_000 if i == 0 else f"skill-{uuid.uuid4().hex}"
            message = {
                "messageId": uuid.uuid4().hex,
                "role": "ROLE_USER",
                "parts": [{"data": {"key": "k"}}],
                "metadata": {"skill": skill},
            }
            r = http.post(node + "/", json=_rpc("SendMessage", {"message": message}))
            assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_REJECTED"
        after = len(http.get(node + "/metrics").content)
    seen = _samples(node)
    assert "other" in seen["method"]
    assert "other" in seen["skill"]
    assert seen["skill"] <= {"echo", "slow", "broken", "other"}
    assert all(len(m) < 40 for m in seen["method"]), seen["method"]
    # A handful of new series (the 'other' ones), not one per value tried.
    assert after - before < 4_000, (before, after)
