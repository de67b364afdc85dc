"""Consul over TLS (issue 20 item 2): ``consul+https://`` is accepted wherever a Consul address is,
and CONSUL_CACERT and the client certificate reach py-consul's ``verify`` and ``cert``: checked
against the fake Consul agent serving HTTPS with certificates made by trustme."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from mesh._discovery import create_backend
from mesh._discovery.consul import ConsulBackend
from mesh._errors import ConfigError, DiscoveryError
from mesh._settings import ConsulTLS, MeshSettings, NodeSettings
from tests.fakes.consul_server import FakeConsul
from tests.support import ROOT, clean_env


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("mesh-node.client")
    files = {
        "ca": root / "ca.pem",
        "server_cert": root / "server.pem",
        "server_key": root / "server-key.pem",
        "client_cert": root / "client.pem",
        "client_key": root / "client-key.pem",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["server_cert"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


@pytest.fixture
def https_consul(pki: dict[str, Path]) -> Iterator[FakeConsul]:
    with FakeConsul(tls=(pki["server_cert"], pki["server_key"])) as fake:
        yield fake


def test_every_consul_scheme_is_a_discovery_location(pki: dict[str, Path]) -> None:
    env = {
        "MESH_DISCOVERY": "consul+https://consul.internal:8501",
        "CONSUL_CACERT": str(pki["ca"]),
        "CONSUL_CLIENT_CERT": str(pki["client_cert"]),
        "CONSUL_CLIENT_KEY": str(pki["client_key"]),
    }
    node = NodeSettings.from_env(env, agent_name="a")
    assert node.consul == "consul+https://consul.internal:8501"
    assert node.consul_tls.verify_arg == str(pki["ca"])
    assert node.consul_tls.cert_arg == (str(pki["client_cert"]), str(pki["client_key"]))
    for where in ("consul://c:8500", "consul+http://c:8500", "consul+https://c:8501"):
        assert MeshSettings.from_env({"MESH_DISCOVERY": where}).discovery == where
        assert isinstance(create_backend(where), ConsulBackend)


def test_a_missing_certificate_file_is_named() -> None:
    with pytest.raises(ConfigError, match=r"CONSUL_CACERT='/no/ca.pem': no such file"):
        MeshSettings.from_env({"CONSUL_CACERT": "/no/ca.pem"})
    with pytest.raises(ConfigError, match=r"MESH_DISCOVERY='etcd://x'.*consul\+https://"):
        MeshSettings.from_env({"MESH_DISCOVERY": "etcd://x"})


@pytest.mark.integration
async def test_https_consul_is_verified_with_consul_cacert(
    https_consul: FakeConsul, pki: dict[str, Path]
) -> None:
    assert https_consul.address.startswith("consul+https://")
    trusted = ConsulBackend(https_consul.address, tls=ConsulTLS(ca_file=pki["ca"]))
    untrusted = ConsulBackend(https_consul.address, timeout_s=5.0)
    try:
        assert [i.instance_id for i in await trusted.find(agent="credit-bureau")] == [
            "credit-bureau-7f3a"
        ]
        with pytest.raises(DiscoveryError, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusted.find(agent="credit-bureau")
    finally:
        await trusted.aclose()
        await untrusted.aclose()


@pytest.mark.integration
async def test_a_client_certificate_reaches_consul_that_requires_one(
    pki: dict[str, Path],
) -> None:
    with FakeConsul(tls=(pki["server_cert"], pki["server_key"]), client_ca=pki["ca"]) as consul:
        without = ConsulBackend(consul.address, tls=ConsulTLS(ca_file=pki["ca"]))
        with_cert = ConsulBackend(
            consul.address,
            tls=ConsulTLS(
                ca_file=pki["ca"], cert_file=pki["client_cert"], key_file=pki["client_key"]
            ),
        )
        try:
            assert len(await with_cert.find(agent="credit-bureau")) == 1
            with pytest.raises(DiscoveryError, match="could not answer a query"):
                await without.find(agent="credit-bureau")
        finally:
            await without.aclose()
            await with_cert.aclose()


@pytest.mark.integration
def test_the_cli_finds_agents_in_https_consul_with_consul_cacert(
    https_consul: FakeConsul, pki: dict[str, Path]
) -> None:
    # `mesh call NAME` and `mesh tasks NAME` look the name up with the settings' Consul TLS (they
    # built the backend without it: certificate verify failed, at Consul, before any node).
    env = clean_env(MESH_DISCOVERY=https_consul.address, CONSUL_CACERT=str(pki["ca"]))
    for args in (["tasks", "credit-bureau", "--timeout", "2"], ["call", "credit-bureau", "--skill", "score", "--json", "{}"]):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "mesh", *args], env=env, cwd=ROOT, capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        # The lookup succeeded: the command went on to the instance Consul lists (a name no
        # resolver knows), and failed there.
        assert "CERTIFICATE_VERIFY_FAILED" not in done.stderr, done.stderr
        assert "http://bureau-a.internal:8101" in done.stderr, done.stderr
