"""mesh.toml parsing and the process plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh._errors import ConfigError
from mesh._meshfile import load_meshfile
from tests.support import ROOT

GOOD = """
state_dir = "state"

[registry]
port = 9400

[env]
MESH_LOG_LEVEL = "debug"

[nodes.credit-bureau]
module = "agents.credit_bureau:agent"
port = "9411-9413"
replicas = 2

[nodes.loan-officer]
module = "agents.loan_officer:agent"
port = 9401
env = { MESH_LOG_LEVEL = "info", EXTRA = "1" }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mesh.toml"
    path.write_text(text)
    return path


def test_plan_starts_registry_first_then_each_replica(tmp_path: Path) -> None:
    mf = load_meshfile(write(tmp_path, GOOD))
    specs = mf.plan(tmp_path, python="py")
    assert [s.name for s in specs] == [
        "registry",
        "credit-bureau-1",
        "credit-bureau-2",
        "loan-officer",
    ]
    reg, b1, b2, officer = specs
    assert reg.argv[:4] == ("py", "-m", "mesh", "registry")
    assert "9400" in reg.argv
    assert reg.health_url == "http://127.0.0.1:9400/health"
    assert b1.argv[:5] == ("py", "-m", "mesh", "serve", "agents.credit_bureau:agent")
    assert b1.url == "http://127.0.0.1:9411"
    assert b2.url == "http://127.0.0.1:9412"
    # replicas get separate data dirs (one SQLite file each)
    d1 = b1.argv[b1.argv.index("--data-dir") + 1]
    d2 = b2.argv[b2.argv.index("--data-dir") + 1]
    assert d1 != d2
    assert Path(d1).is_relative_to((tmp_path / "state").resolve())
    assert b1.env["MESH_REGISTRY"] == "http://127.0.0.1:9400"
    assert b1.env["MESH_LOG_LEVEL"] == "debug"
    # node env overrides the shared env
    assert officer.env["MESH_LOG_LEVEL"] == "info"
    assert officer.env["EXTRA"] == "1"
    assert officer.agent == "loan-officer"


def test_single_port_with_replicas_uses_consecutive_ports(tmp_path: Path) -> None:
    mf = load_meshfile(
        write(tmp_path, '[nodes.a]\nmodule = "m:agent"\nport = 9000\nreplicas = 3\n')
    )
    assert mf.nodes["a"].ports() == [9000, 9001, 9002]


def test_external_registry(tmp_path: Path) -> None:
    mf = load_meshfile(
        write(
            tmp_path,
            '[registry]\nenabled = false\nurl = "http://127.0.0.1:7000"\n'
            '[nodes.a]\nmodule = "m:agent"\nport = 9000\n',
        )
    )
    specs = mf.plan(tmp_path)
    assert [s.kind for s in specs] == ["node"]
    assert specs[0].env["MESH_REGISTRY"] == "http://127.0.0.1:7000"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[nodes.a]\nmodule = "m:agent"\nport = "9000-9001"\nreplicas = 3\n', "nodes.a"),
        ('[nodes.a]\nmodule = "no-colon"\nport = 9000\n', "MODULE:ATTR"),
        ('[nodes.a]\nmodule = "m:agent"\nport = "high"\n', "nodes.a.port"),
        ('[nodes.a]\nmodule = "m:agent"\nport = 70000\n', "outside"),
        ('[nodes.a]\nmodule = "m:agent"\nport = 9000\ncolour = "red"\n', "colour"),
        ('[nodes.a]\nmodule = "m:agent"\n', "nodes.a.port"),
        ('[nodes.Bad_Name]\nmodule = "m:agent"\nport = 9000\n', "Bad_Name"),
        (
            '[registry]\nport = 9000\n[nodes.a]\nmodule = "m:agent"\nport = 9000\n',
            "used by both 'registry' and 'a'",
        ),
        ("[registry]\nport = 9000\n", "nothing to run"),
        ("[nodes.a\n", "not valid TOML"),
        (
            '[nodes.a]\nmodule = "m:agent"\nport = 9000\n[policy]\nallow = ["a b:c"]\n',
            "policy.allow: Value error, rule 'a b:c': not a rule; write CALLER -> AGENT:SKILL",
        ),
        (
            '[nodes.a]\nmodule = "m:agent"\nport = 9000\n[policy]\nallow = []\n',
            "an empty allow list would refuse every call",
        ),
    ],
)
def test_mistakes_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_meshfile(write(tmp_path, text))
    assert needle in str(info.value)
    assert "mesh.toml" in str(info.value)


def test_the_policy_reaches_every_node_as_mesh_allow(tmp_path: Path) -> None:
    text = GOOD + '[policy]\nallow = ["loan-officer -> credit-bureau:score", "@token -> *"]\n'
    text = text.replace('EXTRA = "1" }', 'EXTRA = "1", MESH_ALLOW = "@token -> loan-officer" }')
    specs = {s.name: s for s in load_meshfile(write(tmp_path, text)).plan(tmp_path)}
    assert "MESH_ALLOW" not in specs["registry"].env
    rules = "loan-officer -> credit-bureau:score; @token -> *"
    assert specs["credit-bureau-1"].env["MESH_ALLOW"] == rules
    assert specs["credit-bureau-2"].env["MESH_ALLOW"] == rules
    # A node's own env wins.
    assert specs["loan-officer"].env["MESH_ALLOW"] == "@token -> loan-officer"


def test_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_meshfile(tmp_path / "nope.toml")


def test_the_loan_desk_mesh_file_is_valid() -> None:
    mf = load_meshfile(ROOT / "agents" / "mesh.toml")
    assert {"loan-officer", "credit-bureau", "income-verifier", "underwriter"} <= set(mf.nodes)
    assert mf.nodes["credit-bureau"].replicas == 2
