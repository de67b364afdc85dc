"""SqliteRegistryStore, the card validation and the schema table, without processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from registry.card import CardRejected, agent_record
from registry.catalog import Catalog
from registry.schema_view import schema_rows
from registry.sqlite_store import SqliteRegistryStore
from registry.store import (
    AgentRecord,
    InstanceRecord,
    InstanceTaken,
    NotOwner,
    Registered,
    RegistryFull,
    UrlTaken,
    secret_hash,
)


def _card(name: str = "echo", skill: str = "echo") -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} agent",
        "version": "2.0.0",
        "supportedInterfaces": [{"url": "http://127.0.0.1:9", "protocolBinding": "JSONRPC"}],
        "capabilities": {
            "extensions": [
                {
                    "uri": "urn:mesh:skill-schemas:v1",
                    "params": {
                        "skills": {
                            skill: {
                                "input": {
                                    "type": "object",
                                    "properties": {"a": {"type": "string"}},
                                },
                                "output": {"type": "object", "properties": {}},
                            }
                        }
                    },
                }
            ]
        },
        "skills": [
            {"id": skill, "name": skill.title(), "description": "d", "tags": ["t", "x"]},
            {"id": "chat", "name": "Chat", "description": "talk", "tags": ["text"]},
        ],
    }


def _instance(iid: str, agent: str = "echo", at: float = 100.0) -> InstanceRecord:
    return InstanceRecord(
        instance_id=iid,
        agent=agent,
        url=f"http://127.0.0.1:1/{iid}",
        version="2.0.0",
        status_changed_at=at,
        last_heartbeat_at=at,
        registered_at=at,
    )


def test_agent_record_derives_skills_schemas_and_tags() -> None:
    rec = agent_record(_card(), expected_name="echo", now=5.0)
    assert rec.version == "2.0.0"
    assert [s.id for s in rec.skills] == ["echo", "chat"]
    assert rec.skills[0].input_schema == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert rec.skills[1].input_schema is None
    assert rec.tags == ("t", "text", "x")


def test_agent_record_refuses_a_name_mismatch() -> None:
    # The name found ('echo') is the fetched content: it stays in the log, out of the answer.
    with pytest.raises(CardRejected, match="names another agent, not 'b'") as caught:
        agent_record(_card(), expected_name="b", now=0)
    assert "echo" not in str(caught.value)


OWNER = secret_hash("owner-secret")


async def _put(
    store: SqliteRegistryStore,
    agent: AgentRecord,
    inst: InstanceRecord,
    presented: str | None = None,
    *,
    supersede: frozenset[str] = frozenset(),
    max_instances: int | None = None,
) -> Registered:
    return await store.put(
        agent,
        inst,
        secret_hash=OWNER,
        presented=presented,
        supersede=supersede,
        max_instances=max_instances,
    )


async def test_store_round_trip_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    store = await SqliteRegistryStore.open(path)
    rec = agent_record(_card(), expected_name="echo", now=1.0)
    first = await _put(store, rec, _instance("i1", at=100.0))
    again = await _put(store, rec, _instance("i1", at=200.0), presented=OWNER)
    assert (first.created, again.created) == (True, False)
    assert first.instance.registered_at == again.instance.registered_at == 100.0
    assert again.instance.last_heartbeat_at == 200.0
    await _put(store, rec, _instance("i2"))
    beat = await store.heartbeat("i2", 300.0, presented=OWNER)
    assert beat is not None
    assert beat.last_heartbeat_at == 300.0
    assert await store.heartbeat("nope", 1.0, presented=OWNER) is None
    await store.set_status("i2", "critical", "gone", 301.0)
    await store.aclose()

    store = await SqliteRegistryStore.open(path)
    try:
        got = {i.instance_id: i for i in await store.instances()}
        assert set(got) == {"i1", "i2"}
        assert (got["i2"].status, got["i2"].status_reason, got["i2"].status_changed_at) == (
            "critical",
            "gone",
            301.0,
        )
        agent = await store.agent("echo")
        assert agent is not None
        assert agent.skills[0].input_schema is not None
        # The owner survives a restart.
        assert await store.heartbeat("i1", 400.0, presented=OWNER) is not None
        # The agent lives as long as one of its instances.
        assert (await store.remove("i1")) is not None
        assert await store.agent("echo") is not None
        assert await store.deregister("i2", presented=OWNER) is not None
        assert await store.agent("echo") is None
        assert await store.remove("i2") is None
    finally:
        await store.aclose()


async def test_reads_come_from_memory_and_a_card_is_derived_only_when_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every heartbeat answer and every lookup reads the agent: parsing its card each time was
    # a quarter of a heartbeat's CPU. Reads answer from the store's view: the record a
    # registration stored is served as is, and a card is derived from its row only when the
    # store opens (a restart).
    import registry.sqlite_store

    derived: list[str] = []

    def counted(data: dict[str, Any], *, expected_name: str, now: float) -> AgentRecord:
        derived.append(expected_name)
        return agent_record(data, expected_name=expected_name, now=now)

    monkeypatch.setattr(registry.sqlite_store, "agent_record", counted)
    store = await SqliteRegistryStore.open(tmp_path / "r.db")
    try:
        stored = agent_record(_card(), expected_name="echo", now=1.0)
        await _put(store, stored, _instance("i1"))
        for _ in range(3):
            assert await store.agent("echo") is stored
            assert await store.agents() == [stored]
        changed = agent_record(_card(skill="other"), expected_name="echo", now=2.0)
        await _put(store, changed, _instance("i1"), presented=OWNER)
        assert await store.agent("echo") is changed
        assert await store.agents() == [changed]
        assert derived == []
    finally:
        await store.aclose()
    again = await SqliteRegistryStore.open(tmp_path / "r.db")
    try:
        assert await again.agent("echo") == changed
        assert await again.agents() == [changed]
        assert derived == ["echo"]
    finally:
        await again.aclose()


async def test_the_view_follows_every_write_and_matches_the_database(tmp_path: Path) -> None:
    store = await SqliteRegistryStore.open(tmp_path / "r.db")
    a = agent_record(_card("a"), expected_name="a", now=1)
    b = agent_record(_card("b"), expected_name="b", now=2)
    try:
        await _put(store, a, _instance("a2", "a"))
        await _put(store, a, _instance("a1", "a"))
        await _put(store, b, _instance("b1", "b"))
        beat = await store.heartbeat("a1", 200.0, presented=OWNER)
        assert beat is not None
        assert beat.last_heartbeat_at == 200.0
        assert [i.last_heartbeat_at for i in await store.instances("a")] == [200.0, 100.0]
        await store.set_status("a2", "critical", "health check failed: unreachable", 300.0)
        (_, a2) = await store.instances("a")
        assert (a2.status, a2.status_changed_at) == ("critical", 300.0)
        # A refused write changes nothing, in the database or the view.
        with pytest.raises(NotOwner):
            await store.heartbeat("b1", 400.0, presented=secret_hash("not-the-owner"))
        assert await store.heartbeat("nobody", 400.0, presented=OWNER) is None
        await store.deregister("b1", presented=OWNER)
        assert await store.agent("b") is None
        # A heartbeat whose caller is cancelled once it is queued is still committed, and the
        # view still sees it (the write goes on without its caller).
        task = asyncio.create_task(store.heartbeat("a2", 500.0, presented=OWNER))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.set_status("a1", "passing", "health ok", 600.0)  # after it, in commit order
        seen = [(i.instance_id, i.status, i.last_heartbeat_at) for i in await store.instances()]
        assert seen == [("a1", "passing", 200.0), ("a2", "critical", 500.0)]
        view = (await store.instances(), await store.agents())
    finally:
        await store.aclose()
    reopened = await SqliteRegistryStore.open(tmp_path / "r.db")
    try:
        assert (await reopened.instances(), await reopened.agents()) == view
    finally:
        await reopened.aclose()


async def test_an_instance_belongs_to_its_secret_and_its_agent(tmp_path: Path) -> None:
    store = await SqliteRegistryStore.open(tmp_path / "r.db")
    a = agent_record(_card("a"), expected_name="a", now=1)
    b = agent_record(_card("b"), expected_name="b", now=2)
    try:
        await _put(store, a, _instance("i", "a"))
        # Another agent never takes the id, whatever secret it presents.
        for presented in (None, OWNER, secret_hash("x")):
            with pytest.raises(InstanceTaken) as taken:
                await store.put(b, _instance("i", "b"), secret_hash="h2", presented=presented)
            assert taken.value.agent == "a"
        for presented in (None, secret_hash("wrong")):
            with pytest.raises(NotOwner):
                await _put(store, a, _instance("i", "a", at=500.0), presented=presented)
            with pytest.raises(NotOwner):
                await store.heartbeat("i", 500.0, presented=presented)
            with pytest.raises(NotOwner):
                await store.deregister("i", presented=presented)
        (kept,) = await store.instances()
        assert (kept.agent, kept.last_heartbeat_at) == ("a", 100.0)
        assert [x.name for x in await store.agents()] == ["a"]
        assert await store.deregister("unknown", presented=None) is None
    finally:
        await store.aclose()


async def test_a_new_id_at_the_same_url_supersedes_the_old_one_only_when_allowed(
    tmp_path: Path,
) -> None:
    store = await SqliteRegistryStore.open(tmp_path / "r.db")
    a = agent_record(_card("a"), expected_name="a", now=1)
    b = agent_record(_card("b"), expected_name="b", now=1)
    try:
        await _put(store, a, _instance("old", "a").replace(url="http://h:1"))
        await _put(store, b, _instance("other-agent", "b").replace(url="http://h:1"))
        await _put(store, a, _instance("elsewhere", "a").replace(url="http://h:2"))
        # Not proven (the caller names nobody it may supersede): refused, nothing written.
        with pytest.raises(UrlTaken) as taken:
            await _put(store, a, _instance("new", "a").replace(url="http://h:1"))
        assert taken.value.instance.instance_id == "old"
        # Moving a known id onto the URL is the same attempt.
        with pytest.raises(UrlTaken):
            await _put(store, a, _instance("elsewhere", "a").replace(url="http://h:1"), OWNER)
        before = sorted(i.instance_id for i in await store.instances())
        assert before == ["elsewhere", "old", "other-agent"]
        done = await _put(
            store, a, _instance("new", "a").replace(url="http://h:1"), supersede=frozenset({"old"})
        )
        assert [i.instance_id for i in done.superseded] == ["old"]
        left = sorted(i.instance_id for i in await store.instances())
        assert left == ["elsewhere", "new", "other-agent"]
    finally:
        await store.aclose()


async def test_a_full_store_takes_no_new_instance_but_keeps_serving_its_own(
    tmp_path: Path,
) -> None:
    store = await SqliteRegistryStore.open(tmp_path / "r.db")
    a = agent_record(_card("a"), expected_name="a", now=1)
    try:
        for i in range(3):
            inst = _instance(f"i-{i}", "a").replace(url=f"http://h:{i + 1}")
            await _put(store, a, inst, max_instances=3)
        with pytest.raises(RegistryFull):
            await _put(store, a, _instance("i-3", "a").replace(url="http://h:9"), max_instances=3)
        # Re-registering one it holds, and replacing one at its own URL, still work.
        assert not (
            await _put(
                store, a, _instance("i-0", "a").replace(url="http://h:1"), OWNER, max_instances=3
            )
        ).created
        restarted = _instance("i-0b", "a").replace(url="http://h:1")
        done = await _put(store, a, restarted, supersede=frozenset({"i-0"}), max_instances=3)
        assert done.created
        assert len(await store.instances()) == 3
    finally:
        await store.aclose()


async def test_a_database_from_before_secrets_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "create table registry_agents (name text primary key, card text not null, "
            "updated_at real not null);"
            "create table registry_instances (instance_id text primary key, agent text not null,"
            " url text not null, version text not null, status text not null, status_reason "
            "text not null, status_changed_at real not null, last_heartbeat_at real not null, "
            "registered_at real not null);"
        )
        conn.execute(
            "insert into registry_instances values ('i', 'echo', 'http://h:1', '1', "
            "'passing', 'ok', 1, 1, 1)"
        )
        conn.execute("insert into registry_agents values ('echo', ?, 1)", (json.dumps(_card()),))
    store = await SqliteRegistryStore.open(path)
    try:
        # Nobody holds the old rows' secrets: they go, and their nodes register again.
        assert await store.instances() == []
        assert await store.agents() == []
        rec = agent_record(_card(), expected_name="echo", now=1.0)
        assert (await _put(store, rec, _instance("i"))).created
    finally:
        await store.aclose()


async def test_catalog_filters(tmp_path: Path) -> None:
    store = await SqliteRegistryStore.open(tmp_path / "r.db")
    try:
        await _put(
            store, agent_record(_card("a", "score"), expected_name="a", now=1), _instance("1", "a")
        )
        await _put(
            store, agent_record(_card("b", "sum"), expected_name="b", now=1), _instance("2", "b")
        )
        await store.set_status("2", "warning", "503", 5)
        catalog = Catalog(store)
        assert [v.agent.name for v in await catalog.agents(skill="score")] == ["a"]
        assert [v.agent.name for v in await catalog.agents(q="SUM")] == ["b"]
        assert [v.agent.name for v in await catalog.agents(tag="text")] == ["a", "b"]
        assert [i.instance_id for i, _ in await catalog.instances()] == ["1"]
        assert [i.instance_id for i, _ in await catalog.instances(status="any")] == ["1", "2"]
        assert [i.instance_id for i, _ in await catalog.instances(skill="sum", status="any")] == [
            "2"
        ]
        view = await catalog.agent("b")
        assert view is not None
        assert view.passing == 0
        assert len(view.instances) == 1
    finally:
        await store.aclose()


def test_schema_rows_resolve_refs_optionals_and_nesting() -> None:
    schema = {
        "type": "object",
        "properties": {
            "applicant_id": {"type": "string", "description": "Who."},
            "amount": {"type": "number", "exclusiveMinimum": 0.0},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "address": {"$ref": "#/$defs/Address"},
            "kind": {"enum": ["new", "renewal"], "default": "new"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Address"}},
        },
        "required": ["applicant_id", "amount", "address"],
        "$defs": {
            "Address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40.0}},
                "required": ["city"],
            }
        },
    }
    rows = [(r.name, r.type, r.required, r.description) for r in schema_rows(schema)]
    assert rows == [
        ("applicant_id", "string", True, "Who."),
        ("amount", "number, > 0", True, ""),
        ("address", "Address", True, ""),
        ("address.city", "string, max length 40", True, ""),
        ("note", "string | null", False, ""),
        ("kind", "one of: new, renewal", False, "(default new)"),
        ("items", "array of Address", False, ""),
    ]
    assert schema_rows(None) == []
