"""The operator console on the loan desk (real registry, officer, two bureaus, verifier): the
topology and per-agent live views in JSON and in real headless Chromium, an agent never called,
an instance that stops answering, and the registry's own /introspect."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry.catalog import AgentView
from registry.page import _templates
from registry.store import AgentRecord, InstanceRecord
from registry.topology import BOX_H, BOX_W, MAX_UNREGISTERED, Topology, layout
from registry.traffic import Traffic
from tests.registry_support import registry, start_node
from tests.support import ROOT, Proc, clean_env, free_port, wait_for, wait_until_ok
from tests.test_browser import ARTIFACTS, HOSTILE, page  # noqa: F401 - page is the Chromium fixture
from tests.test_delegation_e2e import QUESTION, Desk, ask, loan_desk

pytestmark = pytest.mark.integration

N = 3
SHOTS = ROOT / "docs" / "console"
# The offline model counts words as tokens under the name "scripted".
PRICES = "scripted=0.30/2.50"


def topology(reg: str) -> dict[str, Any]:
    r = httpx.get(f"{reg}/v1/topology", timeout=10)
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def edge(topo: dict[str, Any], caller: str, callee: str) -> list[dict[str, Any]]:
    return [e for e in topo["edges"] if (e["caller"], e["callee"]) == (caller, callee)]


def agent(topo: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in topo["agents"] if a["name"] == name)


def shot(browser_page: Any, name: str) -> None:
    """A full-page screenshot in the test artifacts (every run); copied to docs/console, which
    docs/console.md shows, only when asked (``UPDATE_SCREENSHOTS=1``): a test run must not leave
    the checkout modified (a PNG is never byte-identical twice)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    browser_page.screenshot(path=str(path), full_page=True)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        shutil.copyfile(path, SHOTS / name)


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Desk, str]]:
    """The loan desk after ``N`` questions, with an archivist agent nobody calls."""
    tmp = tmp_path_factory.mktemp("console")
    with loan_desk(tmp, officer_env={"MESH_MODEL_PRICES": PRICES}) as d:
        idle = start_node(tmp, d.registry, name="archivist", extra=["--skill", "file"])
        with idle.proc:
            wait_until_ok(f"{idle.url}/health", proc=idle.proc)
            for _ in range(N):
                result = asyncio.run(ask(d.officer, QUESTION))
                assert result.state == "completed", result.text
            yield d, idle.url


def test_the_topology_counts_the_loan_desks_calls(desk: tuple[Desk, str]) -> None:
    d, _ = desk

    def settled() -> dict[str, Any]:
        topo = topology(d.registry)
        bureau = edge(topo, "loan-officer", "credit-bureau")
        assert [(e["skill"], e["calls_total"]) for e in bureau] == [("score", N)]
        verifier = edge(topo, "loan-officer", "income-verifier")
        assert sum(e["calls_total"] for e in verifier) == N, verifier
        # Each node's own task count comes from its own /metrics, gathered apart from the
        # officer's edges: it may trail them by a gathering.
        assert agent(topo, "loan-officer")["tasks"]["calls_total"] == N
        assert agent(topo, "credit-bureau")["tasks"]["calls_total"] == N
        # The archivist's node is up when start_node returns; its registration follows.
        assert "archivist" in [a["name"] for a in topo["agents"]], "archivist not registered"
        return topo

    topo = wait_for(settled, what="the officer's calls in the topology", timeout=20)
    bureau = edge(topo, "loan-officer", "credit-bureau")[0]
    assert bureau["used"]
    assert bureau["errors_total"] == 0
    assert bureau["error_rate"] == 0
    assert bureau["per_min"] > 0
    assert 0 < bureau["p50_s"] <= bureau["p95_s"]
    # Two bureau replicas, one agent: their tasks are summed.
    officer = agent(topo, "loan-officer")
    assert officer["tasks"]["calls_total"] == N
    assert agent(topo, "credit-bureau")["tasks"]["calls_total"] == N
    assert agent(topo, "credit-bureau")["instances_total"] == 2
    # Tokens from the officer's (offline) model, and the cost of its configured price.
    (tokens,) = officer["tokens"]
    assert tokens["model"] == "scripted"
    assert tokens["input_total"] > 0
    expected = (tokens["input_total"] * 0.30 + tokens["output_total"] * 2.50) / 1e6
    assert officer["cost_total"] == pytest.approx(expected, rel=1e-3)
    assert agent(topo, "credit-bureau")["cost_total"] is None  # no model, no price: no cost
    assert {b["peer"] for b in officer["breakers"]} == {"credit-bureau", "income-verifier"}
    # The underwriter is declared (consulted above 500,000 only): a peer, but these questions
    # are below the threshold, so no call and no edge.
    assert officer["peers"] == ["credit-bureau", "income-verifier", "underwriter"]
    assert not edge(topo, "loan-officer", "underwriter")
    # Never called, still there, with no edge.
    archivist = agent(topo, "archivist")
    assert archivist["registered"]
    assert archivist["tasks"]["calls_total"] == 0
    assert not [e for e in topo["edges"] if "archivist" in (e["caller"], e["callee"])]
    for inst in officer["instances"]:
        assert inst["stats"]
        assert inst["pid"] > 0
        assert inst["uptime_s"] > 0
        assert inst["restarts"] == 0


