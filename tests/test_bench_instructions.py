"""``python -m tests.bench.instructions`` works end to end with tiny counts: the plain run (CPU
per request) always, the cachegrind count when valgrind is installed. Numbers are not asserted
beyond being positive: they are what the tool is for, not what a test can know."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.instructions import ROWS, parse_args, split_parts
from tests.support import ROOT, clean_env


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.bench.instructions", *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.integration
def test_every_row_serves_in_process_and_gives_cpu_per_request(tmp_path: Path) -> None:
    out = tmp_path / "ir.json"
    tiny = ("--n1", "2", "--n2", "6", "--warmup", "2", "--concurrency", "2")
    proc = _run("--no-valgrind", *tiny, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ir/request" in proc.stdout
    assert "not counted: --no-valgrind" in proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows] == list(ROWS)
    for row in rows:
        assert row["cpu_ms_per_request"] > 0
        assert row["wall_ms_per_request"] > 0
        assert row["ir_per_request"] is None


@pytest.mark.integration
@pytest.mark.skipif(
    shutil.which("valgrind") is None,
    reason="needs valgrind on PATH to count instructions: apt-get install valgrind "
    "(.ci/system-deps installs it)",
)
def test_instructions_per_request_are_counted_by_cachegrind(tmp_path: Path) -> None:
    out = tmp_path / "ir.json"
    tiny = ("--n1", "1", "--n2", "9", "--warmup", "1", "--concurrency", "1")
    proc = _run("--rows", "mesh-node", *tiny, "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    short, long = row["ir"]
    assert 0 < short < long
    assert row["ir_per_request"] == (long - short) // 8 > 0
    assert " M" in proc.stdout.splitlines()[-1]


@pytest.mark.integration
@pytest.mark.skipif(
    shutil.which("valgrind") is None,
    reason="needs valgrind on PATH to count instructions: apt-get install valgrind "
    "(.ci/system-deps installs it)",
)
def test_split_at_send_counts_before_and_after_the_answer(tmp_path: Path) -> None:
    out = tmp_path / "ir.json"
    tiny = ("--n1", "3", "--n2", "5", "--warmup", "1", "--concurrency", "1")
    proc = _run("--rows", "mesh-node", *tiny, "--split-at-send", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ir_before_send"] > row["ir_after_send"] > 0
    assert "before send" in proc.stdout
    assert proc.stdout.splitlines()[-1].count(" M") == 3


def test_the_split_pairs_callgrinds_dumps_by_their_marks() -> None:
    start, sent = "--dump-before=getpgrp", "--dump-before=getppid"
    parts = [(start, 900), (sent, 10), (start, 2), (sent, 20), (start, 4), (sent, 30)]
    parts.append(("Program termination", 700))
    split = split_parts(parts)
    assert (split.requests, split.before, split.after) == (3, 20, 3)
    with pytest.raises(RuntimeError, match="do not alternate"):
        split_parts([(start, 900), (sent, 10), (sent, 10), ("Program termination", 1)])


def test_bad_options_are_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, named in (
        (["--rows", "nope"], "--rows"),
        (["--n1", "10", "--n2", "10"], "--n2"),
        (["--concurrency", "0"], "--concurrency"),
        (["--tree", "/"], "--tree"),
        (["--split-at-send"], "--split-at-send"),
        (["--split-at-send", "--concurrency", "1", "--no-valgrind"], "--split-at-send"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(argv)
        assert exit_info.value.code == 2
        assert named in capsys.readouterr().err


def test_the_counted_process_stretches_the_stores_wall_clock_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under valgrind the node runs ~50x slower: its SQLite thresholds in seconds would count
    hand-offs and lone commits a plain run does not make (71dfd7a, 5bdb875)."""
    from mesh import _sqlite
    from tests.bench.instructions import THRESHOLD_STRETCH, _hold_commits_inline

    for name in ("SLOW_BATCH_S", "DEFER_S", "LOOP_BUDGET_S"):
        monkeypatch.setattr(_sqlite, name, getattr(_sqlite, name))  # restored after the test
    defer, budget = _sqlite.DEFER_S, _sqlite.LOOP_BUDGET_S
    _hold_commits_inline()
    stretched = (_sqlite.SLOW_BATCH_S, _sqlite.DEFER_S, _sqlite.LOOP_BUDGET_S)
    assert stretched == (float("inf"), defer * THRESHOLD_STRETCH, budget * THRESHOLD_STRETCH)
