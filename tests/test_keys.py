"""Mesh keys (issue 16 item 1): ``mesh keys init`` and ``mesh keys issue`` through the real
command, the files they write (0600 in 0700 folders), the certificate's checks, and the settings
that point a node at its folder (``MESH_KEYS`` / ``--keys``)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import jwt
import pytest

from mesh._cli.main import main
from mesh._errors import ConfigError, PeerRefused
from mesh._keys import AgentKeys, TrustRoot, init_mesh, issue_agent
from mesh._settings import MeshSettings, NodeSettings


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_and_issue_write_private_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mesh = tmp_path / "keys"
    assert main(["keys", "init", str(mesh)]) == 0
    assert main(["keys", "issue", str(mesh), "credit-bureau"]) == 0
    out = capsys.readouterr().out
    agent = mesh / "agents" / "credit-bureau"
    assert f"MESH_KEYS={agent}" in out
    files = [
        mesh / "root.key.jwk",
        mesh / "root.jwk",
        *(agent / n for n in ("key.jwk", "cert.jwt", "root.jwk")),
    ]
    for path in files:
        assert _mode(path) == 0o600, path
    for folder in (mesh, agent):
        assert _mode(folder) == 0o700, folder
    # The private parts are where they belong, and only there.
    assert "d" in json.loads((mesh / "root.key.jwk").read_text())
    assert "d" not in json.loads((mesh / "root.jwk").read_text())
    assert "d" not in json.loads((agent / "root.jwk").read_text())
    private = json.loads((agent / "key.jwk").read_text())["d"]
    assert private not in out
    # No key material in what the command printed beyond paths and the root's thumbprint.
    keys = AgentKeys.load(agent, "credit-bureau")
    assert private not in repr(keys)
    assert keys.certificate not in repr(keys)
    # The mesh's folder works too: the node takes agents/<its name>.
    assert AgentKeys.load(mesh, "credit-bureau").kid == keys.kid


def test_init_refuses_to_replace_a_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    init_mesh(tmp_path)
    before = (tmp_path / "root.jwk").read_text()
    assert main(["keys", "init", str(tmp_path)]) == 1
    assert "already holds a mesh root" in capsys.readouterr().err
    assert (tmp_path / "root.jwk").read_text() == before


def test_issue_refuses_a_name_no_agent_can_have(tmp_path: Path) -> None:
    init_mesh(tmp_path)
    with pytest.raises(ConfigError, match="is not an agent name"):
        issue_agent(tmp_path, "../evil")
    with pytest.raises(ConfigError, match="mesh keys init"):
        issue_agent(tmp_path / "nothing", "credit-bureau")


def test_the_certificate_binds_name_and_key_to_this_root(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    init_mesh(ours)
    init_mesh(theirs)
    folder = issue_agent(ours, "credit-bureau")
    foreign = issue_agent(theirs, "credit-bureau")
    root = TrustRoot.load(ours)
    cert = (folder / "cert.jwt").read_text().strip()
    certified = root.check(cert)
    assert certified.agent == "credit-bureau"
    assert certified.kid == AgentKeys.load(folder, "credit-bureau").kid
    with pytest.raises(PeerRefused, match="another mesh's root"):
        root.check((foreign / "cert.jwt").read_text().strip())
    # Claiming our root's kid does not make another root's signature ours.
    forged = jwt.encode(
        {"sub": "credit-bureau", "cnf": {"jwk": {}}, "exp": int(time.time()) + 60},
        AgentKeys.load(foreign, "credit-bureau").key,
        algorithm="ES256",
        headers={"typ": "mesh-cert+jwt", "kid": root.kid},
    )
    with pytest.raises(PeerRefused, match="not signed by this mesh's root"):
        root.check(forged)
    with pytest.raises(PeerRefused, match="expired"):
        root.check(cert, now=certified.expires_at + 1)
    with pytest.raises(PeerRefused, match="not a JWT"):
        root.check("not-a-certificate")


def test_a_node_loads_only_its_own_certified_key(tmp_path: Path) -> None:
    init_mesh(tmp_path)
    bureau = issue_agent(tmp_path, "credit-bureau")
    officer = issue_agent(tmp_path, "loan-officer")
    with pytest.raises(ConfigError, match="certifies 'credit-bureau', not 'loan-officer'"):
        AgentKeys.load(bureau, "loan-officer")
    # A key swapped in from another agent no longer matches the certificate.
    (bureau / "key.jwk").write_text((officer / "key.jwk").read_text())
    with pytest.raises(ConfigError, match="certifies another key"):
        AgentKeys.load(bureau, "credit-bureau")
    with pytest.raises(ConfigError, match="mesh keys issue"):
        AgentKeys.load(tmp_path, "fx-desk")


def test_mesh_keys_and_the_keys_flag_point_a_node_at_its_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"MESH_KEYS=.*no such folder"):
        MeshSettings.from_env({"MESH_KEYS": str(tmp_path / "missing")})
    env = MeshSettings.from_env({"MESH_KEYS": str(tmp_path)})
    assert NodeSettings.build(env, agent_name="a").keys == tmp_path
    flag = tmp_path / "flag"
    flag.mkdir()
    assert NodeSettings.build(env, agent_name="a", keys=flag).keys == flag
    with pytest.raises(ConfigError, match="--keys"):
        NodeSettings.build(env, agent_name="a", keys=tmp_path / "missing")
    # Without keys nothing changes (the simple mode).
    assert NodeSettings.build(MeshSettings.from_env({}), agent_name="a").keys is None
