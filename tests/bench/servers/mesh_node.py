"""``mesh`` CLI entry for bench nodes that also records, at exit, which heavy modules the
process had imported (the scripted model must never pull in ``google.genai``).

    python -m tests.bench.servers.mesh_node serve agents.credit_bureau:agent --port 8003 ...

The record goes to ``$MESH_BENCH_MODULES`` as JSON when that variable is set. With
``BENCH_COUNT_DB=1`` (the profiler sets it) it also counts the node's database operations by
the function that made them, and what group commit turned them into: hops to the SQLite
thread and committed transactions; with ``BENCH_COUNT_PG=1`` the statements sent to PostgreSQL
(one round trip each). ``BENCH_KEEP_ALIVE=S`` serves with that keep-alive instead
of mesh's (the keep-alive soak).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from mesh._cli.main import main
from mesh._sqlite import Database

# Modules whose presence in a running node is worth knowing about.
WATCHED = ("google.genai", "google.auth", "consul", "sqlalchemy", "aiosqlite", "pyinstrument")


DB_CALLS: collections.Counter[str] = collections.Counter()
# Run before the record is written.
_AT_EXIT: list[Any] = []


def _count_db_calls() -> None:
    """Count each store operation (by the function that made it) and, separately, what they
    cost after group commit: thread hops (batches) and transactions committed."""
    enqueue, submit, run_batch = Database._enqueue, Database._submit, Database._run_batch

    def caller() -> str:
        frame = sys._getframe(2)
        entry = ("Database.read", "Database.write", "Database.write_soon")
        if frame.f_code.co_qualname in entry and frame.f_back:
            frame = frame.f_back
        return frame.f_code.co_qualname

    def counted_enqueue(self: Database, fn: Any, **kwargs: Any) -> Any:
        DB_CALLS[caller()] += 1
        return enqueue(self, fn, **kwargs)

    async def counted_submit(self: Database, fn: Any) -> Any:
        DB_CALLS[caller()] += 1
        DB_CALLS["[thread hops]"] += 1
        return await submit(self, fn)

    def counted_batch(self: Database, batch: Any) -> Any:
        before = self.commits
        out = run_batch(self, batch)
        # mesh._sqlite runs a batch on the loop's thread when it can (no hop).
        on_loop = threading.current_thread() is threading.main_thread()
        DB_CALLS["[batches on the loop]" if on_loop else "[thread hops]"] += 1
        DB_CALLS["[commits]"] += self.commits - before
        return out

    Database._enqueue = counted_enqueue  # type: ignore[method-assign]
    Database._submit = counted_submit  # type: ignore[method-assign]
    Database._run_batch = counted_batch  # type: ignore[method-assign]


def _count_pg_round_trips() -> None:
    """Count the round trips to PostgreSQL of the node's writer connection (``begin`` and
    ``commit`` included: ``mesh._pg.PgConnection.round_trips``, a statement sent alone or a
    pipeline synced or flushed for a result; read at exit) and the reads (the ``mesh-node-pg``
    row)."""
    from mesh._pg import PgConnection

    DB_CALLS["[pg round trips]"] = 0
    _AT_EXIT.append(lambda: DB_CALLS.update({"[pg round trips]": PgConnection.round_trips}))

    from mesh._pg import PgDatabase

    read = PgDatabase.read

    async def counted_read(self: PgDatabase, fn: Any) -> Any:
        # On a pooled reader connection (a thread hop of its own), or queued with the writes.
        DB_CALLS["[pg pool reads]" if self.pool is not None else "[pg queued reads]"] += 1
        return await read(self, fn)

    PgDatabase.read = counted_read  # type: ignore[method-assign]


def _record() -> None:
    path = os.environ.get("MESH_BENCH_MODULES")
    if not path:
        return
    for fn in _AT_EXIT:
        fn()
    loaded = {name: name in sys.modules for name in WATCHED}
    record = {"modules": len(sys.modules), "loaded": loaded, "db_calls": dict(DB_CALLS)}
    Path(path).write_text(json.dumps(record))


if __name__ == "__main__":
    if os.environ.get("BENCH_COUNT_DB") == "1":
        _count_db_calls()
    if os.environ.get("BENCH_COUNT_PG") == "1":
        _count_pg_round_trips()
    if os.environ.get("BENCH_KEEP_ALIVE"):
        # The keep-alive soak's "before": uvicorn's default (5 s), the race it reproduces.
        import mesh._cli.serve

        mesh._cli.serve.KEEP_ALIVE_S = int(os.environ["BENCH_KEEP_ALIVE"])
    try:
        code = main(sys.argv[1:])
    finally:
        _record()
    sys.exit(code)
