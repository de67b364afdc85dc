"""``from mesh import X`` gives the public X whatever was imported before."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT, clean_env


def test_remote_is_the_function_after_its_module_was_imported() -> None:
    # A process that imported mesh.remote (a node does) before an agent module runs
    # `from mesh import remote` used to get the module: "'module' object is not callable".
    code = (
        "import mesh.remote\n"
        "from mesh import remote\n"
        "from mesh.remote import RemoteAgent\n"
        "assert callable(remote) and remote.__module__ == 'mesh.remote', remote\n"
        "assert isinstance(remote('credit-bureau'), RemoteAgent)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
