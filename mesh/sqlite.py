"""``Database``: the node's one SQLite file, one connection, one thread.

Every store of a node (sessions, A2A tasks, idempotency keys) shares one ``Database``. All
statements run on a single dedicated thread that owns the connection, so the event loop never
blocks on disk and there is exactly one writer (SQLite's rule anyway) with no per-request
connection. WAL keeps readers from other processes (``mesh`` CLI, backups) unblocked.

    db = await Database.open(path)
    rows = await db.read(lambda conn: conn.execute("select ...").fetchall())
    await db.write(lambda conn: conn.execute("insert ..."))   # one transaction, atomic
    await db.aclose()
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from mesh.errors import StoreError

__all__ = ["Database"]

T = TypeVar("T")


class Database:
    def __init__(self, conn: sqlite3.Connection, executor: ThreadPoolExecutor, path: str) -> None:
        self._conn = conn
        self._executor = executor
        self.path = path
        self._closed = False
        self._schemas: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, path: str | Path) -> Database:
        """Open (creating the file and its folder) with WAL. ``":memory:"`` works too."""
        path = str(path)
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mesh-sqlite")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("pragma journal_mode=wal")
            # NORMAL is durable across process crashes in WAL mode (only an OS crash can lose
            # the last transactions), at a fraction of FULL's fsync cost.
            conn.execute("pragma synchronous=normal")
            conn.execute("pragma busy_timeout=5000")
            conn.execute("pragma foreign_keys=on")
            return conn

        loop = asyncio.get_running_loop()
        try:
            conn = await loop.run_in_executor(executor, connect)
        except sqlite3.Error as exc:
            executor.shutdown(wait=False)
            raise StoreError(f"cannot open database {path}: {exc}") from exc
        return cls(conn, executor, path)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the database thread."""
        return await self._submit(fn)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` inside one transaction: all of it is committed, or none."""

        def in_tx(conn: sqlite3.Connection) -> T:
            conn.execute("begin immediate")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("rollback")
                raise
            conn.execute("commit")
            return result

        return await self._submit(in_tx)

    async def ensure_schema(self, name: str, script: str) -> None:
        """Create tables once per process (``script`` must be idempotent: IF NOT EXISTS)."""
        if name in self._schemas:
            return
        await self._submit(lambda conn: conn.executescript(script))
        self._schemas.add(name)

    async def _submit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError(f"database {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, self._conn)
        except sqlite3.Error as exc:
            raise StoreError(f"database {self.path}: {exc}") from exc

    async def ping(self) -> None:
        """Cheap health check: raises ``StoreError`` when the file cannot be read."""
        await self._submit(lambda conn: conn.execute("select 1").fetchone())

    async def aclose(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._conn.close)
        self._closed = True
        self._executor.shutdown(wait=True)
