"""PostgreSQL's reader pool (``mesh._pg.PgDatabase``, issue 17): reads go to pooled
connections on their own threads, so they never wait behind a write batch and run beside each
other; a connection the server dropped is replaced by the pool without a failed read. Against
the real server the suite starts (tests/postgres_support.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from mesh._errors import ConfigError
from mesh._settings import MeshSettings, NodeSettings
from tests.postgres_support import (  # noqa: F401 (fixtures)
    database_with,
    pg_database,
    postgres_server,
)
from tests.support import eventually

#: Reader connections by default (``MESH_PG_POOL_MAX``).
POOL_MAX = 4
_TABLE = "create table if not exists pool_t (id integer primary key, v text not null)"


db = database_with("pool_t", _TABLE)


def _count(conn: Any) -> int:
    return int(conn.execute("select count(*) from pool_t").fetchone()[0])


@pytest.mark.postgres
async def test_a_read_completes_while_a_write_batch_is_held_open(db: Any) -> None:
    # A slow commit or a long batch on the writer: a GetTask meanwhile is answered, with what
    # is committed (the batch's rows are not, yet).
    inside, release = threading.Event(), threading.Event()

    def held(conn: Any) -> None:
        conn.execute("insert into pool_t (id, v) values (1, 'a')")
        inside.set()
        release.wait(20)

    writing = asyncio.ensure_future(db.write(held))
    try:
        assert await asyncio.to_thread(inside.wait, 10)
        assert await asyncio.wait_for(db.read(_count), 5) == 0
        await asyncio.wait_for(db.ping(), 5)
    finally:
        release.set()
        await writing
    assert await db.read(_count) == 1


@pytest.mark.postgres
async def test_reads_run_at_once(db: Any) -> None:
    # Each read waits until all of them are inside: that happens only if they run together.
    together = threading.Barrier(POOL_MAX, timeout=10)

    def read(conn: Any) -> int:
        pid = int(conn.execute("select pg_backend_pid()").fetchone()[0])
        together.wait()
        return pid

    pids = await asyncio.gather(*(db.read(read) for _ in range(POOL_MAX)))
    assert len(set(pids)) == POOL_MAX  # each on its own connection
    writer = await db.write(lambda conn: conn.execute("select pg_backend_pid()").fetchone()[0])
    assert writer not in pids  # and none of them the writer's
    assert db.pool.get_stats()["pool_size"] == POOL_MAX
    from mesh._pg import POOL_MAX as default

    assert default == POOL_MAX


@pytest.mark.postgres
async def test_terminated_backends_are_replaced_without_a_failed_request(
    db: Any,
    pg_database: str,  # noqa: F811 (the fixture above)
) -> None:
    import psycopg

    together = threading.Barrier(POOL_MAX, timeout=10)

    def opened(conn: Any) -> int:  # every reader connection open and idle in the pool
        together.wait()
        return int(conn.execute("select pg_backend_pid()").fetchone()[0])

    before = set(await asyncio.gather(*(db.read(opened) for _ in range(POOL_MAX))))
    await db.write(lambda conn: conn.execute("insert into pool_t (id, v) values (1, 'a')"))

    def backends(admin: psycopg.Connection[Any]) -> int:
        row = admin.execute(
            "select count(*) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid()"
        ).fetchone()
        assert row is not None
        return int(row[0])

    with psycopg.connect(pg_database, autocommit=True) as admin:
        assert backends(admin) == POOL_MAX + 1  # the readers and the writer
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid()"
        )
        await eventually(lambda: backends(admin) == 0, what="the backends terminated")

    # Every request after the loss succeeds: reads on replaced connections, the write on the
    # writer's, opened again.
    counts = await asyncio.gather(*(db.read(_count) for _ in range(2 * POOL_MAX)))
    assert counts == [1] * (2 * POOL_MAX)
    await db.write(lambda conn: conn.execute("insert into pool_t (id, v) values (2, 'b')"))
    assert await db.read(_count) == 2
    assert db.read_retries >= 1
    assert db._conn.reconnects == 1
    now = await db.read(lambda conn: conn.execute("select pg_backend_pid()").fetchone()[0])
    assert now not in before  # a connection the pool opened in place of a lost one


@pytest.mark.postgres
async def test_no_pool_reads_queue_with_the_writes(pg_database: str) -> None:  # noqa: F811
    from mesh._pg import PgDatabase

    db = await PgDatabase.open(pg_database, pool_max=0)  # MESH_PG_POOL_MAX=0, MIN as it is
    try:
        assert db.pool is None
        await db.ensure_schema("pool_t", _TABLE)
        assert await db.read(_count) == 0
        await db.ping()
    finally:
        await db.aclose()


@pytest.mark.parametrize(
    ("low", "high", "ok"),
    [
        ("1", "4", True),
        ("2", "2", True),
        ("1", "0", True),
        ("3", "2", False),
        ("0", "4", False),
        ("1", "-1", False),
    ],
)
def test_the_pool_sizes_are_settings(low: str, high: str, ok: bool) -> None:
    env = MeshSettings.from_env({"MESH_PG_POOL_MIN": low, "MESH_PG_POOL_MAX": high})
    if not ok:
        with pytest.raises(ConfigError, match="MESH_PG_POOL_MIN"):
            NodeSettings.build(env, agent_name="a", no_register=True)
        return
    settings = NodeSettings.build(env, agent_name="a", no_register=True)
    assert (settings.pg_pool_min, settings.pg_pool_max) == (int(low), int(high))


@pytest.mark.postgres
async def test_the_pool_state_is_on_the_metrics(pg_database: str) -> None:  # noqa: F811
    from prometheus_client import CollectorRegistry

    from mesh._pg import PgDatabase

    registry = CollectorRegistry()
    db = await PgDatabase.open(pg_database, metrics=(registry, "bureau"))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"agent": "bureau", **labels})

    inside, release = threading.Event(), threading.Event()

    def held(conn: Any) -> None:
        inside.set()
        release.wait(20)

    try:
        reading = asyncio.ensure_future(db.read(held))
        try:
            assert await asyncio.to_thread(inside.wait, 10)
            assert value("mesh_pg_pool_connections", state="busy") == 1
            assert value("mesh_pg_pool_waiting") == 0
        finally:
            release.set()
            await reading
        assert value("mesh_pg_pool_connections", state="busy") == 0
        assert (value("mesh_pg_pool_connections", state="idle") or 0) >= 1
    finally:
        await db.aclose()
    assert value("mesh_pg_pool_connections", state="idle") is None  # gone with the database


@pytest.mark.postgres
async def test_a_read_while_the_database_is_gone_fails_with_a_store_error(
    pg_database: str,  # noqa: F811 (the fixture above)
    postgres_server: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No connection to be had (the database dropped, as a server that stays away): the read
    # fails within the pool's wait, with a StoreError naming the database, and does not hang.
    import psycopg

    import mesh._pg
    from mesh._errors import StoreError
    from mesh._pg import PgDatabase

    monkeypatch.setattr(mesh._pg, "POOL_WAIT_S", 2.0)  # 10 s in production
    db = await PgDatabase.open(pg_database)
    try:
        await db.ping()
        name = pg_database.rsplit("/", 1)[1]
        with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
            admin.execute(f"drop database {name} with (force)")
        with pytest.raises(StoreError, match=f"{name}: no connection to it .* is the server up"):
            await asyncio.wait_for(db.read(_count), 10)
    finally:
        await db.aclose()
