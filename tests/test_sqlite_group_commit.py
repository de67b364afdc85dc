"""``Database`` group commit: concurrent writes share a transaction, each stays atomic, and a
write is on disk when its ``await`` returns."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from mesh._errors import StoreError
from mesh._sqlite import Database

SCHEMA = "create table if not exists t (k text primary key, v integer not null);"


async def _open(tmp_path: Path) -> Database:
    db = await Database.open(tmp_path / "node.db")
    await db.ensure_schema("t", SCHEMA)
    return db


def _insert(k: str, v: int) -> Callable[[sqlite3.Connection], object]:
    return lambda conn: conn.execute("insert into t (k, v) values (?, ?)", (k, v))


def _on_disk(path: Path) -> dict[str, int]:
    """What another process would see (a separate connection)."""
    conn = sqlite3.connect(path)
    try:
        return {k: v for k, v in conn.execute("select k, v from t")}
    finally:
        conn.close()


async def test_concurrent_writes_share_commits_and_all_land(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    try:
        commits_before = db.commits
        await asyncio.gather(*(db.write(_insert(f"k{i}", i)) for i in range(50)))
        assert _on_disk(tmp_path / "node.db") == {f"k{i}": i for i in range(50)}
        # 50 writes queued in one loop iteration: far fewer transactions than writes.
        assert 1 <= db.commits - commits_before < 50
    finally:
        await db.aclose()


async def test_a_write_is_committed_when_its_await_returns(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    try:
        for i in range(5):
            await db.write(_insert(f"k{i}", i))
            assert _on_disk(tmp_path / "node.db").get(f"k{i}") == i
    finally:
        await db.aclose()


async def test_a_failing_write_rolls_back_alone(tmp_path: Path) -> None:
    db = await _open(tmp_path)

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("insert into t (k, v) values ('bad-1', 1)")
        raise ValueError("boom")

    try:
        results = await asyncio.gather(
            db.write(_insert("a", 1)),
            db.write(half_then_fail),
            db.write(_insert("b", 2)),
            # a constraint error (duplicate key) in the same batch: a StoreError for its caller
            db.write(_insert("a", 3)),
            return_exceptions=True,
        )
        assert isinstance(results[1], ValueError)
        assert isinstance(results[3], StoreError)
        assert not isinstance(results[0], BaseException)
        assert not isinstance(results[2], BaseException)
        assert _on_disk(tmp_path / "node.db") == {"a": 1, "b": 2}
    finally:
        await db.aclose()


async def test_a_lone_failing_write_leaves_nothing_and_the_next_one_lands(
    tmp_path: Path,
) -> None:
    """A batch of one write runs without a savepoint: its failure undoes its transaction."""
    db = await _open(tmp_path)

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("insert into t (k, v) values ('bad-1', 1)")
        raise ValueError("boom")

    try:
        with pytest.raises(ValueError, match="boom"):
            await db.write(half_then_fail)
        await db.write(_insert("a", 1))
        with pytest.raises(StoreError):
            await db.write(_insert("a", 2))  # a constraint error: the caller's StoreError
        await db.write(_insert("b", 2))
        assert _on_disk(tmp_path / "node.db") == {"a": 1, "b": 2}
    finally:
        await db.aclose()


async def test_reads_in_a_batch_see_earlier_writes(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    try:
        write = db.write(_insert("x", 7))
        read = db.read(lambda conn: conn.execute("select v from t where k = 'x'").fetchone()[0])
        _, value = await asyncio.gather(write, read)
        assert value == 7
    finally:
        await db.aclose()


async def test_close_commits_what_is_queued(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    pending = [asyncio.ensure_future(db.write(_insert(f"q{i}", i))) for i in range(10)]
    await asyncio.sleep(0)  # queued, maybe not yet flushed
    await db.aclose()
    await asyncio.gather(*pending)
    assert _on_disk(tmp_path / "node.db") == {f"q{i}": i for i in range(10)}
    with pytest.raises(StoreError):
        await db.write(_insert("late", 1))


async def test_write_soon_commits_in_queue_order(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    try:
        early = db.write_soon(_insert("early", 1))
        await db.write(_insert("late", 2))
        # Awaiting the later write implies the earlier one is committed.
        assert _on_disk(tmp_path / "node.db") == {"early": 1, "late": 2}
        assert early.done()
        assert early.exception() is None
    finally:
        await db.aclose()


async def test_write_soon_rides_with_the_next_write_or_goes_alone(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    try:
        batches = db.batches
        early = db.write_soon(_insert("a", 1))
        await db.write(_insert("b", 2))
        assert db.batches == batches + 1  # one hop to the database thread for both
        assert early.done()
        alone = db.write_soon(_insert("c", 3))
        await asyncio.wait_for(alone, 5)  # flushed on its own, shortly
        assert _on_disk(tmp_path / "node.db") == {"a": 1, "b": 2, "c": 3}
    finally:
        await db.aclose()
