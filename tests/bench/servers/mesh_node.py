"""``mesh`` CLI entry for bench nodes that also records, at exit, which heavy modules the
process had imported (the scripted model must never pull in ``google.genai``).

    python -m tests.bench.servers.mesh_node serve agents.credit_bureau:agent --port 8003 ...

The record goes to ``$MESH_BENCH_MODULES`` as JSON when that variable is set. With
``BENCH_COUNT_DB=1`` (the profiler sets it) it also counts the node's database round trips
(each one a hop to the SQLite thread) by the function that made them.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

from mesh.cli.main import main
from mesh.sqlite import Database

# Modules whose presence in a running node is worth knowing about.
WATCHED = ("google.genai", "google.auth", "consul", "sqlalchemy", "aiosqlite", "pyinstrument")


DB_CALLS: collections.Counter[str] = collections.Counter()


def _count_db_calls() -> None:
    submit = Database._submit

    async def counted(self: Database, fn: Any) -> Any:
        # The caller's frame names the store operation (fn is often a lambda or in_tx).
        caller = sys._getframe(1)
        if caller.f_code.co_qualname in ("Database.read", "Database.write") and caller.f_back:
            caller = caller.f_back
        DB_CALLS[caller.f_code.co_qualname] += 1
        return await submit(self, fn)

    Database._submit = counted  # type: ignore[method-assign]


def _record() -> None:
    path = os.environ.get("MESH_BENCH_MODULES")
    if not path:
        return
    loaded = {name: name in sys.modules for name in WATCHED}
    record = {"modules": len(sys.modules), "loaded": loaded, "db_calls": dict(DB_CALLS)}
    Path(path).write_text(json.dumps(record))


if __name__ == "__main__":
    if os.environ.get("BENCH_COUNT_DB") == "1":
        _count_db_calls()
    try:
        code = main(sys.argv[1:])
    finally:
        _record()
    sys.exit(code)
