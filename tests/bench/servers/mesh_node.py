"""``mesh`` CLI entry for bench nodes that also records, at exit, which heavy modules the
process had imported (the scripted model must never pull in ``google.genai``).

    python -m tests.bench.servers.mesh_node serve agents.credit_bureau:agent --port 8003 ...

The record goes to ``$MESH_BENCH_MODULES`` as JSON when that variable is set.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mesh.cli.main import main

# Modules whose presence in a running node is worth knowing about.
WATCHED = ("google.genai", "google.auth", "consul", "sqlalchemy", "aiosqlite", "pyinstrument")


def _record() -> None:
    path = os.environ.get("MESH_BENCH_MODULES")
    if not path:
        return
    loaded = {name: name in sys.modules for name in WATCHED}
    Path(path).write_text(json.dumps({"modules": len(sys.modules), "loaded": loaded}))


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    finally:
        _record()
    sys.exit(code)
