from __future__ import annotations

from pathlib import Path

import pytest

from mesh._errors import ConfigError
from mesh._settings import DEFAULT_REGISTRY_URL, MeshSettings, ModelSettings, NodeSettings


def test_node_registers_with_the_default_registry_unless_told_otherwise() -> None:
    s = NodeSettings.from_env({}, agent_name="a")
    assert s.registry == DEFAULT_REGISTRY_URL
    assert s.consul is None
    assert NodeSettings.from_env({}, agent_name="a", no_register=True).registry is None
    env = {"MESH_REGISTRY": "http://127.0.0.1:9400"}
    assert NodeSettings.from_env(env, agent_name="a").registry == "http://127.0.0.1:9400"
    flag = NodeSettings.from_env(env, agent_name="a", registry="http://127.0.0.1:9500")
    assert flag.registry == "http://127.0.0.1:9500"


def test_consul_discovery_replaces_the_registry() -> None:
    env = {"MESH_DISCOVERY": "consul://127.0.0.1:8500", "CONSUL_HTTP_TOKEN": "t0k"}
    s = NodeSettings.from_env(env, agent_name="a")
    assert (s.consul, s.consul_token, s.registry) == ("consul://127.0.0.1:8500", "t0k", None)
    assert NodeSettings.from_env(env, agent_name="a", no_register=True).consul is None


def test_unknown_discovery_is_a_config_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="MESH_DISCOVERY"):
        NodeSettings.from_env({"MESH_DISCOVERY": "etcd://x"}, agent_name="a")


def test_limits_and_peer_networks_come_from_the_environment() -> None:
    s = NodeSettings.from_env(
        {
            "MESH_MAX_BODY_BYTES": "2048",
            "MESH_MAX_INFLIGHT_BYTES": "4096",
            "MESH_MAX_TEXT_BYTES": "100",
            "MESH_PEER_NETWORKS": "10.0.0.0/8, loopback",
        },
        agent_name="a",
    )
    assert (s.max_body_bytes, s.max_inflight_bytes, s.max_text_bytes) == (2048, 4096, 100)
    assert s.peer_policy.allows("10.1.2.3")
    assert s.peer_policy.allows("127.0.0.1")
    assert not s.peer_policy.allows("192.168.1.1")


def test_push_networks_are_public_only_unless_set() -> None:
    default = NodeSettings.from_env({}, agent_name="a", host="0.0.0.0")
    assert default.push_policy.allows("8.8.8.8")
    assert not default.push_policy.allows("127.0.0.1")
    assert not default.push_policy.allows("10.0.0.5")
    local = NodeSettings.from_env({"MESH_PUSH_NETWORKS": "loopback"}, agent_name="a")
    assert local.push_policy.allows("127.0.0.1")
    assert not local.push_policy.allows("8.8.8.8")
    with pytest.raises(ConfigError, match=r"MESH_PUSH_NETWORKS='intranet'"):
        NodeSettings.from_env({"MESH_PUSH_NETWORKS": "intranet"}, agent_name="a")


def test_peer_networks_default_to_where_the_node_listens() -> None:
    local = NodeSettings.from_env({}, agent_name="a")
    assert local.peer_policy.allows("127.0.0.1")
    assert not local.peer_policy.allows("10.0.0.5")
    exposed = NodeSettings.from_env({}, agent_name="a", host="0.0.0.0")
    assert exposed.peer_policy.allows("10.0.0.5")
    assert not exposed.peer_policy.allows("8.8.8.8")
    assert not exposed.peer_policy.allows("169.254.169.254")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MESH_MAX_TEXT_BYTES", "64k"),
        ("MESH_MAX_INFLIGHT_BYTES", "0"),
        ("MESH_MAX_BODY_BYTES", "-5"),
        ("MESH_PEER_NETWORKS", "10.0.0.0/33"),
        ("MESH_PEER_NETWORKS", "intranet"),
    ],
)
def test_bad_limits_and_networks_are_config_errors_naming_the_variable(
    name: str, value: str
) -> None:
    with pytest.raises(ConfigError, match=name):
        NodeSettings.from_env({name: value}, agent_name="a")


def test_text_turns_are_bounded_by_default() -> None:
    assert NodeSettings.from_env({}, agent_name="a").max_text_bytes == 64 * 1024


@pytest.mark.parametrize("token", ["   ", " s3cret", "s3cret ", "s3 cret", "s3\tcret", "sécret"])
def test_a_mesh_token_no_caller_could_present_is_a_config_error(token: str) -> None:
    """A blank token was accepted and then matched nothing (the bearer value is trimmed); a
    non-ASCII one cannot go in the header the node sends its peers."""
    with pytest.raises(ConfigError, match=r"MESH_TOKEN has .* use visible ASCII"):
        NodeSettings.from_env({"MESH_TOKEN": token}, agent_name="a")


def test_an_empty_mesh_token_is_no_token_and_a_visible_one_is_kept() -> None:
    assert NodeSettings.from_env({"MESH_TOKEN": ""}, agent_name="a").token is None
    assert NodeSettings.from_env({"MESH_TOKEN": "s3cr~t"}, agent_name="a").token == "s3cr~t"


