"""The registry's view on PostgreSQL (``registry.sqlite_store``) against a role that can connect
to its database but is not a registry (PostgreSQL grants CONNECT to PUBLIC by default, and a
connected role may NOTIFY any channel): its notifications must not make the replicas do work
(a ``reload`` each reads the whole view again: a flood of them pins a core at 10,000 instances).
Real roles on the real test server."""

from __future__ import annotations

import uuid

import pytest

from registry.sqlite_store import CHANNEL, SqliteRegistryStore
from tests.support import eventually
from tests.test_registry_fast_routes import _seed

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


async def test_an_outsider_cannot_make_the_registry_reload(pg_database: str) -> None:
    import psycopg

    role = f"outsider_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as admin:
        await admin.execute(f"create role {role} login")
    watching = await SqliteRegistryStore.open_postgres(pg_database, refresh_s=3600.0)
    writing = await SqliteRegistryStore.open_postgres(pg_database, refresh_s=3600.0)
    outsider = await psycopg.AsyncConnection.connect(
        pg_database.replace("postgres@", f"{role}@", 1), autocommit=True
    )
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await outsider.execute("select * from registry_instances")
        reloads = watching.reloads
        for _ in range(20):
            await outsider.execute("select pg_notify(%s, %s)", (CHANNEL, '{"reload": true}'))
        # Then a registry's own write: once the watching replica has it in its view, it has
        # heard (and acted on) everything the outsider sent before.
        await _seed(writing, "http://127.0.0.1:9")
        await eventually(
            lambda: watching._view is not None and len(watching._view.instances(None)) == 4
        )
        assert watching.reloads == reloads  # before: 1 or more whole reloads
    finally:
        await outsider.close()
        await writing.aclose()
        await watching.aclose()
