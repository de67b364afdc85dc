"""``Database`` runs its batches on the event loop's thread when that cannot stall the loop
(mesh._sqlite): a lock held by another connection, a slow batch and the WAL's checkpoints go to
the database thread. Real SQLite files, a second real connection for the lock."""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import mesh._sqlite
from mesh._sqlite import Database
from tests.support import eventually

SCHEMA = "create table if not exists t (k text primary key, v blob not null);"


async def _open(path: Path) -> Database:
    db = await Database.open(path)
    await db.ensure_schema("t", SCHEMA)
    return db


def _on_disk(path: Path) -> set[str]:
    """The keys another process would see (a separate connection)."""
    conn = sqlite3.connect(path)
    try:
        return {k for (k,) in conn.execute("select k from t")}
    finally:
        conn.close()


def _insert_blob(key: str, conn: sqlite3.Connection) -> None:
    conn.execute("insert into t (k, v) values (?, ?)", (key, b"x" * 3000))


class _Threads:
    """Records the thread each write ran on."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def insert(self, key: str, *, burn_s: float = 0.0) -> Callable[[sqlite3.Connection], None]:
        def run(conn: sqlite3.Connection) -> None:
            self.seen.append(threading.current_thread().name)
            conn.execute("insert into t (k, v) values (?, ?)", (key, b"x"))
            if burn_s:  # a slow disk, as the loop sees it: the batch takes this long
                time.sleep(burn_s)

        return run


async def test_a_batch_runs_on_the_loop_thread_and_is_committed(tmp_path: Path) -> None:
    db = await _open(tmp_path / "node.db")
    threads = _Threads()
    try:
        await db.write(threads.insert("a"))
        assert threads.seen == [threading.current_thread().name]  # no hop to a thread
        assert _on_disk(tmp_path / "node.db") == {"a"}  # committed when the await returned
        assert db.inline_batches >= 1
    finally:
        await db.aclose()


async def test_a_lock_held_elsewhere_does_not_stall_the_loop(tmp_path: Path) -> None:
    """Another connection holds the write lock (the ``mesh`` CLI, a backup, a second process):
    the loop keeps its timers; the write waits on the database thread and commits once the lock
    is released."""
    path = tmp_path / "node.db"
    db = await _open(path)
    threads = _Threads()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("begin immediate")
        write = asyncio.ensure_future(db.write(threads.insert("waited")))
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(0.05)  # the timer under test: does it fire on time?
        assert loop.time() - started < 1.0  # SQLite's busy timeout (5 s) was not on the loop
        await eventually(lambda: threads.seen == [] and db._flusher is not None, within=5)
        assert not write.done()  # waiting for the lock, off the loop
        other.execute("commit")
        await asyncio.wait_for(write, 10)
        assert threads.seen == ["mesh-sqlite_0"]  # the thread ran it
        assert _on_disk(path) == {"waited"}
        # Lock released: the next batch is the loop's again.
        await db.write(threads.insert("after"))
        assert threads.seen[-1] == threading.current_thread().name
    finally:
        other.close()
        await db.aclose()


async def test_the_wal_stays_bounded_checkpointed_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's connection never checkpoints (a checkpoint copies and fsyncs the file);
    the database thread does, often enough that the WAL does not grow with the commits."""
    monkeypatch.setattr(mesh._sqlite, "CHECKPOINT_EVERY", 20, raising=False)
    monkeypatch.setattr(mesh._sqlite, "WAL_RESTART_FRAMES", 100, raising=False)
    path = tmp_path / "node.db"
    db = await _open(path)
    where: list[str] = []
    run_checkpoint = db._run_checkpoint

    def recorded() -> None:
        where.append(threading.current_thread().name)
        run_checkpoint()

    db._run_checkpoint = recorded  # type: ignore[method-assign]
    try:
        auto = await db.read(lambda conn: conn.execute("pragma wal_autocheckpoint").fetchone()[0])
        assert auto == 0
        page = await db.read(lambda conn: conn.execute("pragma page_size").fetchone()[0])
        commits = 4000
        for i in range(commits):  # one commit each, about two pages each
            await db.write(functools.partial(_insert_blob, f"k{i}"))
        await eventually(lambda: db._checkpoint is None, within=10)
        assert db.checkpoints >= 2
        assert set(where) == {"mesh-sqlite_0"}
        wal = (tmp_path / "node.db-wal").stat().st_size
        # Unchecked, the WAL holds every commit's pages (> 2 * commits frames, ~33 MB); here
        # it starts over about every WAL_RESTART_FRAMES (its high-water mark, ~1-3 MB, is what
        # the writer added while a checkpoint's fsync ran).
        # Unchecked, the WAL holds every commit's pages (> 2 * commits frames, ~33 MB). Here it
        # starts over past WAL_RESTART_FRAMES, and a writer faster than the checkpoints waits
        # for them past 2 * CHECKPOINT_EVERY commits: ~420 frames at most (~1.7 MB).
        assert wal < 1000 * (page + 24), f"WAL {wal} bytes after {commits} commits"
    finally:
        await db.aclose()
    assert len(_on_disk(path)) == commits


