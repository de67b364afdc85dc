"""``python -m tests.bench.remote_call`` works end to end with tiny counts: CPU per call always,
the cachegrind count when valgrind is installed. Numbers are not asserted beyond their shape."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT, clean_env

pytestmark = pytest.mark.integration


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.bench.remote_call", *argv],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_calls_a_real_peer_and_gives_cpu_per_call() -> None:
    proc = _run("--no-valgrind", "--n1", "1", "--n2", "4", "--warmup", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "instructions per call -  CPU ms per call" in proc.stdout


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind on PATH")
def test_instructions_per_call_are_counted_by_cachegrind() -> None:
    proc = _run("--n1", "1", "--n2", "3", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " k  CPU ms per call" in proc.stdout


def test_bad_counts_are_refused() -> None:
    proc = _run("--n1", "5", "--n2", "5")
    assert proc.returncode == 2
    assert "--n2" in proc.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind on PATH")
def test_split_gives_each_stretch_of_a_call() -> None:
    proc = _run("--split", "2", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stretch in ("before the write", "write -> answer arrived", "after", "the bench's own"):
        assert stretch in proc.stdout
