"""Round trips of a write batch on PostgreSQL (``mesh._pg``, issue 17 item 3): the writes queued
together go to the server in one pipeline, one round trip for blind writes and one more per
result a write reads; a write that fails still fails alone. Against the real server the suite
starts (tests/postgres_support.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mesh._errors import StoreError
from tests.postgres_support import (  # noqa: F401 (fixtures)
    database_with,
    pg_database,
    postgres_server,
)

pytestmark = pytest.mark.postgres

_TABLE = "create table if not exists trip_t (id integer primary key, v text not null)"


db = database_with("trip_t", _TABLE)


def _insert(row_id: int, value: str = "v") -> Any:
    def write(conn: Any) -> None:
        conn.execute("insert into trip_t (id, v) values (?, ?)", (row_id, value))

    return write


async def _batch(db: Any, *writes: Any) -> list[Any]:
    """``writes`` queued in one go (nothing awaited between them): one batch."""
    batches = db.batches
    out = await asyncio.gather(*[db.write_soon(w) for w in writes], return_exceptions=True)
    assert db.batches == batches + 1
    return out


async def _ids(db: Any) -> list[int]:
    rows = await db.read(lambda conn: conn.execute("select id from trip_t order by id").fetchall())
    return [int(r[0]) for r in rows]


async def test_a_batch_of_blind_writes_is_one_round_trip(db: Any) -> None:
    from mesh._pg import PgConnection

    batches, before = db.batches, PgConnection.round_trips
    await _batch(db, _insert(1), _insert(2), _insert(3))
    assert db.batches == batches + 1
    # begin, three inserts and commit in one pipeline (each its own trip before: 5 and more).
    assert PgConnection.round_trips - before == 1
    assert await _ids(db) == [1, 2, 3]


async def test_a_write_reading_its_result_costs_one_trip_more_and_reads_it(db: Any) -> None:
    from mesh._pg import PgConnection

    def claim(conn: Any) -> int:
        cur = conn.execute("insert or ignore into trip_t (id, v) values (?, 'c')", (1,))
        return int(cur.rowcount)

    await db.write(_insert(1))
    before = PgConnection.round_trips
    # The row count is the server's, read inside the write (not psycopg's -1 of a pipeline).
    assert await _batch(db, claim, _insert(2), claim) == [0, None, 0]
    assert PgConnection.round_trips - before == 3  # two counts read, then the commit


async def test_a_failing_write_fails_alone_and_the_others_commit(db: Any) -> None:
    await db.write(_insert(1))

    def raising(conn: Any) -> None:
        conn.execute("insert into trip_t (id, v) values (7, 'x')")
        raise ValueError("the store's own error")

    # The duplicate's error shows only when the raising write makes the batch wait: it is
    # still the duplicate's, and the writes between run again (the server skipped them).
    out = await _batch(db, _insert(2), _insert(1), _insert(3), raising, _insert(4))
    assert [out[0], out[2], out[4]] == [None, None, None]
    assert isinstance(out[1], StoreError)
    assert "duplicate key" in str(out[1])
    assert isinstance(out[3], ValueError)
    assert await _ids(db) == [1, 2, 3, 4]  # neither the duplicate nor 7 (rolled back)
    # A duplicate last, seen only at the commit: the batch again, write by write.
    out = await _batch(db, _insert(5), _insert(6), _insert(2))
    assert out[:2] == [None, None]
    assert isinstance(out[2], StoreError)
    assert await _ids(db) == [1, 2, 3, 4, 5, 6]
    await _batch(db, _insert(8), _insert(9))  # the connection goes on
    assert await _ids(db) == [1, 2, 3, 4, 5, 6, 8, 9]


async def test_a_write_that_read_is_never_run_twice(db: Any) -> None:
    # What a write does in memory after reading (a recovery list) must not happen twice: a
    # failure later in its batch fails that write alone, and the reader runs once.
    await db.write(_insert(1))
    runs: list[int] = []

    def reader(conn: Any) -> None:
        row = conn.execute("select count(*) from trip_t").fetchone()
        runs.append(int(row[0]))
        conn.execute("insert into trip_t (id, v) values (10, 'r')")

    out = await _batch(db, _insert(2), reader, _insert(3), _insert(1))
    assert out[:3] == [None, None, None]
    assert isinstance(out[3], StoreError)
    assert runs == [2]
    assert await _ids(db) == [1, 2, 3, 10]
