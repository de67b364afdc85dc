"""tests/conftest.py keeps the developer's settings out of the tests: a pytest run started in a
dirty environment (MESH_TOKEN, MESH_FASTPATH, CONSUL_HTTP_ADDR, a model key, ...) shows none of
them to a test or a module fixture, except to a test marked consul or gemini, which talks to
the real service on purpose."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, clean_env

pytestmark = pytest.mark.integration

DIRTY = {
    "MESH_TOKEN": "developer-token",
    "MESH_FASTPATH": "0",
    "MESH_LOG_LEVEL": "debug",
    "MESH_PEER_NETWORKS": "0.0.0.0/0",
    "MESH_SOMETHING_ADDED_NEXT_YEAR": "1",
    "CONSUL_HTTP_ADDR": "127.0.0.1:1",
    "GOOGLE_API_KEY": "not-a-key",
}

CHILD_TESTS = """
import os

import pytest

PREFIXES = ("MESH_", "CONSUL_", "GOOGLE_", "GEMINI_")


def leaked():
    return sorted(name for name in os.environ if name.startswith(PREFIXES))


@pytest.fixture(scope="module")
def seen_by_a_module_fixture():
    return leaked()


def test_a_test_and_its_module_fixture_see_none(seen_by_a_module_fixture):
    assert seen_by_a_module_fixture == []
    assert leaked() == []


@pytest.mark.consul
def test_a_test_marked_consul_finds_its_agent():
    assert os.environ["CONSUL_HTTP_ADDR"] == "127.0.0.1:1"


@pytest.mark.gemini
def test_a_test_marked_gemini_finds_its_key():
    assert os.environ["GOOGLE_API_KEY"] == "not-a-key"


def test_a_later_test_sees_none_again():
    assert leaked() == []
"""

CHILD_INI = """[pytest]
markers =
    consul: a real Consul agent
    gemini: the real Gemini API
filterwarnings = error
asyncio_default_fixture_loop_scope = function
"""


def test_a_dirty_environment_reaches_only_the_marked_tests(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(CHILD_INI)
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*argv, "-q", "test_child.py"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(ROOT), **DIRTY),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout, result.stdout
