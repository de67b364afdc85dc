"""TLS (issue 16 item 5): nodes and the registry serve HTTPS with MESH_TLS_CERT / MESH_TLS_KEY
(``--tls-cert`` / ``--tls-key``), and every outbound client verifies against MESH_TLS_CA
(``mesh._tls.client_context``). A throwaway CA from trustme, real processes on 127.0.0.1: the
registry and the loan desk over HTTPS (registration, the prober, the officer's delegation found
through the registry, ``mesh ls`` / ``mesh call``), and a peer whose certificate is from another
CA refused at the handshake, before any request (so no credential) reaches it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from mesh._a2a.client import A2APeer
from mesh._errors import ConfigError, RemoteError
from mesh._settings import MeshSettings, NodeSettings
from mesh._tls import client_context, trust, trusted_ca
from tests.support import BUREAU_SCORES, ROOT, Proc, clean_env, free_port, wait_for
from tests.test_browser import ARGS, find_chromium

TOKEN = "tls-mesh-token-5d1e"


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    rogue_cert: Path
    rogue_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, rogue = trustme.CA(), trustme.CA()
    files = Pki(
        *(root / n for n in ("ca.pem", "cert.pem", "key.pem", "rogue.pem", "rogue-key.pem"))
    )
    ca.cert_pem.write_to_path(str(files.ca))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(files.cert))
    server.private_key_pem.write_to_path(str(files.key))
    # Valid for 127.0.0.1 too, issued by a CA nobody in the mesh trusts.
    impostor = rogue.issue_cert("127.0.0.1")
    impostor.cert_chain_pems[0].write_to_path(str(files.rogue_cert))
    impostor.private_key_pem.write_to_path(str(files.rogue_key))
    return files


def verified(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca))


# -- settings ------------------------------------------------------------------------------
def test_a_node_serving_https_names_https_urls(pki: Pki) -> None:
    env = {"MESH_TLS_CERT": str(pki.cert), "MESH_TLS_KEY": str(pki.key)}
    node = NodeSettings.from_env(env, agent_name="a", port=8443)
    assert node.tls is not None
    assert node.url == "https://127.0.0.1:8443"
    assert NodeSettings.from_env({}, agent_name="a", port=8443).url == "http://127.0.0.1:8443"
    flags = NodeSettings.build(
        MeshSettings.from_env({}), agent_name="a", tls_cert=pki.cert, tls_key=pki.key
    )
    assert flags.tls is not None
    assert flags.tls.cert_file == pki.cert


def test_incomplete_or_mismatched_tls_settings_are_named(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="MESH_TLS_CERT is set without --tls-key / MESH_TLS_KEY"):
        NodeSettings.from_env({"MESH_TLS_CERT": str(pki.cert)}, agent_name="a")
    with pytest.raises(ConfigError, match=r"MESH_TLS_KEY='/no/key\.pem': no such file"):
        MeshSettings.from_env({"MESH_TLS_KEY": "/no/key.pem"})
    with pytest.raises(ConfigError, match="cannot serve with this certificate and key"):
        NodeSettings.from_env(
            {"MESH_TLS_CERT": str(pki.cert), "MESH_TLS_KEY": str(pki.rogue_key)}, agent_name="a"
        )


def test_registry_flags_refuse_half_a_pair(pki: Pki, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "registry", "--port", str(free_port()), "--data-dir",
         str(tmp_path), "--tls-key", str(pki.key)],
        env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 78, done.stderr
    assert "--tls-key / MESH_TLS_KEY is set without --tls-cert / MESH_TLS_CERT" in done.stderr


# -- the desk over HTTPS -------------------------------------------------------------------
@dataclass
class Desk:
    registry: str
    officer: str
    bureau: str
    env: dict[str, str]
    procs: dict[str, Proc] = field(default_factory=dict)


def wait_https(url: str, pki: Pki, proc: Proc, timeout: float = 40.0) -> httpx.Response:
    def check() -> httpx.Response | None:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited:\n{proc.output()}")
        answer = httpx.get(url, verify=verified(pki), timeout=2.0)
        return answer if answer.status_code == 200 else None

    return wait_for(check, timeout=timeout, what=f"200 from {url}")


@pytest.fixture(scope="module")
def desk(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desk]:
    tmp = tmp_path_factory.mktemp("tls-desk")
    reg_port = free_port()
    registry = f"https://127.0.0.1:{reg_port}"
    env = clean_env(
        MESH_REGISTRY=registry, MESH_TLS_CA=str(pki.ca), MESH_TOKEN=TOKEN,
        MESH_TLS_CERT=str(pki.cert), MESH_TLS_KEY=str(pki.key),
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        reg = Proc.start(
            ["mesh", "registry", "--port", str(reg_port), "--data-dir", str(tmp / "reg"),
             "--probe-interval", "0.5", "--probe-timeout", "1"],
            name="registry", tmp=tmp, env=env,
        )  # fmt: skip
        stack.callback(reg.terminate)
        wait_https(f"{registry}/health", pki, reg)
        desk = Desk(registry, "", "", env, {"registry": reg})
        for name, module in (
            ("bureau", "agents.credit_bureau:agent"),
            ("verifier", "agents.income_verifier:agent"),
            ("officer", "agents.loan_officer:agent"),
        ):
            port = free_port()
            proc = Proc.start(
                ["mesh", "serve", module, "--port", str(port), "--data-dir", str(tmp / name),
                 "--grace", "1"],
                name=name, tmp=tmp, env=env,
            )  # fmt: skip
            stack.callback(proc.terminate)
            desk.procs[name] = proc
            url = f"https://127.0.0.1:{port}"
            if name == "bureau":
                desk.bureau = url
            elif name == "officer":
                desk.officer = url
            wait_https(f"{url}/health", pki, proc)
        yield desk


def listed(desk: Desk, pki: Pki) -> list[dict[str, Any]]:
    answer = httpx.get(f"{desk.registry}/v1/instances", verify=verified(pki), timeout=5)
    answer.raise_for_status()
    found: list[dict[str, Any]] = answer.json()["instances"]
    return found


@pytest.mark.integration
def test_nodes_register_and_are_probed_over_https(desk: Desk, pki: Pki) -> None:
    # The card names the HTTPS origin it was fetched from, and plain HTTP is not served.
    card = httpx.get(f"{desk.bureau}/.well-known/agent-card.json", verify=verified(pki)).json()
    assert {i["url"] for i in card["supportedInterfaces"]} >= {desk.bureau}
    with pytest.raises(httpx.HTTPError):
        httpx.get(desk.bureau.replace("https://", "http://") + "/health", timeout=2)

    def all_probed() -> list[dict[str, Any]] | None:
        found = listed(desk, pki)
        probed = {i["url"] for i in found if i["status_reason"] == "health ok"}
        return found if len(found) == 3 and probed == {i["url"] for i in found} else None

    # Registered: the registry fetched each card; "health ok": its prober read /health since.
    found = wait_for(all_probed, timeout=30, what="the HTTPS instances probed")
    assert all(i["url"].startswith("https://127.0.0.1:") for i in found)
    intro = httpx.get(f"{desk.registry}/introspect", verify=verified(pki), timeout=5)
    if intro.status_code == 200:
        assert intro.json()["registry"]["url"] == desk.registry


@pytest.mark.integration
async def test_the_officer_delegates_to_an_https_bureau_found_through_the_registry(
    desk: Desk, pki: Pki
) -> None:
    wait_for(lambda: len(listed(desk, pki)) >= 3, timeout=30, what="three instances")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(verify=verified(pki), timeout=30, headers=headers) as http:
        peer = A2APeer(http, desk.officer)
        try:
            result = await peer.send("Should we approve APP-612 for 400,000 over 48 months?")
        finally:
            await peer.aclose()
    assert result.state == "completed", result
    assert str(BUREAU_SCORES["APP-612"]) in result.text


def mesh_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", *args], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=90, check=False,
    )  # fmt: skip


@pytest.mark.integration
def test_mesh_ls_and_call_over_https(desk: Desk, pki: Pki) -> None:
    env = clean_env(MESH_REGISTRY=desk.registry, MESH_TLS_CA=str(pki.ca), MESH_TOKEN=TOKEN)
    wait_for(lambda: len(listed(desk, pki)) >= 3, timeout=30, what="three instances")
    ls = mesh_cli("ls", env=env)
    assert ls.returncode == 0, ls.stderr
    assert "credit-bureau" in ls.stdout
    assert "loan-officer" in ls.stdout
    score = '{"applicant_id": "APP-501", "amount": 250000}'
    call = mesh_cli("call", "credit-bureau", "--skill", "score", "--json", score, env=env)
    assert call.returncode == 0, call.stderr
    assert str(BUREAU_SCORES["APP-501"]) in call.stdout
    # The same without the CA: the system's trust store does not know the mesh's CA.
    alone = {k: v for k, v in env.items() if k != "MESH_TLS_CA"}
    refused = mesh_cli("call", desk.bureau, "--skill", "score", "--json", "{}", env=alone)
    assert refused.returncode == 1
    assert f"TLS verification of {desk.bureau}" in refused.stderr, refused.stderr
    assert "set MESH_TLS_CA" in refused.stderr


# -- a peer whose certificate is not from the CA ---------------------------------------------
class Impostor:
    """An HTTPS listener with a certificate from another CA, recording what reaches it after
    the handshake (a request, its headers: a credential)."""

    def __init__(self, pki: Pki) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(pki.rogue_cert, pki.rogue_key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received = b""
        self.handshakes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(2.0)
            with (
                contextlib.suppress(OSError),
                self.context.wrap_socket(conn, server_side=True) as tls,
            ):
                self.handshakes += 1
                self.received += tls.recv(65536)

    def __enter__(self) -> Impostor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.mark.integration
async def test_a_peer_whose_certificate_is_not_from_the_ca_gets_nothing(pki: Pki) -> None:
    from mesh._netguard import create_http_client
    from mesh._netpolicy import NetworkPolicy

    before = trusted_ca()
    trust(pki.ca)
    try:
        with Impostor(pki) as impostor:
            # The client a node delegates with (mesh._tls.client_context), the token attached.
            http = create_http_client(NetworkPolicy.parse("loopback"), timeout=5.0)
            peer = A2APeer(http, impostor.url, headers={"Authorization": f"Bearer {TOKEN}"})
            try:
                with pytest.raises(RemoteError) as refused:
                    await peer.send({"applicant_id": "APP-501"}, skill="score", timeout=10)
            finally:
                await peer.aclose()
                await http.aclose()
        assert f"TLS verification of {impostor.url}" in str(refused.value)
        assert "unable to get local issuer certificate" in str(refused.value)
        assert str(pki.ca) in str(refused.value)
        assert impostor.handshakes == 0
        assert impostor.received == b""
    finally:
        trust(before)
    assert client_context() is not None


@pytest.mark.integration
def test_the_registry_refuses_to_register_a_peer_whose_certificate_is_not_from_the_ca(
    desk: Desk, pki: Pki
) -> None:
    with Impostor(pki) as impostor:
        answer = httpx.post(
            f"{desk.registry}/v1/instances",
            json={"instance_id": "credit-bureau-rogue", "agent": "credit-bureau",
                  "url": impostor.url},
            verify=verified(pki), timeout=10,
        )  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert "TLS verification failed" in answer.json()["message"]
    assert "MESH_TLS_CA" in answer.json()["message"]
    assert impostor.received == b""
    assert "credit-bureau-rogue" not in {i["instance_id"] for i in listed(desk, pki)}


# -- the operator page in Chromium ----------------------------------------------------------
def browser_home(tmp: Path, ca: Path | None) -> Path:
    """A HOME whose NSS database (where Chromium on Linux keeps the CAs a user trusts) holds
    ``ca``: the browser trusts the mesh's CA the way an operator's would, no flag ignoring
    certificate errors."""
    certutil = shutil.which("certutil")
    if certutil is None:
        pytest.skip("needs certutil: apt-get install libnss3-tools (.ci/system-deps installs it)")
    db = tmp / ".pki" / "nssdb"
    db.mkdir(parents=True)
    subprocess.run([certutil, "-d", f"sql:{db}", "-N", "--empty-password"], check=True)
    if ca is not None:
        trusted = [certutil, "-d", f"sql:{db}", "-A", "-t", "C,,", "-n", "mesh CA", "-i", str(ca)]
        subprocess.run(trusted, check=True)
    return tmp


@pytest.mark.browser
@pytest.mark.integration
def test_the_operator_page_loads_over_https_in_chromium(
    desk: Desk, pki: Pki, tmp_path: Path
) -> None:
    chromium = find_chromium()
    from playwright.sync_api import Error, sync_playwright

    wait_for(lambda: len(listed(desk, pki)) >= 3, timeout=30, what="three instances")
    with sync_playwright() as pw:
        for home, trusted in ((tmp_path / "without", False), (tmp_path / "with", True)):
            env = {**clean_env(), "HOME": str(browser_home(home, pki.ca if trusted else None))}
            browser = pw.chromium.launch(executable_path=chromium, args=ARGS, env=env)
            try:
                page = browser.new_page()
                if not trusted:
                    # The same page from a browser that does not know the mesh's CA: refused.
                    with pytest.raises(Error, match="ERR_CERT_AUTHORITY_INVALID"):
                        page.goto(desk.registry + "/")
                    continue
                answer = page.goto(desk.registry + "/")
                assert answer is not None
                assert answer.ok
                assert page.url.startswith("https://")
                assert page.locator("tr[data-agent='credit-bureau']").count() == 1
                page.click("a[href='/agents/credit-bureau']")
                page.wait_for_url("**/agents/credit-bureau")
                assert page.locator(f"tr[data-instance] a[href='{desk.bureau}']").count() == 1
            finally:
                browser.close()


@pytest.mark.integration
async def test_a_scripts_remote_toolset_verifies_with_mesh_tls_ca(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A script is its own edge: its remote() toolset reads MESH_TLS_CA as it opens its clients
    # (and sends no mesh token: this bureau is open, on loopback).
    from mesh._remote import remote
    from tests.test_delegation_calls import tool_context, toolset

    port = free_port()
    env = clean_env(MESH_TLS_CERT=str(pki.cert), MESH_TLS_KEY=str(pki.key))
    argv = ["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port), "--no-register",
            "--data-dir", str(tmp_path / "bureau")]  # fmt: skip
    with Proc.start(argv, name="bureau", tmp=tmp_path, env=env) as bureau:
        url = f"https://127.0.0.1:{port}"
        wait_https(f"{url}/health", pki, bureau)
        monkeypatch.setenv("MESH_TLS_CA", str(pki.ca))
        before = trusted_ca()
        try:
            async with toolset(remote(url)) as tools:
                score = tools["credit_bureau_score"]
                answer = {"applicant_id": "APP-738", "amount": 1000}
                result = await score.call(answer, tool_context())
        finally:
            trust(before)
    assert result["score"] == BUREAU_SCORES["APP-738"]
