"""A small mesh file (registry + one credit bureau) and a ``mesh`` runner, for ``mesh up`` tests.

meshfile, ports = small_mesh(tmp_path)
with mesh_up(meshfile, tmp_path) as up:        # waits for the table, stops it at the end
    result = mesh("ps", "--meshfile", str(meshfile))
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support import ROOT, Proc, clean_env, free_port, wait_for

READY = "Ctrl-C stops everything"


def small_mesh(
    tmp: Path, *, state: str = "state", name: str = "mesh.toml"
) -> tuple[Path, dict[str, int]]:
    """A mesh file with its state dir in ``tmp / state``; ``ports``: registry and bureau."""
    ports = {"registry": free_port(), "bureau": free_port()}
    path = tmp / name
    path.write_text(
        f"""
state_dir = "{tmp / state}"
[registry]
port = {ports["registry"]}
[nodes.credit-bureau]
module = "agents.credit_bureau:agent"
port = {ports["bureau"]}
"""
    )
    return path, ports


def mesh(
    *args: str, timeout: float = 60.0, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one ``mesh`` command to completion, from the repository root (or ``cwd``)."""
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args],
        capture_output=True, text=True, timeout=timeout, env=env or clean_env(), cwd=cwd,
    )  # fmt: skip


@contextlib.contextmanager
def mesh_up(
    meshfile: Path | None,
    tmp: Path,
    *,
    name: str = "up",
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
) -> Iterator[Proc]:
    """``mesh up meshfile`` (no argument: ``mesh up`` in ``cwd``) until its table is printed;
    SIGTERM (which stops it all) at the end."""
    argv = ["mesh", "up", *([str(meshfile)] if meshfile else [])]
    up = Proc.start(argv, name=name, tmp=tmp, env=env or clean_env(), cwd=cwd)
    try:
        wait_for(lambda: READY in up.output() or up.popen.poll() is not None, timeout=90,
                 what="mesh up to start")  # fmt: skip
        assert READY in up.output(), up.output()
        yield up
    finally:
        up.terminate()
