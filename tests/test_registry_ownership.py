"""An instance belongs to whoever registered it: the registration answer's secret is needed to
heartbeat, re-register or deregister it, and its id never moves to another agent. Real registry
processes, real echo nodes serving the cards, the real ``RegistryBackend``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh._discovery.base import Registration
from mesh._discovery.registry_client import RegistryBackend
from tests.registry_support import (
    Service,
    flood_node,
    instances,
    registry,
    start_bureau,
    start_node,
)
from tests.support import free_port, wait_for, wait_until_ok

pytestmark = pytest.mark.integration

SECRET = "Mesh-Instance-Secret"


# Longer than any test here: no probe round while these tests run (see ``cards``).
_NO_PROBES = 3600.0


@pytest.fixture
def cards(tmp_path: Path) -> Iterator[dict[str, Service]]:
    """Two echo nodes that serve cards for 'victim' and 'mallory' but register nowhere.

    Their ``/health`` names their own instance ids, so a registry that probes them removes the
    made-up ids registered here as ghosts: the tests using them run their registry with
    ``_NO_PROBES`` (under load a probe landed mid-test and the instance vanished)."""
    nodes = {name: start_node(tmp_path, None, name=name) for name in ("victim", "mallory")}
    try:
        for node in nodes.values():
            wait_until_ok(f"{node.url}/health", proc=node.proc)
        yield nodes
    finally:
        for node in nodes.values():
            node.proc.terminate()


def _register(
    reg: str, iid: str, agent: str, url: str, *, secret: str | None = None, token: str | None = None
) -> httpx.Response:
    headers = {SECRET: secret} if secret else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = {"instance_id": iid, "agent": agent, "url": url}
    return httpx.post(f"{reg}/v1/instances", json=body, headers=headers, timeout=10)


def _write(method: str, url: str, **headers: str) -> httpx.Response:
    return httpx.request(method, url, headers=headers, timeout=10)


def test_an_instance_cannot_be_taken_over_or_removed_by_someone_else(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        victim = start_node(tmp_path, reg.url, name="victim", instance_id="victim-1")
        mallory = start_node(tmp_path, None, name="mallory")
        with victim.proc, mallory.proc:
            (before,) = wait_for(lambda: instances(reg.url), what="victim registered")
            wait_until_ok(f"{mallory.url}/health", proc=mallory.proc)

            # Another agent name on the victim's id: 409, nothing replaced.
            r = _register(reg.url, "victim-1", "mallory", mallory.url)
            assert r.status_code == 409, r.text
            assert r.json()["error"] == "instance_conflict"
            assert "registered to agent 'victim'" in r.json()["message"]
            # The same agent name without the secret: 403, saying what to send.
            r = _register(reg.url, "victim-1", "victim", victim.url)
            assert r.status_code == 403
            assert r.json()["error"] == "not_owner"
            assert SECRET in r.json()["message"]
            # Anonymous heartbeat and DELETE: 403, the instance stays.
            inst = f"{reg.url}/v1/instances/victim-1"
            assert _write("PUT", f"{inst}/heartbeat").status_code == 403
            assert _write("DELETE", inst).status_code == 403
            r = _write("DELETE", inst, **{SECRET: "guessed"})
            assert r.status_code == 403
            assert "wrong" in r.json()["message"]

            (after,) = instances(reg.url, status="any")
            assert (after["agent"], after["url"]) == ("victim", victim.url)
            assert after["registered_at"] == before["registered_at"]
            assert [a["name"] for a in httpx.get(f"{reg.url}/v1/agents").json()["agents"]] == [
                "victim"
            ]
            # The victim's own heartbeats (sent with its secret) still land.
            wait_for(
                lambda: instances(reg.url)[0]["last_heartbeat_at"] > after["last_heartbeat_at"],
                what="the victim's next heartbeat",
            )
            assert "not own" not in victim.proc.output()


def test_the_owner_heartbeats_re_registers_and_deregisters_with_its_secret(
    tmp_path: Path, cards: dict[str, Service]
) -> None:
    url = cards["victim"].url
    with registry(tmp_path, probe_interval=_NO_PROBES) as reg:
        created = _register(reg.url, "v-1", "victim", url)
        assert created.status_code == 201, created.text
        secret = created.json()["secret"]
        assert len(secret) >= 40
        inst = f"{reg.url}/v1/instances/v-1"
        assert _write("PUT", f"{inst}/heartbeat", **{SECRET: secret}).status_code == 200
        again = _register(reg.url, "v-1", "victim", url, secret=secret)
        assert again.status_code == 201
        assert again.json()["secret"] == secret
        assert again.json()["registered_at"] == created.json()["registered_at"]
        # A new id gets a new secret; one secret owns one instance only.
        other = _register(reg.url, "m-1", "mallory", cards["mallory"].url)
        assert other.status_code == 201
        assert other.json()["secret"] != secret
        m1 = f"{reg.url}/v1/instances/m-1"
        assert _write("DELETE", m1, **{SECRET: secret}).status_code == 403
        assert {i["instance_id"] for i in instances(reg.url)} == {"v-1", "m-1"}
        assert _write("DELETE", inst, **{SECRET: secret}).status_code == 204
        assert [i["instance_id"] for i in instances(reg.url)] == ["m-1"]
        assert _write("DELETE", inst).status_code == 204  # unknown now: idempotent
        # A first registration may propose its secret (so that sending it again after a lost
        # answer still owns the instance); a short proposal is not taken.
        proposed = "p" * 43
        mine = _register(reg.url, "v-3", "victim", url, secret=proposed)
        assert mine.json()["secret"] == proposed
        assert _register(reg.url, "v-3", "victim", url, secret=proposed).status_code == 201
        v3 = f"{reg.url}/v1/instances/v-3"
        assert _write("DELETE", v3, **{SECRET: proposed}).status_code == 204
        short = _register(reg.url, "v-4", "victim", url, secret="short")
        assert short.status_code == 201
        assert short.json()["secret"] != "short"
        # The secret is never stored or shown in clear.
        listed = httpx.get(f"{reg.url}/v1/instances", params={"status": "any"}).text
        assert secret not in listed
        assert secret.encode() not in (tmp_path / "registry" / "registry.db").read_bytes()
        assert secret not in reg.proc.output()


def test_with_a_token_writes_need_the_token_and_the_secret(
    tmp_path: Path, cards: dict[str, Service]
) -> None:
    url = cards["victim"].url
    with registry(tmp_path, token="s3cret", probe_interval=_NO_PROBES) as reg:
        created = _register(reg.url, "v-1", "victim", url, token="s3cret")
        assert created.status_code == 201, created.text
        secret = created.json()["secret"]
        beat = f"{reg.url}/v1/instances/v-1/heartbeat"
        assert _write("PUT", beat, **{SECRET: secret}).status_code == 401
        assert _write("PUT", beat, Authorization="Bearer s3cret").status_code == 403
        ok = _write("PUT", beat, Authorization="Bearer s3cret", **{SECRET: secret})
        assert ok.status_code == 200


async def test_the_backend_keeps_the_secret_and_registers_anew_when_forgotten(
    tmp_path: Path, cards: dict[str, Service]
) -> None:
    url = cards["victim"].url
    port = free_port()
    registration = Registration(instance_id="v-1", agent="victim", url=url, version="1")
    backend = RegistryBackend(f"http://127.0.0.1:{port}")
    try:
        with registry(tmp_path, port=port, data_dir=tmp_path / "one", probe_interval=_NO_PROBES):
            await backend.register(registration)
            await backend.heartbeat("v-1")
            await backend.register(registration)  # re-registration: sends its secret
            await backend.heartbeat("v-1")
        # A registry that never heard of v-1: 404, then a registration with a new secret.
        with registry(
            tmp_path, port=port, data_dir=tmp_path / "two", name="r2", probe_interval=_NO_PROBES
        ) as reg:
            with pytest.raises(Exception, match="does not know v-1"):
                await backend.heartbeat("v-1")
            await backend.register(registration)
            await backend.heartbeat("v-1")
            await backend.deregister("v-1")
            assert instances(reg.url, status="any") == []
    finally:
        await backend.aclose()


def _openapi_write_params(spec: dict[str, Any]) -> set[str]:
    params = set()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                if p["in"] == "header":
                    params.add(f"{method.upper()} {path} {p['name']}")
    return params


def test_openapi_names_the_secret_header(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        spec = httpx.get(f"{reg.url}/openapi.json").json()
    assert _openapi_write_params(spec) == {
        f"POST /v1/instances {SECRET}",
        f"PUT /v1/instances/{{instance_id}}/heartbeat {SECRET}",
        f"DELETE /v1/instances/{{instance_id}} {SECRET}",
    }
    post = spec["paths"]["/v1/instances"]["post"]
    assert "409" in post["responses"]
    schema = post["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    assert "secret" in spec["components"]["schemas"][schema.rsplit("/", 1)[-1]]["properties"]


def test_a_live_instance_cannot_be_evicted_by_registering_its_url(tmp_path: Path) -> None:
    """The two-request takeover (no server needed): register the victim's URL under a new id,
    which used to supersede (remove) the victim, then register the victim's id with a secret
    of one's own. And its variant: move an id one owns onto the victim's URL. The registry
    supersedes only when the URL's /health names the registering id."""
    # No probes: x-1 at the decoy's URL is a ghost to the prober (the decoy's /health names
    # 'decoy'), and a probe round mid-test would remove it; this is about registration.
    with registry(tmp_path, probe_interval=_NO_PROBES) as reg:
        victim = start_node(tmp_path, reg.url, name="victim", instance_id="victim-1")
        # Mallory serves a card named 'victim' at a URL of its own.
        decoy = start_node(tmp_path, None, name="victim", instance_id="decoy")
        with victim.proc, decoy.proc:
            wait_for(lambda: instances(reg.url), what="victim registered")
            wait_until_ok(f"{decoy.url}/health", proc=decoy.proc)
            mine = "A" * 43

            r = _register(reg.url, "evict-3", "victim", victim.url)
            assert r.status_code == 409, r.text
            assert r.json()["error"] == "url_taken"
            assert "'victim-1'" in r.json()["message"]
            assert "does not answer as instance 'evict-3'" in r.json()["message"]
            r = _register(reg.url, "victim-1", "victim", victim.url, secret=mine)
            assert r.status_code == 403
            beat = f"{reg.url}/v1/instances/victim-1/heartbeat"
            assert _write("PUT", beat, **{SECRET: mine}).status_code == 403

            # Squatting: an id Mallory owns, registered at her URL, then moved onto the victim's.
            assert _register(reg.url, "x-1", "victim", decoy.url, secret=mine).status_code == 201
            r = _register(reg.url, "x-1", "victim", victim.url, secret=mine)
            assert r.status_code == 409, r.text
            assert r.json()["error"] == "url_taken"

            listed = {(i["instance_id"], i["url"]) for i in instances(reg.url, status="any")}
            assert listed == {("victim-1", victim.url), ("x-1", decoy.url)}
            assert "superseded" not in reg.proc.output()


