"""The public API is ``mesh``'s facade: every exported name resolves, and what users read
(README, docs, the example agents) imports only from it."""

from __future__ import annotations

import re
import subprocess
import sys

import mesh
from tests.support import ROOT, clean_env


def test_every_exported_name_resolves_from_its_private_module() -> None:
    for name in mesh.__all__:
        value = getattr(mesh, name)
        if name != "__version__":
            assert value.__module__.startswith("mesh._"), (name, value.__module__)


def test_remote_is_the_function_after_its_module_was_imported() -> None:
    # A node imports the module behind remote() before an agent module runs `from mesh import
    # remote`: with a module named mesh.remote that gave the module ("not callable").
    code = (
        "import mesh._remote\n"
        "from mesh import RemoteAgent, remote\n"
        "assert callable(remote) and isinstance(remote('credit-bureau'), RemoteAgent)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_users_are_shown_only_public_names() -> None:
    private = re.compile(r"(?:from|import) mesh\._|mesh\._[a-z]")
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "agents").glob("*.py")]
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in paths
        if p.name not in {"architecture.md", "performance.md"}  # written for mesh's maintainers
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert not found, "\n".join(found)
