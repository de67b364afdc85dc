"""``python -m tests.bench.idle_gap`` runs end to end (one round of 1 s bursts on the FastAPI
floor) and its wrk script waits the gap it is given. Timings are not asserted."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.idle_gap import gap_script, parse_args
from tests.bench.load import LUA
from tests.support import ROOT, clean_env


def test_the_gap_script_loads_the_bench_script_and_waits(tmp_path: Path) -> None:
    text = gap_script(tmp_path, 3).read_text()
    assert f'dofile("{LUA}")' in text
    assert "function delay()\n  return 3\nend" in text


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--gaps", "1,x"], "--gaps"),
        (["--gaps", "-1"], "--gaps"),
        (["--rounds", "0"], "--rounds"),
        (["--rows", "nope"], "--rows"),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert named in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk on PATH: apt-get install wrk")
def test_one_round_on_the_floor_row() -> None:
    argv = ["--rows", "fastapi", "--gaps", "0,2", "--rounds", "1", "--seconds", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.idle_gap", *argv, "--warmup", "5"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("fastapi")]
    assert [r[1] for r in rows] == ["0", "2"]
    # Each gap's burst ran and every answer was checked (a bad one stops the run).
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
    assert rows[0][4:] == ["1.00", "1.00"]
    # wrk waited between requests: the 2 ms gap's burst sent fewer requests in its second (at
    # most 500) than the back-to-back one.
    sent = {
        int(m.group(1)): int(m.group(2))
        for m in re.finditer(r"gap (\d+) ms: .* \((\d+) requests\)", proc.stderr)
    }
    assert set(sent) == {0, 2}
    assert sent[2] <= 500 < sent[0] or sent[2] < sent[0] / 2, sent
