"""``SqliteRegistryStore``: the registry's records in one SQLite file (WAL), so a restart of the
registry forgets nothing. Runs over ``mesh._sqlite.Database`` (one connection, one thread).

Ownership checks (``registry.store``) run inside the write that changes the record, so two
registrations racing for one id cannot both win.

Reads come from memory (``_View``): every instance and agent as the database holds them, loaded
when the store opens and changed by the same methods that write, once their write is committed.
A lookup is the registry's most frequent read (every delegation's discovery), and at fleet scale
a database round trip per lookup, plus rebuilding records from rows, was most of its cost. The
database stays the truth (a restart loads the view from it); the view is only sound while this
process is the file's one writer, which a SQLite registry is.

Over PostgreSQL, shared by replicas, each replica keeps the same view and learns of the others'
writes (docs/architecture.md, "Storage backends"): a write that changes what a lookup shows (a
registration, a status, a deregistration, a removal) sends ``NOTIFY mesh_registry`` in its
transaction, naming the agent and the instances it touched; every replica listens
(``LISTEN``, ``mesh._pg_notify``) and reads those rows again. A heartbeat only moves
``last_heartbeat_at`` and sends nothing (at 10,000 instances that would be 2,000 notifications
a second, each taking PostgreSQL's notify lock at commit: docs/performance.md); the full reload
every ``refresh_s`` brings heartbeat times (the prober's TTL reads them) and anything a lost
notification missed, and so does a reload each time the LISTEN connection comes back.

Each notification is signed (HMAC-SHA256, 128 bits) with a key the first replica stores in
``registry_notify_key`` (readable by the registry's role only), and one whose signature does not
check is dropped: PostgreSQL grants CONNECT to every role by default and a connected role may
NOTIFY any channel, so before, any role could make every replica reload its whole view as often
as it liked."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import sqlite3
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from mesh._discovery.base import Status
from mesh._notify_signing import MAC_CHARS, NotifySigner, key_schema, shared_key
from mesh._sqlite import Database
from registry.card import agent_record
from registry.store import (
    AgentRecord,
    InstanceRecord,
    Registered,
    check_owner,
    check_room,
    check_supersede,
)

if TYPE_CHECKING:
    from mesh._pg_notify import PgListener

__all__ = ["CHANNEL", "REFRESH_S", "SqliteRegistryStore"]

log = logging.getLogger("registry.store")
T = TypeVar("T")

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
    registered_at real not null,
    secret_hash text not null default ''
);
create index if not exists registry_instances_agent on registry_instances(agent);
"""

_COLUMNS = (
    "instance_id, agent, url, version, status, status_reason, status_changed_at, "
    "last_heartbeat_at, registered_at"
)
_SELECT_AGENTS = "select name, card, updated_at from registry_agents"
# An agent record lives exactly as long as one of its instances does.
_DROP_ORPHANS = (
    "delete from registry_agents where name not in (select agent from registry_instances)"
)
#: The channel registry replicas on one PostgreSQL tell each other their writes on.
CHANNEL = "mesh_registry"
#: Seconds between two full reloads of a PostgreSQL replica's view (heartbeat times, and
#: whatever a lost notification missed).
REFRESH_S = 5.0
# A notification's payload limit (mesh._pg_notify.MAX_PAYLOAD; not imported: SQLite
# registries load no psycopg).
_MAX_PAYLOAD = 7900
# The replicas' signing key (one row, mesh._notify_signing), a component of its own (the
# registry's tables are version 1 of "registry").
_KEY_TABLE = "registry_notify_key"


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


def _migrate(conn: sqlite3.Connection) -> int:
    """Add ``secret_hash`` to a database from before ownership, dropping its instances: nobody
    holds their secret. Their nodes get 404 on the next heartbeat and register again (each
    then owning its new record). Returns how many were dropped."""
    columns = {row[1] for row in conn.execute("pragma table_info(registry_instances)")}
    if "secret_hash" in columns:
        return 0
    conn.execute("alter table registry_instances add column secret_hash text not null default ''")
    dropped = conn.execute("delete from registry_instances").rowcount
    conn.execute(_DROP_ORPHANS)
    return int(dropped)


def _claim(
    conn: sqlite3.Connection, instance_id: str, presented: str | None, *, agent: str | None = None
) -> bool:
    """Whether ``instance_id`` is stored; ``check_owner`` refuses a writer who does not own it."""
    row = conn.execute(
        "select agent, secret_hash from registry_instances where instance_id = ?", (instance_id,)
    ).fetchone()
    if row is None:
        return False
    check_owner(instance_id, row["agent"], row["secret_hash"], presented, agent=agent)
    return True


