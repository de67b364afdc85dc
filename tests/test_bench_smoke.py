"""The benchmark script works end to end: a tiny run (1 s phases) of every row, checked for the
shape of its JSON and table. Timings are not asserted: this machine's load is not ours."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench import report
from tests.bench.__main__ import parse_args
from tests.bench.scenarios import (
    A2A,
    ADK,
    ADK_REMOTE,
    FLOOR,
    LLM_SPECIALIST,
    LOCAL_LLM,
    MESH,
    MESH_PG,
    REMOTE_LLM,
    ROWS,
)
from tests.support import ROOT, clean_env

ADK_ROWS = (ADK, ADK_REMOTE)

# Only the run drives wrk; the tests of the report's arithmetic and the options need nothing.
needs_wrk = pytest.mark.skipif(
    shutil.which("wrk") is None,
    reason="needs wrk on PATH: install it (apt-get install wrk; .ci/system-deps installs every "
    "program the tests drive)",
)


def _check_load(load: dict[str, Any], connections: int) -> None:
    assert load["connections"] == connections
    assert load["requests"] > 0
    assert load["errors"] == 0, load.get("first_error")
    assert load["rps"] > 0
    lat = load["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert load["client_cpu_util"] >= 0


@pytest.mark.integration
@needs_wrk
def test_quick_bench_writes_one_table_and_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    # The ADK rows have a run of their own (below): at 64 connections their turn's CPU can
    # outlast a 1 s phase on a loaded machine.
    keys = [r.key for r in ROWS if r.key not in ADK_ROWS]
    argv = ["--quick", "--warmup", "5", "--only", ",".join(keys), "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench", *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rps@16" in proc.stdout
    assert "targets:" in proc.stdout
    result = json.loads(out.read_text())

    assert result["machine"]["cores"] >= 1
    assert result["options"]["levels"] == [16, 64]
    rows = {r["key"]: r for r in result["rows"]}
    assert list(rows) == keys
    # The two baselines need only installed packages: they must always run.
    assert rows[FLOOR]["status"] == "ok"
    assert rows[A2A]["status"] == "ok"
    for row in rows.values():
        assert row["status"] in {"ok", "skipped"}, row
        if row["status"] != "ok":
            continue
        _check_load(row["latency"], 1)
        assert set(row["throughput"]) == {"16", "64"}
        for level, load in row["throughput"].items():
            _check_load(load, int(level))
            assert load["server_cpu_util"] > 0
        assert row["peak_rps"] == max(t["rps"] for t in row["throughput"].values())
        assert row["cpu_ms_per_request"] > 0
        assert row["rss_after_mb"] > 0
        assert row["rss_start_mb"] > 0
        assert 0 < row["spawn_to_healthy_s"] < 60
        assert 0 < row["spawn_cpu_s"] < 60
        for proc_facts in row["processes"]:
            assert proc_facts["cpu_s"] > 0
    assert rows[FLOOR]["ratios"][f"vs_{FLOOR}"]["peak_rps"] == 1.0
    assert rows[A2A]["ratios"][f"vs_{A2A}"]["latency_p50"] == 1.0
    assert len(result["targets"]) == 10
    for target in result["targets"]:
        assert target["met"] in {True, False, None}
        # A target is judged exactly when the rows it needs were measured.
        assert (target["value"] is None) == (target["met"] is None)
    if rows[MESH]["status"] == "ok":
        assert all(t["met"] is not None for t in result["targets"] if "mesh node" in t["name"])
        modules = rows[MESH]["processes"][0]["modules"]["loaded"]
        assert modules["google.genai"] is False
    if rows[MESH_PG]["status"] == "ok":  # the node on a PostgreSQL the bench started
        assert [p["name"] for p in rows[MESH_PG]["processes"]] == ["postgres", "bureau"]
        pg = result["postgres"]
        assert pg["round_trips_per_task"] > 0
        assert pg["node_cpu_ms_per_request"] > 0
        assert pg["database_cpu_ms_per_request"] > 0
        assert result["targets"][-1]["met"] is not None
    assert result["imports"]["mesh"]["google_genai_imported"] is False


@pytest.mark.integration
@needs_wrk
def test_quick_bench_runs_the_adk_rows(tmp_path: Path) -> None:
    """What a user would pick instead (google-adk is a dev dependency): ADK's to_a2a with the
    coordinator's turn, and its hop through AgentTool(RemoteA2aAgent) to a mesh node."""
    out = tmp_path / "bench.json"
    argv = ["--quick", "--warmup", "5", "--levels", "1,4", "--only", ",".join(ADK_ROWS)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench", *argv, "--json", str(out)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["key"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == list(ADK_ROWS)
    for row in rows.values():
        assert row["status"] == "ok", row
        _check_load(row["latency"], 1)  # every answer checked: "a-1001: score ..."
        for level, load in row["throughput"].items():
            _check_load(load, int(level))
    assert [p["name"] for p in rows[ADK_REMOTE]["processes"]] == ["bureau", "adk"]
    hop = json.loads(out.read_text())["delegation"]
    assert hop["adk_hop_ms"] == round(hop["adk_remote_p50_ms"] - hop["adk_local_p50_ms"], 3)
    assert "ADK hop:" in proc.stdout


def _row(key: str, *, p50: float, rps: float, rss: float, spawn: float) -> dict[str, Any]:
    return {
        "key": key,
        "status": "ok",
        "latency": {"latency_ms": {"p50": p50}},
        "peak_rps": rps,
        "cpu_ms_per_request": 1.0,
        "rss_after_mb": rss,
        "spawn_to_healthy_s": spawn,
        "spawn_cpu_s": spawn / 2,
        "rss_growth_bytes_per_task": 0.0,
    }


def test_targets_and_ratios_come_from_the_rows_of_the_run() -> None:
    rows = [
        _row(FLOOR, p50=0.5, rps=8000, rss=50, spawn=0.5),
        _row(A2A, p50=2.0, rps=400, rss=80, spawn=1.0),
        _row(MESH, p50=3.0, rps=600, rss=100, spawn=2.0),
        _row("coord-local", p50=4.0, rps=200, rss=90, spawn=1.0),
        _row("coord-remote", p50=8.0, rps=100, rss=180, spawn=1.0),
        _row("coord-remote-signed", p50=8.25, rps=95, rss=185, spawn=1.0)
        | {"cpu_ms_per_request": 1.5},
        _row(ADK, p50=7.0, rps=100, rss=160, spawn=1.5),
        _row(ADK_REMOTE, p50=17.5, rps=60, rss=230, spawn=1.5),
        _row(LLM_SPECIALIST, p50=5.0, rps=180, rss=90, spawn=1.0),
        _row(LOCAL_LLM, p50=4.5, rps=190, rss=90, spawn=1.0),
        _row(REMOTE_LLM, p50=10.25, rps=90, rss=180, spawn=1.0),
    ]
    report.add_ratios(rows)
    assert rows[2]["ratios"]["vs_a2a-sdk"]["peak_rps"] == 1.5
    assert rows[2]["ratios"]["vs_fastapi"]["latency_p50"] == 6.0
    hop = report.delegation(rows)
    assert hop is not None
    assert hop["hop_ms"] == 4.0
    assert hop["hop_vs_a2a_round_trip"] == 2.0
    # What keys add to the hop, side by side: signed minus unsigned.
    assert hop["signed_extra_p50_ms"] == 0.25
    assert hop["signed_extra_cpu_ms"] == 0.5
    # ADK's hop to the same node, its remote row minus its local one.
    assert hop["adk_hop_ms"] == 10.5
    # The LLM specialist's hop: its remote row minus its local one (5.75 ms) is its own turn
    # (the specialist alone, 5.0 ms) plus 0.75 ms, within the 1.0 ms.
    assert hop["llm_hop_ms"] == 5.75
    assert hop["llm_hop_over_turn_ms"] == 0.75
    # throughput 1.5x (>= 1), hop 2x (> 1.5), RSS 1.25x (> 1.2), growth 0, spawn 2x (> 1.2)
    # in wall time and in CPU, the LLM node 0.5x (< 2), the hop 4.0 ms (> 1.0), the LLM
    # specialist's hop its turn + 0.75 ms (<= + 1.0), no PostgreSQL row
    met = [t["met"] for t in report.targets(rows, hop)]
    assert met == [True, False, False, True, False, False, False, False, True, None]
    judged = {t["name"]: t["value"] for t in report.targets(rows, hop)}
    assert judged["delegation hop (remote - local tool, p50), ms"] == 4.0
    printed = report.render(
        {"rows": [], "options": {"levels": []}, "delegation": hop, "targets": []}
    )
    assert (
        "LLM specialist hop: 5.75 ms (coord-remote-llm 10.25 - coord-local-llm 4.50) = its own "
        "turn 5.00 (llm-specialist alone) + 0.75 ms (target: + at most 1.0)" in printed
    )
    # Without the specialist alone, the hop is reported but the bound is not judged.
    alone = [r for r in rows if r["key"] != LLM_SPECIALIST]
    partial = report.delegation(alone)
    assert partial is not None
    assert partial["llm_hop_ms"] == 5.75
    assert "llm_hop_over_turn_ms" not in partial
    assert report.targets(alone, partial)[-2]["met"] is None
    assert rows[2]["ratios"]["vs_a2a-sdk"]["spawn_cpu_s"] == 2.0
    # The node on PostgreSQL: throughput against a2a-sdk's, CPU of node and database apart,
    # statements per task over every task the node ran (warm-up, latency, levels, soak).
    pg = _row(MESH_PG, p50=4.0, rps=500, rss=200, spawn=2.0) | {
        "latency": {"latency_ms": {"p50": 4.0}, "requests": 100},
        "throughput": {"16": {"requests": 300}, "64": {"requests": 600}},
        "soak_requests": 900,
        "processes": [
            {"name": "postgres", "cpu_s": 0.5},
            {"name": "bureau", "cpu_s": 2.0, "modules": {"db_calls": {"[pg round trips]": 24000}}},
        ],
    }
    rows.append(pg)
    assert report.postgres(rows, warmup=100) == {
        "peak_rps": 500,
        "vs_a2a_peak_rps": 1.25,
        "node_cpu_ms_per_request": 2.0,
        "database_cpu_ms_per_request": 0.5,
        "round_trips_per_task": 12.0,
    }
    assert report.targets(rows, hop)[-1]["met"] is True


def test_bad_options_are_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--only", "nope"])
    assert "--only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--levels", "x"])
    assert "--levels" in capsys.readouterr().err
