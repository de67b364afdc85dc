"""The registry's own command (``mesh-registry``, ``python -m registry``) and ``mesh registry``,
the alias that runs it in the same process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mesh._errors import ConfigError
from registry import cli
from tests.support import BIN, ROOT, clean_env, free_port, running

# The three ways to start a registry; each must behave as the registry's own command.
COMMANDS = {
    "mesh registry": [sys.executable, "-m", "mesh", "registry"],
    "python -m registry": [sys.executable, "-m", "registry"],
    "mesh-registry": [str(BIN / "mesh-registry")],
}


def _run(
    argv: list[str], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*argv, *args],
        capture_output=True, text=True, timeout=30, env=env or clean_env(), cwd=ROOT,
    )  # fmt: skip


# -- flags over variables over defaults ----------------------------------------------------------


def test_flags_win_over_variables_which_win_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    defaults = cli.settings_from(parser.parse_args([]))
    assert (defaults.host, defaults.port, defaults.token, defaults.consul_token) == (
        "127.0.0.1", 8400, None, None,
    )  # fmt: skip
    assert defaults.allow_networks is None
    assert defaults.data_dir == Path(".mesh/registry")

    monkeypatch.setenv("MESH_REGISTRY_TOKEN", "from-env")
    monkeypatch.setenv("MESH_REGISTRY_ALLOW_NETWORKS", "10.0.0.0/8")
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "consul-secret")
    from_env = cli.settings_from(parser.parse_args([]))
    assert (from_env.token, from_env.consul_token) == ("from-env", "consul-secret")
    assert from_env.network_policy.allows("10.1.1.1")

    flagged = cli.settings_from(
        parser.parse_args(["--token", "from-flag", "--allow-networks", "loopback"])
    )
    assert flagged.token == "from-flag"
    assert not flagged.network_policy.allows("10.1.1.1")

    # An empty variable is unset, as the shell's `VAR= cmd` means.
    monkeypatch.setenv("MESH_REGISTRY_TOKEN", "")
    assert cli.settings_from(parser.parse_args([])).token is None


def test_a_flag_overriding_a_bad_variable_is_not_refused_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESH_REGISTRY_ALLOW_NETWORKS", "loopbak")
    args = cli.build_parser().parse_args(["--allow-networks", "private"])
    assert cli.settings_from(args).network_policy.allows("10.0.0.1")


def test_every_bad_value_is_in_one_error_named_as_the_operator_wrote_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESH_REGISTRY_TOKEN", "  ")
    monkeypatch.setenv("MESH_REGISTRY_ALLOW_NETWORKS", "loopbak")
    args = cli.build_parser().parse_args(["--max-instances", "0", "--backend", "etcd://x"])
    with pytest.raises(ConfigError) as caught:
        cli.settings_from(args)
    message = str(caught.value)
    assert message.startswith("4 settings are wrong: (1) MESH_REGISTRY_TOKEN: ")
    assert "(2) MESH_REGISTRY_ALLOW_NETWORKS: 'loopbak' is not a network" in message
    assert "(3) --backend 'etcd://x': use consul://host:8500" in message
    assert "(4) --max-instances 0: give at least 1" in message
    # The token's value is never repeated (it is a secret, even a blank one).
    monkeypatch.delenv("MESH_REGISTRY_ALLOW_NETWORKS")
    args = cli.build_parser().parse_args(["--token", " s3cret"])
    with pytest.raises(ConfigError, match=r"^--token: the write token has spaces") as caught:
        cli.settings_from(args)
    assert "s3cret" not in str(caught.value)


# -- the three commands ---------------------------------------------------------------------------


@pytest.mark.integration
def test_help_and_usage_errors_are_the_registry_commands_own() -> None:
    helps = {name: _run(argv, "--help") for name, argv in COMMANDS.items()}
    for name, result in helps.items():
        assert result.returncode == 0, (name, result.stderr)
        assert "--allow-networks NETS" in result.stdout, name
        assert "--max-instances N" in result.stdout, name
    # `mesh registry` shows the registry's help (after the prog name), not mesh's.
    assert helps["mesh registry"].stdout == helps["python -m registry"].stdout
    assert helps["mesh-registry"].stdout.startswith("usage: mesh-registry ")
    assert helps["mesh registry"].stdout.startswith("usage: mesh registry ")

    for name, argv in COMMANDS.items():
        result = _run(argv, "--port", "eighty")
        assert result.returncode == 2, (name, result.stderr)
        assert "error: argument --port: invalid int value: 'eighty'" in result.stderr, name
        assert "Traceback" not in result.stderr, name


@pytest.mark.integration
def test_a_bad_environment_is_one_line_and_ex_config_from_every_command(tmp_path: Path) -> None:
    """EX_CONFIG (78): `mesh up` does not restart it (the same start would fail the same way)."""
    env = clean_env(MESH_REGISTRY_TOKEN=" ", MESH_REGISTRY_ALLOW_NETWORKS="10.0.0.0/33")
    for name, argv in COMMANDS.items():
        data = tmp_path / name.replace(" ", "-")
        result = _run(argv, "--port", str(free_port()), "--data-dir", str(data), env=env)
        assert result.returncode == os.EX_CONFIG, (name, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (name, result.stderr)
        assert lines[0].startswith("mesh: error: 2 settings are wrong: (1) MESH_REGISTRY_TOKEN: ")
        assert "(2) MESH_REGISTRY_ALLOW_NETWORKS: " in lines[0], name
        assert not data.exists(), name


@pytest.mark.integration
def test_mesh_registry_is_the_registry_in_the_same_process(tmp_path: Path) -> None:
    """`mesh up` supervises and signals the pid it started: the alias must not be a parent."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["mesh", "registry", "--port", str(port), "--data-dir", str(tmp_path / "reg")]
    with running(argv, name="registry", tmp=tmp_path, health=f"{url}/health") as proc:
        health = httpx.get(f"{url}/health", timeout=5, trust_env=False).json()
        assert health["pid"] == proc.pid
        proc.terminate()
        # The SIGTERM reached the registry itself, which shut down in order.
        assert f"Finished server process [{proc.pid}]" in proc.output()


@pytest.mark.integration
def test_the_mesh_command_does_not_load_the_registry_package() -> None:
    code = (
        "import sys; from mesh._cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'registry'))"
    )
    result = _run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
