"""``SqliteRegistryStore``: the registry's records in one SQLite file (WAL), so a restart of the
registry forgets nothing. Runs over ``mesh.sqlite.Database`` (one connection, one thread)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from mesh.discovery.base import Status
from mesh.sqlite import Database
from registry.card import agent_record
from registry.store import AgentRecord, InstanceRecord

__all__ = ["SqliteRegistryStore"]

_SCHEMA = """
create table if not exists registry_agents (
    name text primary key,
    card text not null,
    updated_at real not null
);
create table if not exists registry_instances (
    instance_id text primary key,
    agent text not null,
    url text not null,
    version text not null,
    status text not null,
    status_reason text not null,
    status_changed_at real not null,
    last_heartbeat_at real not null,
    registered_at real not null
);
create index if not exists registry_instances_agent on registry_instances(agent);
"""

_COLUMNS = (
    "instance_id, agent, url, version, status, status_reason, status_changed_at, "
    "last_heartbeat_at, registered_at"
)
# An agent record lives exactly as long as one of its instances does.
_DROP_ORPHANS = (
    "delete from registry_agents where name not in (select agent from registry_instances)"
)


def _instance(row: sqlite3.Row) -> InstanceRecord:
    return InstanceRecord(
        instance_id=row["instance_id"],
        agent=row["agent"],
        url=row["url"],
        version=row["version"],
        status=row["status"],
        status_reason=row["status_reason"],
        status_changed_at=row["status_changed_at"],
        last_heartbeat_at=row["last_heartbeat_at"],
        registered_at=row["registered_at"],
    )


def _agent(row: sqlite3.Row) -> AgentRecord:
    # The card was validated when stored; re-deriving keeps one definition of skills and schemas.
    return agent_record(json.loads(row["card"]), expected_name=row["name"], now=row["updated_at"])


class SqliteRegistryStore:
    """``RegistryStore`` over a ``Database``. ``await SqliteRegistryStore.open(path)``."""

    def __init__(self, db: Database, *, owns_db: bool = True) -> None:
        self._db = db
        self._owns_db = owns_db

    @classmethod
    async def open(cls, path: str | Path) -> SqliteRegistryStore:
        db = await Database.open(path)
        await db.ensure_schema("registry", _SCHEMA)
        return cls(db)

    async def put(self, agent: AgentRecord, instance: InstanceRecord) -> InstanceRecord:
        def write(conn: sqlite3.Connection) -> InstanceRecord:
            conn.execute(
                "insert into registry_agents (name, card, updated_at) values (?, ?, ?) "
                "on conflict(name) do update set card = excluded.card, "
                "updated_at = excluded.updated_at",
                (agent.name, json.dumps(agent.card), agent.updated_at),
            )
            conn.execute(
                f"insert into registry_instances ({_COLUMNS}) values (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "on conflict(instance_id) do update set agent = excluded.agent, "
                "url = excluded.url, version = excluded.version, status = excluded.status, "
                "status_reason = excluded.status_reason, "
                "status_changed_at = excluded.status_changed_at, "
                "last_heartbeat_at = excluded.last_heartbeat_at",
                (
                    instance.instance_id,
                    instance.agent,
                    instance.url,
                    instance.version,
                    instance.status,
                    instance.status_reason,
                    instance.status_changed_at,
                    instance.last_heartbeat_at,
                    instance.registered_at,
                ),
            )
            conn.execute(_DROP_ORPHANS)
            row = conn.execute(
                f"select {_COLUMNS} from registry_instances where instance_id = ?",
                (instance.instance_id,),
            ).fetchone()
            return _instance(row)

        return await self._db.write(write)

    async def heartbeat(self, instance_id: str, at: float) -> InstanceRecord | None:
        def write(conn: sqlite3.Connection) -> InstanceRecord | None:
            conn.execute(
                "update registry_instances set last_heartbeat_at = ? where instance_id = ?",
                (at, instance_id),
            )
            row = conn.execute(
                f"select {_COLUMNS} from registry_instances where instance_id = ?", (instance_id,)
            ).fetchone()
            return _instance(row) if row else None

        return await self._db.write(write)

    async def set_status(self, instance_id: str, status: Status, reason: str, at: float) -> None:
        await self._db.write(
            lambda conn: conn.execute(
                "update registry_instances set status = ?, status_reason = ?, "
                "status_changed_at = ? where instance_id = ?",
                (status, reason, at, instance_id),
            )
        )

    async def remove(self, instance_id: str) -> InstanceRecord | None:
        def write(conn: sqlite3.Connection) -> InstanceRecord | None:
            row = conn.execute(
                f"select {_COLUMNS} from registry_instances where instance_id = ?", (instance_id,)
            ).fetchone()
            if row is None:
                return None
            conn.execute("delete from registry_instances where instance_id = ?", (instance_id,))
            conn.execute(_DROP_ORPHANS)
            return _instance(row)

        return await self._db.write(write)

    async def instances(self, agent: str | None = None) -> list[InstanceRecord]:
        query = f"select {_COLUMNS} from registry_instances"
        params: tuple[str, ...] = ()
        if agent is not None:
            query += " where agent = ?"
            params = (agent,)
        query += " order by agent, url, instance_id"
        rows = await self._db.read(lambda conn: conn.execute(query, params).fetchall())
        return [_instance(r) for r in rows]

    async def agents(self) -> list[AgentRecord]:
        rows = await self._db.read(
            lambda conn: conn.execute(
                "select name, card, updated_at from registry_agents order by name"
            ).fetchall()
        )
        return [_agent(r) for r in rows]

    async def agent(self, name: str) -> AgentRecord | None:
        row = await self._db.read(
            lambda conn: conn.execute(
                "select name, card, updated_at from registry_agents where name = ?", (name,)
            ).fetchone()
        )
        return _agent(row) if row else None

    async def ping(self) -> None:
        """Raise ``StoreError`` when the database cannot be read (for ``/health``)."""
        await self._db.ping()

    async def aclose(self) -> None:
        if self._owns_db:
            await self._db.aclose()