def _remove(conn: sqlite3.Connection, instance_id: str) -> InstanceRecord | None:
    row = conn.execute(
        f"select {_COLUMNS} from registry_instances where instance_id = ?", (instance_id,)
    ).fetchone()
    if row is None:
        return None
    conn.execute("delete from registry_instances where instance_id = ?", (instance_id,))
    conn.execute(_DROP_ORPHANS)
    return _instance(row)


def _agent(row: sqlite3.Row) -> AgentRecord:
    # The card was validated when stored; re-deriving keeps one definition of skills and schemas.
    return agent_record(json.loads(row["card"]), expected_name=row["name"], now=row["updated_at"])


def _order(inst: InstanceRecord) -> tuple[str, str]:
    return inst.url, inst.instance_id


class _View:
    """Every instance and agent of the store, in memory, in the order the store reads them."""

    def __init__(self, instances: list[InstanceRecord], agents: list[AgentRecord]) -> None:
        self.agents = {a.name: a for a in agents}
        self.by_agent: dict[str, dict[str, InstanceRecord]] = {}
        for inst in instances:
            self.by_agent.setdefault(inst.agent, {})[inst.instance_id] = inst
        # Sorted lists, made on the first read after a change (None: changed since).
        self._ordered: dict[str, list[InstanceRecord]] = {}
        self._agent_list: list[AgentRecord] | None = None

    def put(self, inst: InstanceRecord) -> None:
        mine = self.by_agent.setdefault(inst.agent, {})
        before = mine.get(inst.instance_id)
        mine[inst.instance_id] = inst
        ordered = self._ordered.get(inst.agent)
        if ordered is not None and before is not None and before.url == inst.url:
            # A heartbeat or a status: same place in the order, no sort.
            ordered[bisect.bisect_left(ordered, _order(inst), key=_order)] = inst
        else:
            self._ordered.pop(inst.agent, None)

    def drop(self, inst: InstanceRecord) -> None:
        """Forget ``inst``, and its agent with its last instance (as ``_DROP_ORPHANS``)."""
        mine = self.by_agent.get(inst.agent, {})
        mine.pop(inst.instance_id, None)
        self._ordered.pop(inst.agent, None)
        if not mine:
            self.by_agent.pop(inst.agent, None)
            if self.agents.pop(inst.agent, None) is not None:
                self._agent_list = None

    def set_agent(self, agent: AgentRecord) -> None:
        self.agents[agent.name] = agent
        self._agent_list = None

    def drop_id(self, agent: str, instance_id: str) -> None:
        """Forget instance ``instance_id`` of ``agent`` if the view holds it."""
        inst = self.by_agent.get(agent, {}).get(instance_id)
        if inst is not None:
            self.drop(inst)

    def same_as(self, old: _View) -> None:
        """Keep ``old``'s instance records where they equal this view's (a reload that found
        nothing new changes no identity: cached encodings of a record stay valid). Agent
        records are kept by ``SqliteRegistryStore._agent`` already."""
        for name, mine in self.by_agent.items():
            before = old.by_agent.get(name, {})
            for iid, inst in mine.items():
                kept = before.get(iid)
                if kept is not None and kept == inst:
                    mine[iid] = kept

    def instances(self, agent: str | None) -> list[InstanceRecord]:
        if agent is not None:
            return list(self._of(agent))
        return [i for name in sorted(self.by_agent) for i in self._of(name)]

    def _of(self, agent: str) -> list[InstanceRecord]:
        ordered = self._ordered.get(agent)
        if ordered is None:
            mine = self.by_agent.get(agent, {}).values()
            ordered = sorted(mine, key=_order)
            self._ordered[agent] = ordered
        return ordered

    def agent_list(self) -> list[AgentRecord]:
        if self._agent_list is None:
            self._agent_list = [self.agents[name] for name in sorted(self.agents)]
        return list(self._agent_list)


