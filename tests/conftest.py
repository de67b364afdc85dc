"""Suite-wide guards: no test reaches a real model provider, a real registry or Consul, or runs
with the developer's mesh settings, by accident. And the fixtures many test files share."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Iterator

import httpx
import pytest

# The PostgreSQL server fixtures (tests marked `postgres`), for every module that asks.
from tests.postgres_support import either_database, pg_database, postgres_server  # noqa: F401
from tests.support import ISOLATED_PREFIXES


def _isolated(names: Iterable[str]) -> list[str]:
    # A prefix rule, not a list: every new MESH_* setting is covered the day it is added.
    return [name for name in names if name.startswith(ISOLATED_PREFIXES)]


@pytest.fixture(scope="session", autouse=True)
def _outside_env() -> Iterator[dict[str, str]]:
    """The developer's MESH_*, CONSUL_*, GOOGLE_* and GEMINI_* variables, taken out of the
    environment for the whole session: module- and session-scoped fixtures start before any
    function-scoped one, so clearing per test alone would leave them the developer's settings.
    (Modules read at collection, before this runs: test_gemini's key, test_browser's
    MESH_CHROMIUM.)"""
    taken = {name: os.environ.pop(name) for name in _isolated(os.environ)}
    yield taken
    os.environ.update(taken)


@pytest.fixture(autouse=True)
def _isolated_env(
    _outside_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # Tests marked `gemini` or `consul` talk to the real service on purpose: they get the
    # variables that say where it is (and its key) back.
    if request.node.get_closest_marker("gemini") or request.node.get_closest_marker("consul"):
        for name, value in _outside_env.items():
            monkeypatch.setenv(name, value)
        return
    # Whatever an earlier test or an imported module put there since.
    for name in _isolated(os.environ):
        monkeypatch.delenv(name)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """A plain async client for a test's calls to the nodes it started (loopback: no proxy
    from the environment; 60 s bounds a call that hangs)."""
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:
        yield client
