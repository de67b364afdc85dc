"""A skip reason says what to install or set to run the test, not what the author's machine
lacked; and a test skips only for what it needs itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import test_consul_backend, test_consul_store
from tests.support import BIN, ROOT, clean_env
from tests.test_browser import find_chromium


@pytest.mark.parametrize("module", [test_consul_backend, test_consul_store])
def test_consul_skip_reason_says_what_to_set(module: object) -> None:
    reason = module.needs_consul.kwargs["reason"]  # type: ignore[attr-defined]
    assert "CONSUL_HTTP_ADDR=127.0.0.1:8500" in reason
    assert "consul agent -dev" in reason
    assert "here" not in reason


def test_chromium_is_found_on_path_or_named_by_mesh_chromium(tmp_path: Path) -> None:
    (tmp_path / "chromium-browser").write_text("#!/bin/sh\n")
    (tmp_path / "chromium-browser").chmod(0o755)
    assert find_chromium(None, path=str(tmp_path)) == str(tmp_path / "chromium-browser")
    named = tmp_path / "my-chrome"
    named.write_text("#!/bin/sh\n")
    named.chmod(0o755)
    assert find_chromium(str(named), path="") == str(named)


def test_no_chromium_skips_saying_what_to_install_or_set(tmp_path: Path) -> None:
    with pytest.raises(pytest.skip.Exception) as missing:
        find_chromium(None, path=str(tmp_path))
    assert "apt-get install chromium" in str(missing.value)
    assert "MESH_CHROMIUM=/path/to/chromium" in str(missing.value)
    with pytest.raises(pytest.skip.Exception, match="MESH_CHROMIUM='/no/such/chromium'"):
        find_chromium("/no/such/chromium", path=str(tmp_path))


@pytest.mark.integration
def test_without_wrk_only_the_bench_run_is_skipped() -> None:
    # PATH is the venv's bin alone: no wrk there.
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*argv, "tests/test_bench_smoke.py"],
        cwd=ROOT,
        env=clean_env(PATH=str(BIN)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The bench runs (the main quick run and the ADK rows') skip, saying why; the checks of the
    # report's arithmetic, which need no wrk, still run.
    assert "2 passed, 2 skipped" in result.stdout, result.stdout
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 2, result.stdout
    assert all("needs wrk on PATH: install it (apt-get install wrk" in s for s in skips), skips