class SqliteRegistryStore:
    """``RegistryStore`` over a ``Database``. ``await SqliteRegistryStore.open(path)``."""

    def __init__(self, db: Database, *, owns_db: bool = True) -> None:
        self._db = db
        self._owns_db = owns_db
        # name -> (card JSON, updated_at, the record derived from them). Deriving parses the
        # card (~0.4 ms) and every heartbeat answer and every lookup reads agents: a row
        # unchanged since its last read gives the same record.
        self._records: dict[str, tuple[str, float, AgentRecord]] = {}
        # What reads answer from, once loaded (``_load``); None: every read asks the database.
        self._view: _View | None = None
        #: Lookups (instances/agents/agent) the database answered, not the view (tests).
        self.lookup_reads = 0
        #: Full reloads of the view from the database (open, periodic, after a reconnect).
        self.reloads = 0
        # On PostgreSQL: the channel this store's writes notify, its LISTEN connection, the
        # instances other writes touched (agent -> ids) not read again yet, and the task that
        # reads them (and reloads every refresh_s).
        self._channel: str | None = None
        # Signs over the payload alone (one channel): as notifications were signed before.
        self._signer = NotifySigner(b"", bind_channel=False)
        self._listener: PgListener | None = None
        self._touched: dict[str, set[str]] = {}
        self._reload_due = False
        self._wake = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None

    async def _load(self) -> None:
        """Read every instance and agent into the view; reads answer from it from now on."""
        instances = await self._read_instances(None)
        agents = await self._read_agents()
        view = _View(instances, agents)
        if self._view is not None:
            view.same_as(self._view)
        self._view = view
        self.reloads += 1

    def _tell(self, conn: sqlite3.Connection, agent: str, ids: Collection[str]) -> None:
        """On PostgreSQL, tell every replica (this one too) that ``ids`` of ``agent`` changed:
        delivered when this write commits."""
        if self._channel is None:
            return
        payload = json.dumps({"a": agent, "i": sorted(ids)})
        if len(payload.encode()) + MAC_CHARS > _MAX_PAYLOAD:
            payload = json.dumps({"reload": True})
        conn.execute(
            "select pg_notify(?, ?)", (self._channel, self._signer.sign(self._channel, payload))
        )

    def _heard(self, message: str) -> None:
        """A notification of ``CHANNEL``: read what it names again, soon (``_follow_db``)."""
        payload = self._signer.verify(CHANNEL, message)
        if payload is None:
            return
        try:
            said = json.loads(payload)
            if said.get("reload"):
                self._reload_due = True
            else:
                self._touched.setdefault(str(said["a"]), set()).update(map(str, said["i"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("a registry notification that is not ours: %.100r", payload)
            return
        self._wake.set()

    def _must_reload(self) -> None:
        self._reload_due = True
        self._wake.set()

    async def _follow_db(self, refresh_s: float) -> None:
        """Apply other replicas' writes to the view as they are heard, and reload it whole
        every ``refresh_s`` (and after the LISTEN connection came back)."""
        loop = asyncio.get_running_loop()
        next_reload = loop.time() + refresh_s
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_reload - loop.time())):
                    await self._wake.wait()
            self._wake.clear()
            if loop.time() >= next_reload:
                self._reload_due = True
            try:
                if self._reload_due:
                    self._reload_due = False
                    self._touched.clear()
                    await self._load()
                    next_reload = loop.time() + refresh_s
                elif self._touched:
                    touched, self._touched = self._touched, {}
                    await self._refresh(touched)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the next reload tries again
                log.warning("could not read other replicas' writes: %s", exc)
                next_reload = loop.time() + min(refresh_s, 1.0)

    async def _refresh(self, touched: dict[str, set[str]]) -> None:
        """Read ``touched`` instances and their agents again, into the view."""

        def read(conn: sqlite3.Connection) -> list[tuple[str, list[sqlite3.Row], sqlite3.Row]]:
            out = []
            for agent, ids in touched.items():
                marks = ", ".join("?" * len(ids))
                rows = conn.execute(
                    f"select {_COLUMNS} from registry_instances where instance_id in ({marks})",
                    tuple(ids),
                ).fetchall()
                card = conn.execute(f"{_SELECT_AGENTS} where name = ?", (agent,)).fetchone()
                out.append((agent, rows, card))
            return out

        found = await self._db.read(read)
        view = self._view
        if view is None:
            return
        for agent, rows, card in found:
            present = {row["instance_id"]: _instance(row) for row in rows}
            for iid in touched[agent]:
                inst = present.get(iid)
                if inst is None:
                    view.drop_id(agent, iid)
                elif inst.agent != agent:  # not ours to place: the next reload will
                    self._reload_due = True
                else:
                    view.put(inst)
            if card is not None and agent in view.by_agent:
                view.set_agent(self._agent(card))

    async def _write(self, fn: Callable[[sqlite3.Connection], T], seen: Callable[[T], None]) -> T:
        """``db.write(fn)``, then ``seen(result)`` changes the view once it is committed. Done
        as the write completes, in commit order, even if the caller is cancelled meanwhile
        (the write goes on: the view must not miss it)."""
        write = asyncio.ensure_future(self._db.write(fn))
        if self._view is not None:
            write.add_done_callback(
                lambda done: None if done.cancelled() or done.exception() else seen(done.result())
            )
        return await asyncio.shield(write)

    def _agent(self, row: sqlite3.Row) -> AgentRecord:
        name, card, updated_at = row["name"], row["card"], row["updated_at"]
        known = self._records.get(name)
        if known is not None and known[0] == card and known[1] == updated_at:
            return known[2]
        record = _agent(row)
        self._records[name] = (card, updated_at, record)
        return record

    @classmethod
    async def open(cls, path: str | Path) -> SqliteRegistryStore:
        db = await Database.open(path)
        await db.ensure_schema("registry", _SCHEMA)
        dropped = await db.write(_migrate)
        if dropped:
            log.warning(
                "%s predates instance secrets: dropped its %d instances (their nodes register "
                "again on their next heartbeat)",
                path,
                dropped,
            )
        store = cls(db)
        await store._load()
        return store

    @classmethod
    async def open_postgres(cls, url: str, *, refresh_s: float = REFRESH_S) -> SqliteRegistryStore:
        """The same store on PostgreSQL (``mesh._pg``), shared by registry replicas: its
        tables are created at their current shape, so there is nothing to migrate. Reads
        answer from the view, kept current with every replica's writes (module docstring):
        its LISTEN connection is opened here and closed by ``aclose``."""
        from mesh._pg import PgDatabase
        from mesh._pg_notify import PgListener

        db = await PgDatabase.open(url)
        store = cls(db)
        listener = PgListener(url, name="mesh-registry-listen")
        listener.on(CHANNEL, store._heard)
        listener.on_reconnect(store._must_reload)
        try:
            await db.ensure_schema("registry", _SCHEMA)
            await db.migrate("registry_notify", [key_schema(_KEY_TABLE)])
            store._signer = NotifySigner(await shared_key(db, _KEY_TABLE), bind_channel=False)
            # Listening before the load: a write committed after it is heard.
            await listener.start()
            store._listener = listener
            store._channel = CHANNEL
            await store._load()
        except BaseException:
            await listener.aclose()
            await db.aclose()
            raise
        store._follower = asyncio.create_task(
            store._follow_db(refresh_s), name="registry-view-follower"
        )
        return store

    async def put(
        self,
        agent: AgentRecord,
        instance: InstanceRecord,
        *,
        secret_hash: str,
        presented: str | None,
        supersede: Collection[str] = (),
        max_instances: int | None = None,
    ) -> Registered:
        def write(conn: sqlite3.Connection) -> Registered:
            known = _claim(conn, instance.instance_id, presented, agent=instance.agent)
            # One instance per (agent, URL): another id there is the same process restarted
            # (or replaced), so its record is a ghost, once the caller proved it.
            others = (instance.agent, instance.url, instance.instance_id)
            superseded = tuple(
                _instance(r)
                for r in conn.execute(
                    f"select {_COLUMNS} from registry_instances "
                    "where agent = ? and url = ? and instance_id != ?",
                    others,
                )
            )
            check_supersede(superseded, supersede)
            if not known and max_instances is not None:
                (stored,) = conn.execute("select count(*) from registry_instances").fetchone()
                check_room(stored, len(superseded), max_instances)
            if superseded:
                conn.execute(
                    "delete from registry_instances where agent = ? and url = ? "
                    "and instance_id != ?",
                    others,
                )
            conn.execute(
                "insert into registry_agents (name, card, updated_at) values (?, ?, ?) "
                "on conflict(name) do update set card = excluded.card, "
                "updated_at = excluded.updated_at",
                (agent.name, json.dumps(agent.card), agent.updated_at),
            )
            # A known id keeps its owner and registered_at.
            conn.execute(
                f"insert into registry_instances ({_COLUMNS}, secret_hash) "
                "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "on conflict(instance_id) do update set "
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
                    secret_hash,
                ),
            )
            conn.execute(_DROP_ORPHANS)
            row = conn.execute(
                f"select {_COLUMNS} from registry_instances where instance_id = ?",
                (instance.instance_id,),
            ).fetchone()
            ids = [instance.instance_id, *(old.instance_id for old in superseded)]
            self._tell(conn, instance.agent, ids)
            return Registered(_instance(row), created=not known, superseded=superseded)

        def seen(done: Registered) -> None:
            assert self._view is not None
            for old in done.superseded:
                self._view.drop(old)
            self._view.set_agent(agent)
            self._view.put(done.instance)

        return await self._write(write, seen)

    async def heartbeat(
        self, instance_id: str, at: float, *, presented: str | None
    ) -> InstanceRecord | None:
        def write(conn: sqlite3.Connection) -> InstanceRecord | None:
            # One statement; a writer who does not own the instance raises below, and its
            # savepoint undoes the update (``mesh._sqlite``).
            row = conn.execute(
                "update registry_instances set last_heartbeat_at = ? where instance_id = ? "
                f"returning agent, secret_hash, {_COLUMNS}",
                (at, instance_id),
            ).fetchone()
            if row is None:
                return None
            check_owner(instance_id, row["agent"], row["secret_hash"], presented)
            return _instance(row)

        return await self._write(write, self._seen)

    def _seen(self, inst: InstanceRecord | None) -> None:
        if inst is not None and self._view is not None:
            self._view.put(inst)

    def _gone(self, inst: InstanceRecord | None) -> None:
        if inst is not None and self._view is not None:
            self._view.drop(inst)

    async def deregister(self, instance_id: str, *, presented: str | None) -> InstanceRecord | None:
        def write(conn: sqlite3.Connection) -> InstanceRecord | None:
            if not _claim(conn, instance_id, presented):
                return None
            return self._removed(conn, instance_id)

        return await self._write(write, self._gone)

    async def set_status(self, instance_id: str, status: Status, reason: str, at: float) -> None:
        def write(conn: sqlite3.Connection) -> InstanceRecord | None:
            row = conn.execute(
                "update registry_instances set status = ?, status_reason = ?, "
                f"status_changed_at = ? where instance_id = ? returning {_COLUMNS}",
                (status, reason, at, instance_id),
            ).fetchone()
            if row is None:
                return None
            self._tell(conn, row["agent"], [instance_id])
            return _instance(row)

        await self._write(write, self._seen)

    async def remove(self, instance_id: str) -> InstanceRecord | None:
        return await self._write(lambda conn: self._removed(conn, instance_id), self._gone)

    def _removed(self, conn: sqlite3.Connection, instance_id: str) -> InstanceRecord | None:
        gone = _remove(conn, instance_id)
        if gone is not None:
            self._tell(conn, gone.agent, [instance_id])
        return gone

    async def instances(self, agent: str | None = None) -> list[InstanceRecord]:
        if self._view is not None:
            return self._view.instances(agent)
        self.lookup_reads += 1
        return await self._read_instances(agent)

    async def _read_instances(self, agent: str | None) -> list[InstanceRecord]:
        query = f"select {_COLUMNS} from registry_instances"
        params: tuple[str, ...] = ()
        if agent is not None:
            query += " where agent = ?"
            params = (agent,)
        query += " order by agent, url, instance_id"
        rows = await self._db.read(lambda conn: conn.execute(query, params).fetchall())
        return [_instance(r) for r in rows]

    async def agents(self) -> list[AgentRecord]:
        if self._view is not None:
            return self._view.agent_list()
        self.lookup_reads += 1
        return await self._read_agents()

    async def _read_agents(self) -> list[AgentRecord]:
        rows = await self._db.read(
            lambda conn: conn.execute(f"{_SELECT_AGENTS} order by name").fetchall()
        )
        # Only agents that exist keep a derived record.
        for gone in self._records.keys() - {r["name"] for r in rows}:
            del self._records[gone]
        return [self._agent(r) for r in rows]

    async def agent(self, name: str) -> AgentRecord | None:
        if self._view is not None:
            return self._view.agents.get(name)
        self.lookup_reads += 1
        row = await self._db.read(
            lambda conn: conn.execute(f"{_SELECT_AGENTS} where name = ?", (name,)).fetchone()
        )
        return self._agent(row) if row else None

    async def ping(self) -> None:
        """Raise ``StoreError`` when the database cannot be read (for ``/health``)."""
        await self._db.ping()

    async def aclose(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._listener is not None:
            await self._listener.aclose()
            self._listener = None
        if self._owns_db:
            await self._db.aclose()