@pytest.mark.browser
def test_the_console_pages_in_chromium(desk: tuple[Desk, str], page: Any) -> None:  # noqa: F811
    d, _ = desk
    wait_for(
        lambda: edge(topology(d.registry), "loan-officer", "credit-bureau")[0]["calls_total"] == N,
        what="the calls gathered",
        timeout=20,
    )
    page.goto(d.registry + "/topology")
    arrow = page.locator("svg g.edge[data-from='loan-officer'][data-to='credit-bureau']")
    assert arrow.count() == 1
    assert arrow.locator("text[data-skill='score']").get_attribute("data-calls") == str(N)
    assert f"score: {N} calls" in arrow.text_content()
    verifier = page.locator("svg g.edge[data-from='loan-officer'][data-to='income-verifier']")
    calls = verifier.locator("text").evaluate_all("els => els.map(e => +e.dataset.calls)")
    assert sum(calls) == N
    # Every registered agent is a box, the one never called too, without an arrow.
    for name in ("loan-officer", "credit-bureau", "income-verifier", "archivist"):
        assert page.locator(f"svg g.agent[data-agent='{name}']").count() == 1
    assert (
        page.locator("svg g.edge[data-to='archivist'], svg g.edge[data-from='archivist']").count()
        == 0
    )
    assert page.locator(
        "#edges tr[data-edge='loan-officer>credit-bureau:score'] td[data-calls]"
    ).inner_text() == str(N)
    shot(page, "topology.png")

    page.click("svg g.agent[data-agent='loan-officer']")
    page.wait_for_url("**/agents/loan-officer")
    assert page.locator("#live [data-stat='calls'] b").inner_text() == str(N)
    assert page.locator("#live [data-stat='cost']").count() == 1
    assert page.locator("#tokens tr[data-model='scripted']").count() == 1
    out = page.locator("#calls-out tr[data-edge='loan-officer>credit-bureau:score']")
    assert out.locator("td[data-calls]").inner_text() == str(N)
    assert page.locator("#instances td[data-restarts]").first.inner_text() == "0"
    shot(page, "agent.png")

    page.goto(d.registry + "/agents/credit-bureau")
    calls_in = page.locator("#calls-in tr[data-edge='loan-officer>credit-bureau:score']")
    assert calls_in.locator("td[data-calls]").inner_text() == str(N)
    assert page.locator("#live [data-stat='cost']").count() == 0


@pytest.mark.browser
def test_an_instance_that_stops_answering_is_shown_down(
    desk: tuple[Desk, str],
    page: Any,  # noqa: F811
) -> None:
    d, _ = desk
    page.goto(d.registry + "/topology")
    page.wait_for_selector("svg g.agent.passing[data-agent='income-verifier']")
    proc = next(p for p in d.procs if p.name == "income-verifier")
    proc.kill()
    # The open page refreshes itself: the box turns critical, the rest still drawn.
    page.wait_for_selector("svg g.agent.critical[data-agent='income-verifier']", timeout=15_000)
    assert page.locator("svg g.agent[data-agent='credit-bureau']").count() == 1
    shot(page, "topology-down.png")
    verifier = agent(topology(d.registry), "income-verifier")
    assert verifier["instances_up"] == 0
    assert verifier["instances_total"] == 1
    assert verifier["tasks"]["calls_total"] == 0  # a down instance's last word counts for nothing
    page.goto(d.registry + "/agents/income-verifier")
    assert page.locator("#instances .badge.critical").count() == 1


