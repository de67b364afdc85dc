from __future__ import annotations

import pytest

from mesh.errors import ConfigError
from mesh.settings import DEFAULT_REGISTRY, NodeSettings


def test_node_registers_with_the_default_registry_unless_told_otherwise() -> None:
    s = NodeSettings.from_env({}, agent_name="a")
    assert s.registry == DEFAULT_REGISTRY
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
