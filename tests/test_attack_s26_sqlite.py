"""``mesh._sqlite.Database`` running batches on the event loop's thread (ab61c15, issue 19),
attacked with long statements: a batch must not hold the loop much longer than a small batch
takes (a node answers its card, its /health and every other request on that loop meanwhile),
and a batch moved off the loop half-done must be committed exactly once. Real SQLite files in
a temp dir.

Before the fix a statement long in CPU (a listing's scan no index serves, a big update or
delete: the pages cached, so no disk wait marks it slow) ran whole on the loop: a read of
~100-500 ms stopped the loop for all of it (through a node: its agent card answered in
0.8-1.5 s while a ListTasks by status scanned 300,000 tasks, against 0.08-0.3 s on the
database thread before ab61c15).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mesh._sqlite import Database

_ROWS = 400_000
_SCAN = "select count(*) from t where owner = '' and state = 3 and length(data) > 10"


def _fill(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("create table t (owner text, state integer, data blob)")
        conn.execute("create table marks (n integer)")
        rows = (("", i % 7, b"x" * 200) for i in range(_ROWS))
        conn.executemany("insert into t values (?, ?, ?)", rows)
        conn.commit()
    finally:
        conn.close()


async def _longest_gap(work: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    """How long ``work()`` took, the longest the loop stood still meanwhile, and its result."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():  # bounded: the work ends
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            gaps.append(time.perf_counter() - before)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    try:
        result = await work()
    finally:
        took = time.perf_counter() - started
        done.set()
        await ticker
    return took, max(gaps), result


async def test_a_long_read_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    _fill(path)
    db = await Database.open(path)
    try:
        expected = await db.read(lambda conn: conn.execute(_SCAN).fetchone()[0])  # page cache
        took, gap, found = await _longest_gap(
            lambda: db.read(lambda conn: conn.execute(_SCAN).fetchone()[0])
        )
    finally:
        await db.aclose()
    assert found == expected == _ROWS // 7 + (1 if _ROWS % 7 > 3 else 0)
    assert took > 0.05, f"the read took {took * 1000:.0f} ms: too quick to tell"
    # On the thread the longest gap is a GIL hand-over or two; on the loop it was the read.
    assert gap < took / 2, (
        f"the loop stood still {gap * 1000:.0f} ms in a {took * 1000:.0f} ms read"
    )


async def test_a_batch_moved_off_the_loop_half_done_commits_each_write_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.db"
    _fill(path)
    db = await Database.open(path)
    try:
        await db.read(lambda conn: conn.execute(_SCAN).fetchone())  # page cache

        async def batch() -> tuple[Any, ...]:
            # Queued in one loop iteration: one batch, a quick write first, then a long one.
            mark = db.write_soon(lambda conn: conn.execute("insert into marks values (1)"))
            bump = db.write(lambda conn: conn.execute("update t set state = state + 1"))
            scan = db.read(lambda conn: conn.execute(_SCAN).fetchone()[0])
            return tuple(await asyncio.gather(mark, bump, scan))

        took, gap, _ = await _longest_gap(batch)
        marks, total = await db.read(
            lambda conn: (
                conn.execute("select count(*) from marks").fetchone()[0],
                conn.execute("select sum(state) from t").fetchone()[0],
            )
        )
    finally:
        await db.aclose()
    # Each write committed once, whichever side of the loop ran it.
    assert marks == 1
    assert total == sum(i % 7 + 1 for i in range(_ROWS))
    assert took > 0.05, f"the batch took {took * 1000:.0f} ms: too quick to tell"
    assert gap < took / 2, (
        f"the loop stood still {gap * 1000:.0f} ms in a {took * 1000:.0f} ms batch"
    )
