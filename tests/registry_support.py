"""Start a real registry and real echo nodes (``tests.echo_node``) for discovery tests."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support import Proc, clean_env, free_port, running, wait_until_ok


@dataclass
class Service:
    proc: Proc
    url: str
    port: int


@contextlib.contextmanager
def registry(
    tmp: Path,
    *,
    data_dir: Path | None = None,
    port: int | None = None,
    token: str | None = None,
    probe_interval: float = 0.5,
    ttl: float = 10.0,
    remove_after: float = 300.0,
    name: str = "registry",
    extra: Sequence[str] = (),
) -> Iterator[Service]:
    port = port or free_port()
    argv = [
        "mesh", "registry", "--port", str(port),
        "--data-dir", str(data_dir or tmp / "registry"),
        "--probe-interval", str(probe_interval), "--probe-timeout", "0.4",
        "--ttl", str(ttl), "--remove-after", str(remove_after),
        *extra,
    ]  # fmt: skip
    env = clean_env(**({"MESH_REGISTRY_TOKEN": token} if token else {}))
    url = f"http://127.0.0.1:{port}"
    with running(argv, name=name, tmp=tmp, health=f"{url}/health", env=env) as proc:
        yield Service(proc, url, port)


def start_node(
    tmp: Path,
    registry_url: str | None,
    *,
    name: str = "echo",
    port: int | None = None,
    instance_id: str | None = None,
    token: str | None = None,
    extra: Sequence[str] = (),
    log: str | None = None,
) -> Service:
    """Start an echo node (not waiting for it); the caller stops it."""
    port = port or free_port()
    argv = [sys.executable, "-m", "tests.echo_node", "--name", name, "--port", str(port)]
    if registry_url:
        argv += ["--registry", registry_url]
    if instance_id:
        argv += ["--instance-id", instance_id]
    env = clean_env(**({"MESH_REGISTRY_TOKEN": token} if token else {}))
    proc = Proc.start([*argv, *extra], name=log or f"{name}-{port}", tmp=tmp, env=env)
    return Service(proc, f"http://127.0.0.1:{port}", port)


def instances(registry_url: str, **params: str) -> list[dict[str, Any]]:
    """GET /v1/instances (default: passing only)."""
    r = httpx.get(f"{registry_url}/v1/instances", params=params, timeout=5)
    r.raise_for_status()
    found: list[dict[str, Any]] = r.json()["instances"]
    return found


def start_bureau(tmp: Path, registry_url: str, *, port: int | None = None) -> Service:
    """Start the real node ``mesh serve agents.credit_bureau:agent`` registering with the registry."""
    port = port or free_port()
    argv = [
        "mesh", "serve", "agents.credit_bureau:agent", "--port", str(port),
        "--data-dir", str(tmp / f"bureau-{port}"), "--registry", registry_url,
    ]  # fmt: skip
    proc = Proc.start(argv, name=f"bureau-{port}", tmp=tmp, env=clean_env())
    return Service(proc, f"http://127.0.0.1:{port}", port)


def flood_node(
    tmp: Path,
    *,
    delay_s: float = 0.0,
    distinct: bool = False,
    card_delay_s: float = 0.0,
    name: str = "junk",
) -> Service:
    """Start ``tests.flood_node`` (instances of ``name`` at ``/i/<n>``, whose ``/health`` names
    no instance id; none registered) and wait for it."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.flood_node", "--port", str(port), "--name", name,
            "--health-delay", str(delay_s), "--card-delay", str(card_delay_s)]  # fmt: skip
    if distinct:
        argv.append("--distinct-names")
    proc = Proc.start(argv, name=f"flood-{port}", tmp=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ok(f"{url}/ready", proc=proc)
    except BaseException:
        proc.kill()
        raise
    return Service(proc, url, port)