async def test_a_slow_batch_sends_the_next_ones_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch that took longer than SLOW_BATCH_S on the loop (a slow disk) sends the ones
    after it to the database thread for SLOW_HOLD_S, with a warning; then the loop again."""
    monkeypatch.setattr(mesh._sqlite, "SLOW_BATCH_S", 0.002, raising=False)
    monkeypatch.setattr(mesh._sqlite, "SLOW_HOLD_S", 1.0, raising=False)
    db = await _open(tmp_path / "node.db")
    threads = _Threads()
    loop_thread = threading.current_thread().name
    try:
        with caplog.at_level(logging.WARNING, logger="mesh.sqlite"):
            await db.write(threads.insert("slow", burn_s=0.01))
        assert threads.seen == [loop_thread]  # measured on the loop
        assert db.slow_batches == 1
        assert "on the event loop" in caplog.text
        assert "slow or saturated disk" in caplog.text
        await db.write(threads.insert("next"))
        assert threads.seen[-1] == "mesh-sqlite_0"
        assert _on_disk(tmp_path / "node.db") == {"slow", "next"}

        async def back_on_the_loop() -> bool:
            await db.write(threads.insert(f"k{len(threads.seen)}"))
            return threads.seen[-1] == loop_thread

        await eventually(back_on_the_loop, within=10, interval=0.05)
    finally:
        await db.aclose()


async def test_a_failing_checkpoint_is_logged_and_close_still_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint that fails while the database closes (a disk error) is logged; ``aclose``
    still commits, closes and returns."""
    monkeypatch.setattr(mesh._sqlite, "CHECKPOINT_EVERY", 1)
    path = tmp_path / "node.db"
    db = await _open(path)
    release = threading.Event()

    def failing() -> None:
        release.wait(10)
        raise sqlite3.OperationalError("disk I/O error")

    db._run_checkpoint = failing  # type: ignore[method-assign]
    threads = _Threads()
    with caplog.at_level(logging.WARNING, logger="mesh.sqlite"):
        await db.write(threads.insert("a"))
        await eventually(lambda: db._checkpoint is not None, within=5)
        closing = asyncio.ensure_future(db.aclose())
        await eventually(lambda: db._closed, within=5)  # closing waits for the checkpoint
        release.set()
        await asyncio.wait_for(closing, 10)
    assert "checkpoint failed: disk I/O error" in caplog.text
    assert _on_disk(path) == {"a"}


async def test_operations_inside_on_thread_run_on_the_database_thread(tmp_path: Path) -> None:
    db = await _open(tmp_path / "node.db")
    threads = _Threads()
    try:
        with db.on_thread():
            await db.write(threads.insert("heavy"))
        await db.write(threads.insert("light"))
        assert threads.seen == ["mesh-sqlite_0", threading.current_thread().name]
        assert _on_disk(tmp_path / "node.db") == {"heavy", "light"}
    finally:
        await db.aclose()


async def test_a_retention_sweep_runs_its_batches_on_the_database_thread(tmp_path: Path) -> None:
    """Retention's deletes and vacuum (milliseconds a batch) are kept off the event loop."""
    from mesh._retention import RetentionPolicy, Sweeper
    from tests.test_retention import DONE, HOUR_NS, _put, _stores

    db = await Database.open(tmp_path / "node.db")
    try:
        tasks, keys, _ = await _stores(db)
        now = time.time_ns()
        for i in range(5):
            await _put(tasks, keys, f"old{i}", DONE, now - 2 * HOUR_NS)
        seen: list[str] = []
        run_batch = db._run_batch

        def recorded(batch: list[mesh._sqlite._Op]) -> list[tuple[bool, object]]:
            seen.append(threading.current_thread().name)
            return run_batch(batch)

        db._run_batch = recorded  # type: ignore[method-assign]
        policy = RetentionPolicy(tasks_for_s=3600, tasks_max=None, batch=2)
        report = await Sweeper(policy, db, tasks=tasks).sweep()
        assert report.deleted["tasks"] == 5
        assert seen
        assert set(seen) == {"mesh-sqlite_0"}
    finally:
        await db.aclose()


def _budget_at_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite calls the progress handler every ``_PROGRESS_OPS`` steps a cached statement has
    made in all its runs, so now and then in one of a batch's own statements (its COMMIT, a
    savepoint's rollback): one that comes after the budget ran out is interrupted. Here the
    handler runs at every step, so the first statement past the budget is."""
    monkeypatch.setattr(mesh._sqlite, "_PROGRESS_OPS", 1)
    monkeypatch.setattr(mesh._sqlite, "LOOP_BUDGET_S", 0.01)


@pytest.mark.parametrize("every", [1, 3])
async def test_a_batch_past_the_budget_at_its_commit_commits_once_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    """The write's insert runs, then its time passes: only the COMMIT is left when the budget
    has run out, and it is not interrupted (the handler every step would interrupt it before
    it commits; every three steps, a COMMIT's count, after its last step, where the interrupt
    would hide whether it committed). Committed once, on the loop."""
    monkeypatch.setattr(mesh._sqlite, "_PROGRESS_OPS", every)
    monkeypatch.setattr(mesh._sqlite, "LOOP_BUDGET_S", 0.01)
    db = await _open(tmp_path / "node.db")
    threads = _Threads()
    try:
        await db.write(threads.insert("k", burn_s=0.02))
        assert _on_disk(tmp_path / "node.db") == {"k"}
        assert threads.seen == ["MainThread"]
    finally:
        await db.aclose()


async def test_a_savepoint_rollback_interrupted_past_the_budget_leaves_no_transaction_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of a batch fails after the budget ran out: the rollback to its savepoint is
    interrupted. The batch runs again on the thread (the failing write fails alone), and the
    connection takes the next batches: no transaction is left open behind it."""
    _budget_at_every_step(monkeypatch)
    db = await _open(tmp_path / "node.db")

    def fail_late(conn: sqlite3.Connection) -> None:
        time.sleep(0.02)
        raise ValueError("this write fails")

    try:
        failing = asyncio.ensure_future(db.write(fail_late))
        await db.write(functools.partial(_insert_blob, "k1"))
        with pytest.raises(ValueError, match="this write fails"):
            await failing
        await db.write(functools.partial(_insert_blob, "k2"))
        assert _on_disk(tmp_path / "node.db") == {"k1", "k2"}
    finally:
        await db.aclose()
