"""``python -m tests.bench.task_rows``: what the task table's layout costs the database thread,
``WITHOUT ROWID`` (``tasks`` versions 1-4) against the rowid table of version 5.

    python -m tests.bench.task_rows [--rows 20000] [--tasks 5000] [--runs 4]

For each layout, alternated ``--runs`` times: a fresh SQLite file (WAL, as a node opens it)
with the tasks schema, ``--rows`` finished tasks already in it (903 bytes of data and uuid ids,
as the bench coordinator's), then ``--tasks`` new tasks each saved twice as the store saves
them (``_UPSERT`` of the first state, then of the terminal one, each its own commit), then each
read back by key as ``GetTask`` does. Prints the CPU microseconds per task of the two saves and
of the read, and the table's and its indexes' bytes per task (``dbstat``). In process, no node:
the SQL and the file only.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from mesh._a2a import store

DATA = 903


def _open(path: Path, rowid: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("pragma journal_mode = wal")
    conn.execute("pragma synchronous = normal")
    conn.executescript(store._SCHEMA + store.TASKS_SCHEMA_V3 + store.TASKS_SCHEMA_V4)
    if rowid:
        conn.executescript(f"begin;\n{store.TASKS_SCHEMA_V5}\ncommit;")
    return conn


def run(path: Path, rowid: bool, rows: int, tasks: int) -> tuple[float, float, float]:
    """(us per task for two saves, us per read, table + index bytes per task)."""
    conn = _open(path, rowid)
    data = os.urandom(DATA)
    conn.execute("begin")
    for i in range(rows):
        task_id, context_id = str(uuid.uuid4()), str(uuid.uuid4())
        conn.execute(store._UPSERT, ("", task_id, context_id, 3, i, data, "t" * 32, i))
    conn.execute("commit")
    ids = [str(uuid.uuid4()) for _ in range(tasks)]
    context_ids = [str(uuid.uuid4()) for _ in range(tasks)]
    began = time.process_time()
    for i, task_id in enumerate(ids):
        for state, body, trace in ((1, data[:300], None), (3, data, "t" * 32)):
            conn.execute("begin immediate")
            conn.execute(
                store._UPSERT, ("", task_id, context_ids[i], state, rows + i, body, trace, i)
            )
            conn.execute("commit")
    saves = (time.process_time() - began) / tasks * 1e6
    began = time.process_time()
    for task_id in ids:
        sql = "select data from a2a_tasks where owner = ? and id = ?"
        conn.execute(sql, ("", task_id)).fetchone()
    reads = (time.process_time() - began) / tasks * 1e6
    size = conn.execute(
        "select sum(pgsize) from dbstat where name like 'a2a_tasks%' "
        "or name = 'sqlite_autoindex_a2a_tasks_1'"
    ).fetchone()[0]
    conn.close()
    return saves, reads, size / (rows + tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}")
    results: dict[str, list[tuple[float, float, float]]] = {"without rowid": [], "rowid": []}
    with tempfile.TemporaryDirectory(prefix="task-rows-") as tmp:
        for n in range(args.runs):
            for name in results:
                path = Path(tmp) / f"{n}-{name.replace(' ', '-')}.db"
                results[name].append(run(path, name == "rowid", args.rows, args.tasks))
    for name, runs in results.items():
        saves = [round(s) for s, _, _ in runs]
        print(
            f"{name:14s} two saves us/task {saves} median {statistics.median(saves):.0f}; "
            f"read {statistics.median(r for _, r, _ in runs):.1f} us; "
            f"table + indexes {statistics.median(b for _, _, b in runs):,.0f} B/task"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