def test_a_restarted_node_at_its_url_still_replaces_its_old_instance(tmp_path: Path) -> None:
    """The legitimate supersede: a new process at the same URL whose /health names its new id."""
    port = free_port()
    # Probes far apart: the prober's ghost rule (which would also remove echo-a once echo-b
    # answers at its URL) must not get there first; this is about the registration itself.
    with registry(tmp_path, probe_interval=60) as reg:
        first = start_node(tmp_path, reg.url, name="echo", port=port, instance_id="echo-a")
        with first.proc:
            wait_for(lambda: instances(reg.url), what="first registered")
            first.proc.kill()
        second = start_node(tmp_path, reg.url, name="echo", port=port, instance_id="echo-b")
        with second.proc:
            wait_for(
                lambda: [i["instance_id"] for i in instances(reg.url, status="any")] == ["echo-b"],
                what="echo-b in place of echo-a",
            )
            assert "echo-a (http" in reg.proc.output()
            assert "superseded by echo-b" in reg.proc.output()


def test_a_node_whose_id_was_taken_while_it_was_away_registers_under_a_new_one(
    tmp_path: Path,
) -> None:
    """A real node is frozen (SIGSTOP) until the registry removes it; meanwhile someone else
    registers its instance id. Back, its heartbeat is refused not_owner: it must take a new id
    (shown in /health and /introspect) and register again, not retry the taken one forever."""
    with registry(tmp_path, probe_interval=0.3, remove_after=0.5) as reg:
        bureau = start_bureau(tmp_path, reg.url)
        # Somewhere else serving a credit-bureau card, whose /health names no instance (so the
        # prober does not take the id it registers there for a ghost).
        squatter = flood_node(tmp_path, name="credit-bureau")
        elsewhere = f"{squatter.url}/i/0"
        with bureau.proc, squatter.proc:
            (old,) = wait_for(lambda: instances(reg.url), timeout=30, what="bureau registered")
            os.kill(bureau.proc.pid, signal.SIGSTOP)
            try:
                wait_for(
                    lambda: not instances(reg.url, status="any"), what="the frozen node removed"
                )
                taken = _register(
                    reg.url, old["instance_id"], "credit-bureau", elsewhere, secret="M" * 43
                )
                assert taken.status_code == 201, taken.text
            finally:
                os.kill(bureau.proc.pid, signal.SIGCONT)

            def renamed() -> str | None:
                now = httpx.get(f"{bureau.url}/health", timeout=5).json()["instance_id"]
                listed = {i["instance_id"]: i["url"] for i in instances(reg.url)}
                return now if now != old["instance_id"] and listed.get(now) == bureau.url else None

            new_id = wait_for(renamed, timeout=20, what="the node registered under a new id")
            runtime = httpx.get(f"{bureau.url}/introspect", timeout=5).json()["runtime"]
            assert runtime["instance_id"] == new_id
            # The taken id stays with whoever holds it now.
            assert {i["instance_id"]: i["url"] for i in instances(reg.url)} == {
                new_id: bureau.url,
                old["instance_id"]: elsewhere,
            }
            (line,) = [x for x in bureau.proc.output().splitlines() if "given to someone else" in x]
            assert old["instance_id"] in line
            assert new_id in line
