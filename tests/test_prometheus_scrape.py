"""A real Prometheus scraping the loan desk through the registry's HTTP service discovery, with
deploy/prometheus/prometheus.yml pointed at live loopback processes; then every Grafana panel's
query, asked of that Prometheus."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import Proc, clean_env, free_port, running, wait_for, wait_until_ok
from tests.test_deploy_grafana import panels, substitute

pytestmark = [
    pytest.mark.integration,
    pytest.mark.prometheus,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus is not installed (apt-get install prometheus; see .ci/system-deps)",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
NODES = {
    "credit-bureau-1": "agents.credit_bureau:agent",
    "credit-bureau-2": "agents.credit_bureau:agent",
    "income-verifier": "agents.income_verifier:agent",
    "loan-officer": "agents.loan_officer:agent",
}
QUESTION = "Should we approve APP-612 for 400,000 over 48 months?"


@dataclass
class Stack:
    registry: str
    prometheus: str
    nodes: dict[str, tuple[str, Proc]] = field(default_factory=dict)  # name -> (url, proc)
    tmp: Path = Path()


def prometheus_config(registry: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml, aimed at the live registry, scraping every second."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    (sd,) = jobs["mesh-nodes"]["http_sd_configs"]
    assert sd["url"] == "http://registry:8400/v1/prometheus/targets"
    sd.update(url=f"{registry}/v1/prometheus/targets", refresh_interval="1s")
    (static,) = jobs["mesh-registry"]["static_configs"]
    static["targets"] = [registry.removeprefix("http://")]
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("scrape")
    reg_port = free_port()
    registry = f"http://127.0.0.1:{reg_port}"
    env = clean_env(MESH_REGISTRY=registry, LOAN_DESK_DEADLINE_S="8")
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            running(
                [
                    "mesh", "registry", "--port", str(reg_port), "--data-dir", str(tmp / "reg"),
                    # Slow probes: a stopped node stays listed, so callers still try it and
                    # the retry, error and breaker series get samples.
                    "--probe-interval", "30", "--ttl", "120",
                ],
                name="registry", tmp=tmp, health=f"{registry}/health", env=env,
            )
        )  # fmt: skip
        nodes: dict[str, tuple[str, Proc]] = {}
        for name, module in NODES.items():
            port = free_port()
            argv = [
                "mesh", "serve", module, "--port", str(port), "--data-dir", str(tmp / name),
                "--registry", registry, "--grace", "2",
            ]  # fmt: skip
            proc = Proc.start(argv, name=name, tmp=tmp, env=env)
            stack.callback(proc.terminate)
            nodes[name] = (f"http://127.0.0.1:{port}", proc)
        for url, proc in nodes.values():
            wait_until_ok(f"{url}/health", proc=proc, timeout=40)

        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(registry)))
        prom_port = free_port()
        prometheus = stack.enter_context(
            running(
                [
                    "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
                ],
                name="prometheus", tmp=tmp, health=f"http://127.0.0.1:{prom_port}/-/ready",
            )
        )  # fmt: skip
        assert prometheus.popen.poll() is None
        yield Stack(registry, f"http://127.0.0.1:{prom_port}", nodes, tmp)


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    """An instant query; fails the test if Prometheus does not accept it."""
    response = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def by(prom: str, expr: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in query(prom, expr)}


def ask(url: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", "call", url, "--text", text, "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(),
        cwd=ROOT,
    )


def instance_ids(registry: str) -> dict[str, str]:
    found = httpx.get(f"{registry}/v1/instances", params={"status": "any"}, timeout=5).json()
    return {i["url"]: i["instance_id"] for i in found["instances"]}


def test_every_node_is_up_and_labelled_by_agent_and_instance(stack: Stack) -> None:
    ids = instance_ids(stack.registry)
    expected = {ids[url]: name.rsplit("-", 1)[0] if name[-1].isdigit() else name
                for name, (url, _) in stack.nodes.items()}  # fmt: skip

    def all_up() -> list[dict[str, Any]] | None:
        result = query(stack.prometheus, 'up{job="mesh-nodes"}')
        ok = len(result) == len(NODES) and all(r["value"][1] == "1" for r in result)
        return result if ok else None

    result = wait_for(all_up, timeout=40, what="every node up == 1 in Prometheus")
    assert {r["metric"]["instance"]: r["metric"]["agent"] for r in result} == expected
    wait_for(
        lambda: by(stack.prometheus, 'up{job="mesh-registry"}', "agent") == {"registry": 1.0},
        timeout=20,
        what="the registry scraped",
    )


def test_mesh_series_are_queryable_by_agent_after_traffic(stack: Stack) -> None:
    for _ in range(2):
        answer = ask(stack.nodes["loan-officer"][0], QUESTION)
        assert answer.returncode == 0, answer.stdout + answer.stderr

    seen: dict[str, dict[str, float]] = {}

    def series() -> tuple[dict[str, float], dict[str, float], dict[str, float]] | None:
        tasks = by(stack.prometheus, "sum by (agent) (mesh_tasks_total)", "agent")
        delegations = by(
            stack.prometheus,
            'sum by (peer) (mesh_delegations_total{agent="loan-officer", outcome="ok"})',
            "peer",
        )
        tokens = by(stack.prometheus, "sum by (agent) (mesh_tokens_total)", "agent")
        seen.update(tasks=tasks, delegations=delegations, tokens=tokens)
        done = (
            tasks.get("loan-officer", 0) >= 2
            # Both specialists served their share of the officer's delegations.
            and tasks.get("credit-bureau", 0) >= 2
            and tasks.get("income-verifier", 0) >= 2
            and delegations.get("credit-bureau", 0) >= 2
            and delegations.get("income-verifier", 0) >= 2
            and tokens.get("loan-officer", 0) > 0
        )
        return (tasks, delegations, tokens) if done else None

    try:
        # Generous: on a loaded machine some 1 s scrapes time out before one succeeds.
        wait_for(series, timeout=60, what="mesh series after two questions")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None


def test_every_grafana_panel_query_parses_and_returns_data(stack: Stack) -> None:
    # Errors for the error panels: the income verifier dies (SIGKILL: no deregistration) while
    # the registry still lists it; the officer retries, fails over to nobody, opens its breaker.
    _, verifier = stack.nodes["income-verifier"]
    verifier.kill()
    for _ in range(3):
        ask(stack.nodes["loan-officer"][0], QUESTION)  # answers may be referrals or errors

    agents = httpx.get(
        f"{stack.prometheus}/api/v1/label/agent/values",
        params={"match[]": "mesh_node_info"},
        timeout=5,
    ).json()["data"]
    assert {"credit-bureau", "income-verifier", "loan-officer"} <= set(agents)

    def empty_panels() -> list[str]:
        empty = []
        for panel in panels():
            results = [query(stack.prometheus, substitute(t["expr"])) for t in panel["targets"]]
            if not any(results):
                empty.append(panel["title"])
        return empty

    last: list[str] = []

    def all_have_data() -> bool:
        nonlocal last
        last = empty_panels()
        return not last

    with contextlib.suppress(AssertionError):
        wait_for(all_have_data, timeout=40, interval=1.0, what="data in every panel")
    assert not last, f"panels without data: {last}"
