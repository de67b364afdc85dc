"""deploy/grafana: the provisioned datasource and the mesh dashboard. Every panel query parses
(promtool) and names only metrics that docs/architecture.md defines."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "mesh.json"
# What the dashboard's template variables and Grafana's built-ins become for a plain query.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$agent": ".*",
}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def substitute(expr: str) -> str:
    """A panel query as Prometheus receives it (variables replaced, longest name first)."""
    for name in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(name, SUBSTITUTIONS[name])
    return expr


def documented_metrics() -> dict[str, str]:
    """``name -> type`` from the metrics table in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(mesh_\w+)` \| ([a-z]+)", text, re.M)
    assert rows, "no metrics table found in docs/architecture.md"
    return dict(rows)


def test_datasource_is_the_compose_prometheus_with_the_uid_panels_use() -> None:
    config = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (source,) = config["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in panels()}
    uids |= {t["datasource"]["uid"] for p in panels() for t in p["targets"]}
    assert uids == {source["uid"]}


def test_dashboard_provider_reads_the_mounted_folder() -> None:
    config = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "mesh.yml").read_text())
    (provider,) = config["providers"]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts


def test_dashboard_structure() -> None:
    data = dashboard()
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels():
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, f"panel {panel['title']!r} has no query"
        assert len(refs) == len(set(refs)), panel["title"]
    (variable,) = data["templating"]["list"]
    assert variable["name"] == "agent"
    assert "mesh_node_info" in variable["definition"]
    # Panels must not overlap on the 24-column grid.
    cells: set[tuple[int, int]] = set()
    for p in data["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_dashboard_covers_what_operators_ask() -> None:
    queries = "\n".join(exprs())
    for needle in (
        "mesh_requests_total",
        "mesh_tasks_total",
        "histogram_quantile(0.5, sum by (le, agent) (rate(mesh_task_duration_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, agent) (rate(mesh_task_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le, agent) (rate(mesh_task_duration_seconds_bucket",
        'mesh_delegations_total{agent=~"$agent", outcome!="ok"}',
        "sum by (agent, peer) (rate(mesh_delegation_retries_total",
        "mesh_circuit_breaker_state",
        "mesh_tokens_total",
        'up{job="mesh-nodes"',
    ):
        assert needle in queries, f"no panel queries {needle!r}"
    for expr in exprs():
        assert 'agent=~"$agent"' in expr, f"panel ignores the agent selector: {expr}"


def test_dashboard_names_only_documented_metrics() -> None:
    documented = documented_metrics()
    for expr in exprs():
        for name in re.findall(r"\b(mesh_\w+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in documented, f"{name} is not in docs/architecture.md"
            if base != name:
                assert documented[base] == "histogram", f"{name}: {base} is not a histogram"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_every_panel_query_parses(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"panel:query_{i}", "expr": substitute(e)}
                    for i, e in enumerate(exprs())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs())} rules found" in result.stdout


def test_substitution_leaves_no_variable() -> None:
    for expr in exprs():
        assert "$" not in substitute(expr), expr