def test_the_registrys_introspect_says_what_it_is_and_no_secret(tmp_path: Path) -> None:
    token = "s3cr3t-registry-token-0123456789"
    with registry(tmp_path, token=token, probe_interval=0.3) as reg:
        port = free_port()
        argv = [
            "mesh", "serve", "agents.credit_bureau:agent", "--port", str(port),
            "--data-dir", str(tmp_path / "bureau"), "--registry", reg.url,
        ]  # fmt: skip
        env = clean_env(MESH_REGISTRY_TOKEN=token)
        with Proc.start(argv, name="bureau", tmp=tmp_path, env=env) as proc:
            wait_until_ok(f"http://127.0.0.1:{port}/health", proc=proc)

            def gathered() -> dict[str, Any]:
                r = httpx.get(f"{reg.url}/introspect", timeout=10)
                assert r.status_code == 200, r.text
                doc: dict[str, Any] = r.json()
                assert doc["instances"]["passing"] == 1
                assert doc["gathering"]["instances_with_stats"] == 1
                assert doc["prober"]["last_round"]["rounds"] >= 2
                return doc

            doc = wait_for(gathered, what="the node's stats gathered", timeout=20)
            raw = httpx.get(f"{reg.url}/introspect", timeout=10).text
    assert token not in raw
    assert doc["registry"]["pid"] > 0
    assert doc["agents"] == 1
    assert doc["store"] == {"kind": "sqlite", "path": str(tmp_path / "registry" / "registry.db")}
    assert doc["settings"]["writes"] == "need the token"
    assert doc["prober"]["path"] == "/health?stats=1"
    assert doc["gathering"]["unreadable_stats"] == 0


def test_the_registry_logs_in_the_nodes_line_format(tmp_path: Path) -> None:
    line = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: "
    with registry(tmp_path) as reg:
        node = start_node(tmp_path, reg.url, name="echo")
        with node.proc:
            wait_until_ok(f"{node.url}/health", proc=node.proc)
            wait_for(lambda: reg.proc.output().count("\n") >= 3, what="a few log lines")
        node.proc.kill()
    lines = [ln for ln in reg.proc.output().splitlines() if ln.strip()]
    assert lines
    assert all(re.match(line, ln) for ln in lines), json.dumps(lines, indent=1)


def _view(name: str, instance_id: str) -> AgentView:
    agent_record = AgentRecord(name, "", "1", {})
    return AgentView(agent_record, (InstanceRecord(instance_id, name, f"http://{name}", "1"),))


def test_what_a_node_says_cannot_flood_or_break_the_topology() -> None:
    # A node's stats are its own words: made-up peers and callees are bounded, junk is dropped.
    traffic = Traffic()
    row = {"calls_total": 1, "calls": 1, "buckets": [1]}
    made_up = {
        "v": 1,
        "window_s": 60,
        "le": [],
        "edges": [{"peer": f"ghost-{i}", "skill": "s", **row} for i in range(60)],
        "peers": [f"declared-{i}" for i in range(200)],
    }
    liar, junk = _view("liar", "liar-1"), _view("junk", "junk-1")
    traffic.observe(liar.instances[0], {"pid": 1, "stats": made_up})
    traffic.observe(junk.instances[0], {"pid": 2, "stats": {"v": 1, "edges": "lots"}})
    topo = Topology.build([liar, junk], traffic)
    unregistered = [a for a in topo.agents.values() if not a.registered]
    assert len(unregistered) == MAX_UNREGISTERED
    assert topo.hidden_edges == 60 - MAX_UNREGISTERED
    assert not [e for e in topo.edges if e.callee.startswith("declared-")]
    assert topo.agents["junk"].instances[0].stats is False
    assert traffic.state()["unreadable_stats"] == 1


def test_names_in_a_nodes_stats_are_text_on_the_page() -> None:
    traffic = Traffic()
    row = {"calls_total": 2, "calls": 2, "buckets": [2]}
    stats = {
        "v": 1,
        "window_s": 60,
        "le": [],
        "edges": [{"peer": HOSTILE, "skill": HOSTILE, **row}],
    }
    view = _view("evil", "evil-1")
    traffic.observe(view.instances[0], {"stats": stats})
    topo = Topology.build([view], traffic)
    context = {"title": "t", "q": "", "topology": topo, "graph": layout(topo), "box_w": BOX_W,
               "box_h": BOX_H, "window_s": 60.0}  # fmt: skip
    html = _templates.env.get_template("topology.html").render(context)
    assert "<img" not in html
    assert "<script>window" not in html
    assert "&lt;img src=x onerror=" in html


def test_another_process_at_an_instances_url_is_a_restart() -> None:
    traffic = Traffic()
    first = InstanceRecord("bureau-1", "bureau", "http://127.0.0.1:9", "1")
    traffic.observe(first, {"pid": 10})
    traffic.observe(first, {"pid": 10})
    assert traffic.get("bureau-1").restarts == 0  # type: ignore[union-attr]
    traffic.observe(first, {"pid": 11})  # same id, another process: a supervisor restarted it
    again = first.replace(instance_id="bureau-2")  # a new id at the same URL: the node's restart
    traffic.observe(again, {"pid": 12})
    assert traffic.get("bureau-2").restarts == 2  # type: ignore[union-attr]
    traffic.keep([])  # the store removed it: forgotten, URL and all
    assert traffic.get("bureau-2") is None
    traffic.observe(again, {"pid": 13})
    assert traffic.get("bureau-2").restarts == 0  # type: ignore[union-attr]
