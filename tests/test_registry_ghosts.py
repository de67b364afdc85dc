"""Ghosts: one instance per (agent, URL) at any moment, through a node restart (same port, new
instance id) and through a registry restart (``registry.db`` keeps the old row). Real registry
processes and real ``mesh serve`` nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from tests.registry_support import Service, instances, registry, start_bureau, start_node
from tests.support import Proc, clean_env, free_port, wait_for, wait_until_ok

pytestmark = pytest.mark.integration


def _counts(reg: str) -> tuple[int, int]:
    """(passing, total) of credit-bureau, as `mesh ls` shows them."""
    agents = httpx.get(f"{reg}/v1/agents", timeout=5).json()["agents"]
    for a in agents:
        if a["name"] == "credit-bureau":
            return a["instances"]["passing"], a["instances"]["total"]
    return 0, 0


def _unregistered_bureau(tmp: Path, port: int) -> Service:
    """``mesh serve`` of the bureau at ``port`` that registers nowhere (a process the registry
    can only meet through its probes)."""
    argv = [
        "mesh", "serve", "agents.credit_bureau:agent", "--port", str(port),
        "--data-dir", str(tmp / f"bureau-{port}"), "--no-register",
    ]  # fmt: skip
    proc = Proc.start(argv, name=f"bureau-{port}-unregistered", tmp=tmp, env=clean_env())
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", proc=proc)
    return Service(proc, url, port)


def test_a_node_restarted_on_its_port_leaves_no_ghost(tmp_path: Path) -> None:
    port = free_port()
    with registry(tmp_path) as reg:
        first = start_bureau(tmp_path, reg.url, port=port)
        with first.proc:
            (old,) = wait_for(lambda: instances(reg.url), what="first bureau registered")
            first.proc.kill()
        second = start_bureau(tmp_path, reg.url, port=port)
        with second.proc:
            seen: list[tuple[int, int]] = []

            def settled() -> bool:
                seen.append(_counts(reg.url))
                up = instances(reg.url)
                return bool(up) and up[0]["instance_id"] != old["instance_id"]

            wait_for(settled, what="the restarted bureau registered")
            # One process at a time, and never two records for it.
            assert max(total for _, total in seen) == 1, seen
            assert _counts(reg.url) == (1, 1)
            assert [i["instance_id"] for i in instances(reg.url, status="any")] != [
                old["instance_id"]
            ]
            # Whichever comes first removes the old record: the new process's registration
            # (same agent and URL: superseded) or the prober (the URL answers as the new
            # instance: a ghost). Under load the prober can be first; both say which record.
            lines = [x for x in reg.proc.output().splitlines() if old["instance_id"] in x]
            assert any(
                "superseded by" in x or "a ghost, that URL answers as instance" in x for x in lines
            ), lines


def test_a_ghost_kept_in_registry_db_is_gone_before_the_registry_serves(tmp_path: Path) -> None:
    data, reg_port, port = tmp_path / "reg-data", free_port(), free_port()
    with registry(tmp_path, data_dir=data, port=reg_port) as reg:
        first = start_bureau(tmp_path, reg.url, port=port)
        with first.proc:
            (old,) = wait_for(lambda: instances(reg.url), what="bureau registered")
            reg.proc.terminate()
            first.proc.kill()
    # While the registry is down, another bureau process takes the port and registers nowhere:
    # only the probe can tell the stored row is a ghost.
    second = _unregistered_bureau(tmp_path, port)
    with (
        second.proc,
        registry(tmp_path, data_dir=data, port=reg_port, name="registry-2") as again,
    ):
        # The first answer already leaves the ghost out: no moment of "1/1 up".
        assert instances(again.url, status="any") == []
        assert _counts(again.url) == (0, 0)
        (line,) = [x for x in again.proc.output().splitlines() if old["instance_id"] in x]
        assert "a ghost" in line


def test_a_url_answering_as_another_instance_is_removed_at_once(tmp_path: Path) -> None:
    port = free_port()
    with registry(tmp_path, probe_interval=0.5) as reg:
        echo = start_node(tmp_path, reg.url, name="echo", port=port, instance_id="echo-1")
        with echo.proc:
            wait_for(lambda: instances(reg.url), what="echo registered")
            echo.proc.kill()
        # Another process at the same URL, answering 200 under another instance id.
        argv = [sys.executable, "-m", "tests.hostile_node", "--name", "echo", "--port",
                str(port), "--health", "as:someone-else"]  # fmt: skip
        with Proc.start(argv, name="impostor", tmp=tmp_path) as other:
            wait_until_ok(f"http://127.0.0.1:{port}/health", proc=other)
            wait_for(lambda: instances(reg.url, status="any") == [], timeout=3, what="removed")
            assert "someone-else" in reg.proc.output()
