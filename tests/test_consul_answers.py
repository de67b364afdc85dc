"""ConsulBackend against Consul's behaviour beyond the happy path (issue 20): a cluster without a
leader, an agent restarting, ACLs, rate limits, blocking-query indexes that go backwards or to
zero, a churning query, a catalog shared with other services, a service held by another agent.
Each answer is the one a Consul agent sends (tests/fixtures/consul/README.md says where each
comes from), served by tests/fakes/consul_server.py to the real py-consul client."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from mesh._discovery.base import UnknownInstance
from mesh._discovery.consul import ConsulBackend, ConsulCheck, go_wait, next_index
from mesh._errors import ConfigError, DiscoveryError
from tests.fakes.consul_server import FakeConsul
from tests.support import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def consul() -> Iterator[FakeConsul]:
    with FakeConsul() as fake:
        yield fake


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _health_queries(consul: FakeConsul, name: str = "credit-bureau") -> list[dict[str, str]]:
    return [q for path, q in list(consul.queries) if path == f"/v1/health/service/{name}"]


# -- leader loss and agent restarts ---------------------------------------------------------------


async def test_a_cluster_without_a_leader_still_answers_lookups(consul: FakeConsul) -> None:
    consul.leader = False
    # What Consul answers a default-consistency read while its servers elect a leader.
    async with httpx.AsyncClient(trust_env=False) as http:
        plain = await http.get(f"http://127.0.0.1:{consul.port}/v1/health/service/credit-bureau")
    assert (plain.status_code, plain.text) == (500, "No cluster leader")
    backend = ConsulBackend(consul.address, wait_s=1.0)
    try:
        found = await backend.find(agent="credit-bureau")
        assert [i.instance_id for i in found] == ["credit-bureau-7f3a"]
        assert [i.instance_id for i in await backend.find(skill="score")] == ["credit-bureau-7f3a"]
        assert all("stale" in q for q in _health_queries(consul)[1:]), "all but the plain GET"
        # The watch goes on too: a check turning critical still reaches the lookups.
        consul.set_status("credit-bureau-7f3a", "critical")
        await eventually(lambda: _no_passing(backend), what="the change through the watch")
        with pytest.raises(DiscoveryError, match="no cluster leader"):
            await backend.ping()
    finally:
        await backend.aclose()


async def _no_passing(backend: ConsulBackend) -> bool:
    return await backend.find(agent="credit-bureau") == []


async def test_while_the_agent_restarts_the_last_answer_stands_for_a_bounded_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mesh._discovery.consul")
    clock = Clock()
    consul = FakeConsul().start()
    port = consul.port
    backend = ConsulBackend(consul.address, wait_s=1.0, max_stale_s=60.0, clock=clock)
    try:
        assert len(await backend.find(agent="credit-bureau")) == 1
        consul.stop()  # connection refused from now on
        await eventually(lambda: "failed (1 in a row)" in caplog.text, what="the watch failing")
        clock.now += 10.0  # past what a live watch would have delivered
        assert [i.instance_id for i in await backend.find(agent="credit-bureau")] == [
            "credit-bureau-7f3a"
        ]
        assert "consul: serving the answer of 10s ago" in caplog.text
        clock.now += 60.0  # past max_stale_s
        with pytest.raises(DiscoveryError, match=r"is the Consul agent running"):
            await backend.find(agent="credit-bureau")
        with FakeConsul(port=port, recorded_services=False):  # back, without the service
            assert await backend.find(agent="credit-bureau") == []
    finally:
        await backend.aclose()
        consul.stop()


# -- ACLs and rate limits -------------------------------------------------------------------------


async def test_acl_refusals_name_the_token_to_set(
    consul: FakeConsul, monkeypatch: pytest.MonkeyPatch
) -> None:
    consul.acl_token = "s3cret"
    for token, said in ((None, "lacks permission 'service:read'"), ("wrong", "ACL not found")):
        backend = ConsulBackend(consul.address, token=token)
        try:
            with pytest.raises(
                DiscoveryError, match=f"permission denied.*{said}.*CONSUL_HTTP_TOKEN"
            ):
                await backend.find(agent="credit-bureau")
        finally:
            await backend.aclose()
    # A backend built without a token uses CONSUL_HTTP_TOKEN, as py-consul and Consul's CLI do
    # (token=None overwrote it with nothing before); a given token wins over it.
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "s3cret")
    backend = ConsulBackend(consul.address)
    try:
        assert len(await backend.find(agent="credit-bureau")) == 1
    finally:
        await backend.aclose()
    backend = ConsulBackend(consul.address, token="wrong")
    try:
        with pytest.raises(DiscoveryError, match="ACL not found"):
            await backend.find(agent="credit-bureau")
    finally:
        await backend.aclose()


async def test_a_rate_limited_read_says_so_and_the_last_answer_stands(consul: FakeConsul) -> None:
    clock = Clock()
    backend = ConsulBackend(consul.address, wait_s=1.0, clock=clock)
    fresh = ConsulBackend(consul.address)
    try:
        assert len(await backend.find(agent="credit-bureau")) == 1
        consul.rate_limited = True
        with pytest.raises(DiscoveryError, match=r"limiting the rate of requests.*429"):
            await fresh.find(agent="credit-bureau")
        clock.now += 10.0
        assert len(await backend.find(agent="credit-bureau")) == 1
    finally:
        await backend.aclose()
        await fresh.aclose()


# -- blocking queries -----------------------------------------------------------------------------


def test_the_next_index_follows_consul_s_rules() -> None:
    assert next_index(None, "42") == "42"
    assert next_index("42", "43") == "43"
    assert next_index("42", "42") == "42"
    assert next_index("42", "7") == "0", "backwards: restart the loop"
    assert next_index("42", "0") == "1", "0 would not block: the watch would spin"
    assert next_index(None, "-3") == "1"
    assert next_index("42", None) == "0"
    assert go_wait(30.0) == "30000ms"
    assert go_wait(0.5) == "500ms", "'0s' is Consul's default wait of five minutes"


async def test_an_index_at_zero_does_not_make_the_watch_spin(consul: FakeConsul) -> None:
    consul.set_index(0)  # the Consul bug the blocking-query docs warn about
    backend = ConsulBackend(consul.address, wait_s=1.0, min_interval_s=0.0)
    try:
        await backend.find(agent="credit-bureau")
        started = time.monotonic()
        await eventually(lambda: any(q.get("index") == "1" for q in _health_queries(consul)))
        await eventually(lambda: time.monotonic() - started >= 1.5, what="a second and a half")
        blocking = [q for q in _health_queries(consul) if "index" in q]
        # One blocking query per wait (1 s), not a request loop answered at once.
        assert 1 <= len(blocking) <= 4, blocking
        assert {q["index"] for q in blocking} == {"1"}
        assert {q["wait"] for q in blocking} == {"1000ms"}
    finally:
        await backend.aclose()


async def test_an_index_that_goes_backwards_restarts_the_watch(consul: FakeConsul) -> None:
    backend = ConsulBackend(consul.address, wait_s=2.0, min_interval_s=0.0)
    try:
        await backend.find(agent="credit-bureau", passing_only=False)
        await eventually(lambda: any(q.get("index") == "41" for q in _health_queries(consul)))
        consul.set_index(7)  # a snapshot restored on the servers
        await eventually(lambda: any(q.get("index") == "0" for q in _health_queries(consul)))
        consul.set_status("credit-bureau-7f3a", "critical")  # index 8: still followed

        async def critical() -> bool:
            found = await backend.find(agent="credit-bureau", passing_only=False)
            return any(
                i.status == "critical" and i.instance_id == "credit-bureau-7f3a" for i in found
            )

        await eventually(critical, what="the change after the restore")
    finally:
        await backend.aclose()


async def test_a_wait_under_a_second_is_not_sent_as_zero(consul: FakeConsul) -> None:
    backend = ConsulBackend(consul.address, wait_s=0.5)
    try:
        await backend.find(agent="credit-bureau")
        await eventually(lambda: any("index" in q for q in _health_queries(consul)))
        assert {q["wait"] for q in _health_queries(consul) if "index" in q} == {"500ms"}
    finally:
        await backend.aclose()


async def test_a_churning_query_is_watched_at_a_bounded_rate(consul: FakeConsul) -> None:
    backend = ConsulBackend(consul.address, wait_s=5.0, min_interval_s=0.5)
    stop = threading.Event()

    def churn() -> None:  # the check flapping every 10 ms
        flip = False
        while not stop.wait(0.01):
            flip = not flip
            consul.set_status("credit-bureau-7f3a", "passing" if flip else "warning")

    flapper = threading.Thread(target=churn, daemon=True)
    try:
        await backend.find(agent="credit-bureau")
        before = len(_health_queries(consul))
        flapper.start()
        started = time.monotonic()
        await eventually(lambda: time.monotonic() - started >= 2.0, what="two seconds")
        stop.set()
        during = len(_health_queries(consul)) - before
        # At most one request per 0.5 s (plus the one in flight), not one per change (~200).
        assert 2 <= during <= 6, during
    finally:
        stop.set()
        await backend.aclose()


# -- what is watched, and how it is filtered ------------------------------------------------------


async def test_only_mesh_services_are_watched_and_skills_are_filtered(consul: FakeConsul) -> None:
    backend = ConsulBackend(consul.address, wait_s=1.0)
    try:
        everyone = await backend.find(passing_only=False)
        assert sorted(i.instance_id for i in everyone) == ["credit-bureau-7f3a", "credit-bureau-b2"]
        assert all(i.skills == ("score",) for i in everyone), "the marker tag is no skill"
        assert [i.instance_id for i in await backend.find(skill="score")] == ["credit-bureau-7f3a"]
        asked = {path for path, _ in consul.queries if path.startswith("/v1/health/service/")}
        # Not consul itself, not postgres: no watch thread or long poll for them.
        assert asked == {"/v1/health/service/credit-bureau"}
        by_skill = [q for q in _health_queries(consul) if "filter" in q]
        assert by_skill, "find(skill=) filters on Service.Tags"
        assert {q["filter"] for q in by_skill} == {'"score" in Service.Tags'}
        assert not any("tag" in q for q in _health_queries(consul)), "tag= is deprecated"
    finally:
        await backend.aclose()


# -- registration and removal ---------------------------------------------------------------------


def test_consul_check_defaults_to_ten_minutes_and_refuses_less_than_one() -> None:
    assert ConsulCheck().deregister_after == "10m"
    assert ConsulCheck(deregister_after="1m").deregister_after == "1m"
    with pytest.raises(ConfigError, match=r"under Consul's minimum of one minute.*'1m' or more"):
        ConsulCheck(deregister_after="30s")
    with pytest.raises(ConfigError, match="interval='5 seconds' is not a Go duration"):
        ConsulCheck(interval="5 seconds")


async def test_a_service_another_agent_holds_is_not_reported_removed(consul: FakeConsul) -> None:
    # credit-bureau-b2 registered through worker-2's agent: this agent answers 404.
    async with httpx.AsyncClient(trust_env=False) as http:
        plain = await http.put(
            f"http://127.0.0.1:{consul.port}/v1/agent/service/deregister/credit-bureau-b2"
        )
    assert plain.status_code == 404
    assert plain.text.startswith('Unknown service ID "credit-bureau-b2"')
    backend = ConsulBackend(consul.address)
    try:
        with pytest.raises(UnknownInstance, match="does not hold instance 'credit-bureau-b2'"):
            await backend.remove("credit-bureau-b2")
        await backend.deregister("credit-bureau-b2")  # a node stopping: nothing to say
        assert "credit-bureau-b2" in consul.entries
        await backend.remove("credit-bureau-7f3a")
        assert "credit-bureau-7f3a" not in consul.entries
    finally:
        await backend.aclose()


def test_meta_consul_refuses_is_refused_before_sending(consul: FakeConsul) -> None:
    # What Consul answers a registration whose meta value is over 512 characters...
    body = {"Name": "a", "ID": "a-1", "Meta": {"url": "http://a/" + "p" * 600}}
    plain = httpx.put(f"http://127.0.0.1:{consul.port}/v1/agent/service/register", json=body)
    assert plain.status_code == 400
    assert "Value is too long (limit: 512 characters)" in plain.text
