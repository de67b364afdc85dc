"""Registry replicas on one PostgreSQL keep the in-memory lookup view of a SQLite registry, kept
current with each other's writes (NOTIFY/LISTEN, ``registry.sqlite_store``): two stores on one
real database (the server ``tests.postgres_support`` starts), writes on A, lookups on B answered
from B's view (``lookup_reads`` stays 0: the database answers none of them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from registry.card import agent_record
from registry.sqlite_store import SqliteRegistryStore
from registry.store import InstanceRecord, secret_hash
from tests.support import eventually
from tests.test_registry_store import _card, _instance

pytestmark = [pytest.mark.postgres]

OWNER = secret_hash("owner-secret")
# Long enough that only a notification (not the periodic reload) explains a change seen.
NO_RELOAD_S = 600.0


@pytest.fixture
async def opened(pg_database: str) -> AsyncIterator[Callable[..., Any]]:
    stores: list[SqliteRegistryStore] = []

    async def open_store(refresh_s: float = NO_RELOAD_S) -> SqliteRegistryStore:
        store = await SqliteRegistryStore.open_postgres(pg_database, refresh_s=refresh_s)
        stores.append(store)
        return store

    yield open_store
    for store in stores:
        await store.aclose()


async def _register(
    store: SqliteRegistryStore, inst: InstanceRecord, supersede: frozenset[str] = frozenset()
) -> None:
    agent = agent_record(_card(inst.agent), expected_name=inst.agent, now=1.0)
    await store.put(agent, inst, secret_hash=OWNER, presented=None, supersede=supersede)


async def _on_b(b: SqliteRegistryStore, check: Callable[[list[InstanceRecord]], bool]) -> None:
    async def seen() -> bool:
        return check(await b.instances("echo"))

    await eventually(seen, within=5.0, what="B's view to show A's write")


async def test_b_sees_a_register_change_status_and_deregister_from_its_view(
    opened: Callable[..., Any],
) -> None:
    a, b = await opened(), await opened()
    await _register(a, _instance("i-1"))
    await _on_b(b, lambda got: [i.instance_id for i in got] == ["i-1"])
    card = await b.agent("echo")
    assert card is not None
    assert card.name == "echo"
    assert [x.name for x in await b.agents()] == ["echo"]

    await a.set_status("i-1", "critical", "no heartbeat for 31s (ttl 30s)", 200.0)
    await _on_b(
        b, lambda got: [(i.status, i.status_changed_at) for i in got] == [("critical", 200.0)]
    )

    # A re-registration at the same URL under a new id supersedes the old one on B too.
    await _register(
        a, _instance("i-2").replace(url=_instance("i-1").url), supersede=frozenset({"i-1"})
    )
    await _on_b(b, lambda got: [i.instance_id for i in got] == ["i-2"])

    assert await a.deregister("i-2", presented=OWNER) is not None
    await _on_b(b, lambda got: got == [])
    assert await b.agent("echo") is None
    assert await b.agents() == []
    # Every lookup above came from B's memory, and B never reloaded since it opened.
    assert b.lookup_reads == 0
    assert b.reloads == 1


async def test_a_heartbeat_reaches_b_with_the_periodic_reload(opened: Callable[..., Any]) -> None:
    """Heartbeats send no notification (docs/performance.md): B's prober reads their times
    from its view, which the reload every ``refresh_s`` keeps within that of the database."""
    a, b = await opened(), await opened(refresh_s=0.2)
    await _register(a, _instance("i-1", at=100.0))
    await _on_b(b, lambda got: len(got) == 1)
    listened = b._listener
    assert listened is not None
    # The registration's one notification (the reload may have shown it to B before).
    await eventually(lambda: listened.heard == 1, within=5.0, what="the registration heard")
    heard = listened.heard
    await a.heartbeat("i-1", 150.0, presented=OWNER)
    await _on_b(b, lambda got: got[0].last_heartbeat_at == 150.0)
    assert listened.heard == heard  # no notification carried it
    assert b.lookup_reads == 0


async def test_b_opened_again_loads_the_view(opened: Callable[..., Any]) -> None:
    a, b = await opened(), await opened()
    await _register(a, _instance("i-1"))
    await _on_b(b, lambda got: len(got) == 1)
    await b.aclose()
    # Written while B is away: no replica of B hears it, the load on opening finds it.
    await _register(a, _instance("i-2"))
    again = await opened()
    assert [i.instance_id for i in await again.instances("echo")] == ["i-1", "i-2"]
    assert again.lookup_reads == 0
    assert again.reloads == 1


async def test_a_dropped_listen_connection_reconnects_and_reloads(
    opened: Callable[..., Any], pg_database: str
) -> None:
    import psycopg

    a, b = await opened(), await opened()
    listener = b._listener
    assert listener is not None
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as admin:
        await admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity "
            "where application_name = 'mesh-registry-listen' and datname = current_database()"
        )
    # Written while the connection may be down: its notification may be lost, the reload on
    # reconnecting brings it.
    await _register(a, _instance("i-1"))
    await eventually(lambda: listener.drops >= 1 and listener.connected.is_set(), within=10.0)
    await _on_b(b, lambda got: [i.instance_id for i in got] == ["i-1"])
    await eventually(lambda: b.reloads >= 2, within=5.0, what="the reload after reconnecting")
    # And notifications flow again on the new connection.
    await a.set_status("i-1", "warning", "/health answered 503", 300.0)
    await _on_b(b, lambda got: got[0].status == "warning")
    assert b.lookup_reads == 0