def test_the_body_timeout_comes_from_the_environment() -> None:
    assert NodeSettings.from_env({}, agent_name="a").body_timeout_s == 30.0
    assert NodeSettings.from_env({"MESH_BODY_TIMEOUT": "2.5"}, agent_name="a").body_timeout_s == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(ConfigError, match="MESH_BODY_TIMEOUT"):
            NodeSettings.from_env({"MESH_BODY_TIMEOUT": bad}, agent_name="a")


def test_the_answer_cap_comes_from_the_environment() -> None:
    assert NodeSettings.from_env({}, agent_name="a").max_answer_bytes == 32 * 1024 * 1024
    env = {"MESH_MAX_ANSWER_BYTES": "1048576"}
    assert NodeSettings.from_env(env, agent_name="a").max_answer_bytes == 1 << 20
    with pytest.raises(ConfigError, match="MESH_MAX_ANSWER_BYTES"):
        NodeSettings.from_env({"MESH_MAX_ANSWER_BYTES": "lots"}, agent_name="a")


def test_every_bad_variable_is_named_in_one_error() -> None:
    """The first bad variable stopped the start, and the next one stopped the next start."""
    env = {
        "MESH_LOG_LEVEL": "loud",
        "MESH_MAX_TEXT_BYTES": "64k",
        "MESH_BODY_TIMEOUT": "soon",
        "MESH_FASTPATH": "maybe",
        "MESH_PEER_NETWORKS": "intranet",
        "MESH_TOKEN": " s3cret",
    }
    with pytest.raises(ConfigError) as caught:
        NodeSettings.from_env(env, agent_name="a")
    message = str(caught.value)
    assert message.startswith("6 bad settings:"), message
    for name in env:
        assert name in message
    assert "use one of DEBUG, INFO, WARNING, ERROR" in message
    assert "use 1 (on) or 0 (off)" in message
    assert "s3cret" not in message  # a near-miss of a secret is most of the secret


def test_secrets_stay_out_of_reprs() -> None:
    env = {
        "MESH_TOKEN": "tok-1",
        "MESH_REGISTRY_TOKEN": "tok-2",
        "CONSUL_HTTP_TOKEN": "tok-3",
        "GOOGLE_API_KEY": "tok-4",
    }
    mesh = MeshSettings.from_env(env)
    node = NodeSettings.build(mesh, agent_name="a")
    assert (node.token, node.registry_token, node.consul_token) == ("tok-1", "tok-2", "tok-3")
    assert node.models.api_key is not None
    assert node.models.api_key.get_secret_value() == "tok-4"
    for shown in (repr(mesh), str(mesh), repr(node), repr(node.models)):
        assert "tok-" not in shown, shown


def test_the_environment_file_is_read_only_when_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .env in the working directory is never picked up; MESH_ENV_FILE names one, and the
    variables set in the environment win over it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("MESH_MAX_TEXT_BYTES=100\nMESH_LOG_LEVEL=loud\n")
    assert MeshSettings.from_environment().max_text_bytes == 64 * 1024
    named = tmp_path / "node.env"
    named.write_text("MESH_MAX_TEXT_BYTES=100\nMESH_BODY_TIMEOUT=5\nOTHER=ignored\n")
    monkeypatch.setenv("MESH_ENV_FILE", str(named))
    monkeypatch.setenv("MESH_BODY_TIMEOUT", "7")
    settings = MeshSettings.from_environment()
    assert (settings.max_text_bytes, settings.body_timeout_s) == (100, 7.0)
    monkeypatch.setenv("MESH_ENV_FILE", str(tmp_path / "missing.env"))
    with pytest.raises(ConfigError, match=r"MESH_ENV_FILE=.*missing\.env.*no such file"):
        MeshSettings.from_environment()


def test_the_model_settings_come_from_the_variables() -> None:
    models = MeshSettings.from_env({"GEMINI_API_KEY": "k", "MESH_REQUIRE_MODEL": "1"}).models
    assert (models.gemini, models.require, models.offline) == (True, True, False)
    assert MeshSettings.from_env({"GOOGLE_GENAI_USE_VERTEXAI": "true"}).models.gemini
    assert MeshSettings.from_env({"MESH_MODEL": "scripted"}).models.offline
    with pytest.raises(ConfigError, match=r"MESH_MODEL='gemini-2\.5-flash': the only value is"):
        MeshSettings.from_env({"MESH_MODEL": "gemini-2.5-flash"})
    with pytest.raises(ConfigError, match="contradict"):
        NodeSettings.from_env({"MESH_MODEL": "scripted", "MESH_REQUIRE_MODEL": "1"}, agent_name="a")


def test_a_model_is_required_beyond_loopback_unless_offline_was_chosen() -> None:
    assert not NodeSettings().model_required
    assert NodeSettings(host="0.0.0.0").model_required
    assert NodeSettings(models=ModelSettings(require=True)).model_required
    assert not NodeSettings(host="0.0.0.0", models=ModelSettings(offline=True)).model_required
