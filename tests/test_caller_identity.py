"""Caller identity on every call (issue 16 item 3, and item 6's token half).

A node with keys presents its own short-lived call token (``mesh._identity``: issuer = the
calling agent, audience = the callee, minutes, a unique id, signed with its key and carrying the
root's certificate of it) instead of the shared mesh token, and a node with keys verifies it
against the root. Unit tests pin the refusals; the integration test runs the real loan officer
and credit bureau with keys and no MESH_TOKEN: the delegation works, the bureau names its
caller, and a token taken from a call cannot be used again, at another agent, or expired.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import pytest

from mesh._a2a import jsonrpc
from mesh._a2a.client import A2APeer
from mesh._errors import PeerRefused
from mesh._identity import PRINCIPAL, CallerCheck, CallerIdentity
from mesh._keys import AgentKeys, TrustRoot, init_mesh, issue_agent
from tests.registry_support import registry
from tests.support import BUREAU_SCORES, clean_env, eventually, free_port, running

USER_TOKEN = "identity-user-token-93ab"


@dataclass
class Keys:
    officer: AgentKeys
    foreign: AgentKeys
    root: TrustRoot
    bureau_folder: Path
    officer_folder: Path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    tmp = tmp_path_factory.mktemp("keys")
    init_mesh(tmp / "mesh")
    init_mesh(tmp / "other")
    officer = issue_agent(tmp / "mesh", "test-officer")
    return Keys(
        AgentKeys.load(officer, "test-officer"),
        AgentKeys.load(issue_agent(tmp / "other", "test-officer"), "test-officer"),
        TrustRoot.load(tmp / "mesh"),
        issue_agent(tmp / "mesh", "credit-bureau"),
        officer,
    )


def test_a_call_token_names_its_caller_once_for_one_callee(keys: Keys) -> None:
    mint = CallerIdentity(keys.officer)
    check = CallerCheck(keys.root, "credit-bureau")
    token = mint.token("credit-bureau")
    assert check.verify(token).agent == "test-officer"
    with pytest.raises(PeerRefused, match=r"used before \(replayed\)"):
        check.verify(token)
    with pytest.raises(PeerRefused, match="is for another agent, not 'credit-bureau'"):
        check.verify(mint.token("fx-desk"))
    old = CallerIdentity(keys.officer, clock=lambda: time.time() - 3600)
    with pytest.raises(PeerRefused, match="has expired"):
        check.verify(old.token("credit-bureau"))
    with pytest.raises(PeerRefused, match="another mesh's root"):
        check.verify(CallerIdentity(keys.foreign).token("credit-bureau"))
    with pytest.raises(PeerRefused, match="not a mesh call token"):
        check.verify("a.b.c")


def test_a_token_cannot_claim_another_caller_or_a_long_life(keys: Keys) -> None:
    check = CallerCheck(keys.root, "credit-bureau")
    header = {
        "typ": "mesh-call+jwt",
        "kid": keys.officer.kid,
        "mesh_cert": keys.officer.certificate,
    }
    now = int(time.time())

    def forged(**claims: object) -> str:
        base = {"iss": "test-officer", "aud": "credit-bureau", "iat": now, "exp": now + 60}
        body = {**base, "jti": uuid.uuid4().hex, **claims}
        return jwt.encode(body, keys.officer.key, algorithm="ES256", headers=header)

    with pytest.raises(PeerRefused, match="names 'loan-officer' but is signed by 'test-officer'"):
        check.verify(forged(iss="loan-officer"))
    with pytest.raises(PeerRefused, match="lives longer than"):
        check.verify(forged(exp=now + 86400))
    # Signed by another key than the certificate's: the signature does not verify.
    other = jwt.encode(
        {"iss": "test-officer", "aud": "credit-bureau", "iat": now, "exp": now + 60, "jti": "x"},
        keys.foreign.key,
        algorithm="ES256",
        headers=header,
    )
    with pytest.raises(PeerRefused, match="does not verify"):
        check.verify(other)


@dataclass
class Mesh:
    officer: str
    bureau: str
    bureau_log: Path


@pytest.fixture(scope="module")
def mesh(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    tmp = tmp_path_factory.mktemp("identity")
    with registry(tmp) as reg:
        bport, oport = free_port(), free_port()
        bureau = f"http://127.0.0.1:{bport}"
        officer = f"http://127.0.0.1:{oport}"
        argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(bport)]
        argv += ["--data-dir", str(tmp / "bureau"), "--registry", reg.url]
        argv += ["--keys", str(keys.bureau_folder)]
        with running(argv, name="bureau", tmp=tmp, health=f"{bureau}/health", env=clean_env()):
            # The officer also takes the mesh token: the user calling it here has no agent key.
            # The bureau has none: only a call token opens it.
            env = clean_env(
                MESH_TOKEN=USER_TOKEN,
                MESH_REGISTRY=reg.url,
                MESH_PEER_NETWORKS="127.0.0.1/32",
                MESH_KEYS=str(keys.officer_folder),
            )
            serve = ["mesh", "serve", "tests.trust_agents:officer", "--port", str(oport)]
            serve += ["--data-dir", str(tmp / "officer"), "--grace", "1"]
            with running(serve, name="officer", tmp=tmp, health=f"{officer}/health", env=env):
                yield Mesh(officer, bureau, tmp / "bureau.log")


def _score(bureau: str, token: str | None) -> httpx.Response:
    body = jsonrpc.send_message_body(
        {"applicant_id": "APP-501", "amount": 1000},
        skill="score",
        message_id=uuid.uuid4().hex,
        context_id=None,
        metadata=None,
        wait=True,
        task_id=None,
    )
    headers = dict(jsonrpc.HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(bureau + "/", content=body, headers=headers, timeout=10)


@pytest.mark.integration
async def test_nodes_with_keys_call_each_other_as_themselves(keys: Keys, mesh: Mesh) -> None:
    # The officer (keys, no MESH_TOKEN) delegates to the bureau, which requires a credential.
    headers = {"Authorization": f"Bearer {USER_TOKEN}"}
    async with httpx.AsyncClient(timeout=60, trust_env=False, headers=headers) as http:
        peer = A2APeer(http, mesh.officer)
        try:
            result = await peer.send("score APP-501")
        finally:
            await peer.aclose()
    assert result.ok, result
    assert result.text == f"score {BUREAU_SCORES['APP-501']}"
    # A node with keys is never open: no credential, no call.
    r = _score(mesh.bureau, None)
    assert r.status_code == 401, r.text
    assert "a call token of an agent of this mesh" in r.text
    # A token taken from a call works once, for the callee it names, while it lasts.
    token = CallerIdentity(keys.officer).token("credit-bureau")
    assert _score(mesh.bureau, token).status_code == 200
    replayed = _score(mesh.bureau, token)
    assert replayed.status_code == 401
    assert "used before (replayed)" in replayed.text
    elsewhere = _score(mesh.bureau, CallerIdentity(keys.officer).token("income-verifier"))
    assert elsewhere.status_code == 401
    assert "is for another agent, not 'credit-bureau'" in elsewhere.text
    late = CallerIdentity(keys.officer, clock=lambda: time.time() - 3600).token("credit-bureau")
    expired = _score(mesh.bureau, late)
    assert expired.status_code == 401
    assert "has expired" in expired.text
    foreign = _score(mesh.bureau, CallerIdentity(keys.foreign).token("credit-bureau"))
    assert foreign.status_code == 401
    assert "another mesh's root" in foreign.text
    # The bureau knows who called: the officer, by its certified key.
    assert "caller test-officer verified by its call token" in mesh.bureau_log.read_text()


def test_a_token_read_without_jwt_decode_is_checked_as_strictly(keys: Keys) -> None:
    # The callee checks a caller's header once and then the signature and claims itself
    # (mesh._identity._claims): a payload swapped in, a missing claim, another algorithm in
    # the header and junk in a segment are each refused.
    mint = CallerIdentity(keys.officer)
    check = CallerCheck(keys.root, "credit-bureau")
    first, second = mint.token("credit-bureau"), mint.token("credit-bureau")
    head, _, sig = first.split(".")
    swapped = f"{head}.{second.split('.')[1]}.{sig}"
    with pytest.raises(PeerRefused, match="does not verify"):
        check.verify(swapped)
    with pytest.raises(PeerRefused, match="does not verify"):
        check.verify(f"{head}.{second.split('.')[1]}!.{sig}")
    header = {
        "typ": "mesh-call+jwt",
        "kid": keys.officer.kid,
        "mesh_cert": keys.officer.certificate,
    }
    now = int(time.time())
    partial = jwt.encode(
        {"iss": "test-officer", "aud": "credit-bureau", "iat": now, "exp": now + 60},
        keys.officer.key,
        algorithm="ES256",
        headers=header,
    )
    with pytest.raises(PeerRefused, match="needs iss, aud, iat, exp, jti"):
        check.verify(partial)
    hs = jwt.encode({"iss": "test-officer"}, "k" * 32, algorithm="HS256", headers=header)
    with pytest.raises(PeerRefused, match="not a mesh call token"):
        check.verify(hs)
    assert check.verify(first).agent == "test-officer"


def test_a_call_token_carries_the_principal_it_was_minted_for(keys: Keys) -> None:
    mint = CallerIdentity(keys.officer)
    check = CallerCheck(keys.root, "credit-bureau")
    assert check.verify(mint.token("credit-bureau")).principal is None
    reset = PRINCIPAL.set("alice@example.com")
    try:
        token = mint.token("credit-bureau")
    finally:
        PRINCIPAL.reset(reset)
    assert jwt.decode(token, options={"verify_signature": False})["sub"] == "alice@example.com"
    assert check.verify(token).principal == "alice@example.com"
    reset = PRINCIPAL.set(" x" * 200)
    try:
        with pytest.raises(PeerRefused, match="the call token's sub: a principal is 1-256"):
            check.verify(mint.token("credit-bureau"))
    finally:
        PRINCIPAL.reset(reset)


@pytest.mark.integration
async def test_the_end_users_identity_travels_down_the_delegation(mesh: Mesh) -> None:
    # The user calls the officer with the mesh token on behalf of alice: the officer's call
    # token to the bureau carries her as 'sub', and the bureau logs her with the call.
    headers = {"Authorization": f"Bearer {USER_TOKEN}", "Mesh-Principal": "alice@example.com"}
    async with httpx.AsyncClient(timeout=60, trust_env=False, headers=headers) as http:
        peer = A2APeer(http, mesh.officer)
        try:
            result = await peer.send("score APP-501")
        finally:
            await peer.aclose()
    assert result.ok, result
    await eventually(
        lambda: (
            "call from test-officer on behalf of alice@example.com" in mesh.bureau_log.read_text()
        ),
        within=10,
    )
    # A principal no log could hold is refused, saying what one is.
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        bad = await http.post(
            mesh.officer + "/",
            content=b"{}",
            headers={"Authorization": f"Bearer {USER_TOKEN}", "Mesh-Principal": "x" * 300},
        )
    assert bad.status_code == 401
    assert "the Mesh-Principal header: a principal is 1-256" in bad.text
