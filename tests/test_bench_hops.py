"""``python -m tests.bench.hops`` runs end to end (one round of 1 s bursts) and takes the hops
per round as docs/performance.md "The rows" defines them. Timings are not asserted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.hops import KEYS, cpu_per_request, hops, parse_args
from tests.support import ROOT, clean_env


def test_the_hops_of_one_round() -> None:
    p50 = {
        "fastapi": 0.25,
        "fastapi-relay": 0.75,
        "mesh-node": 1.0,
        "coord-local": 1.75,
        "coord-remote": 3.25,
        "llm-specialist": 1.75,
        "coord-local-llm": 1.5,
        "coord-remote-llm": 4.0,
    }
    assert hops(p50) == {"floor_hop_ms": 0.5, "typed_hop_ms": 1.5, "llm_hop_over_turn_ms": 0.75}


def test_cpu_per_request_of_each_server_over_a_burst() -> None:
    before = {"bureau": 10.0, "coordinator": 20.0}
    after = {"bureau": 10.5, "coordinator": 21.25}
    assert cpu_per_request(before, after, 250) == {"bureau": 2.0, "coordinator": 5.0}
    # A burst that got no answer divides by one, not by zero.
    assert cpu_per_request(before, before, 0) == {"bureau": 0.0, "coordinator": 0.0}


def test_bad_options_are_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("--rounds", "--seconds", "--warmup"):
        with pytest.raises(SystemExit):
            parse_args([name, "0"])
        assert name in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk on PATH: apt-get install wrk")
def test_one_round_of_every_hop_row(tmp_path: Path) -> None:
    out = tmp_path / "hops.json"
    argv = ["--rounds", "1", "--seconds", "1", "--warmup", "5", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.hops", *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = json.loads(out.read_text())["rounds"]
    assert set(found["p50_ms"]) == set(KEYS)
    assert all(v > 0 for v in found["p50_ms"].values())
    assert {k: found[k] for k in hops(found["p50_ms"])} == hops(found["p50_ms"])
    # One round: each row's lowest p50 is that round's.
    assert json.loads(out.read_text())["from_lowest"]["p50_ms"] == found["p50_ms"]
    assert "LLM hop over its turn (remote-llm - local-llm - specialist): from each" in proc.stdout
    assert "floor hop (fastapi-relay - fastapi): from each" in proc.stdout
    # Every server of every row, with the CPU it spent per request in the burst.
    cpu = json.loads(out.read_text())["cpu_ms_per_request"]
    assert set(cpu) == set(KEYS)
    assert set(cpu["coord-remote"]) == {"bureau", "coordinator"}
    assert all(ms >= 0 for row in cpu.values() for ms in row.values())
    assert cpu["coord-remote"]["coordinator"] > 0
    assert cpu["coord-remote"]["bureau"] > 0
    assert found["cpu_ms_per_request"] == cpu
    assert "CPU ms per request, median over rounds: fastapi (" in proc.stdout
