"""compose.yaml and deploy/Dockerfile: validated by Debian's docker-compose (no engine needed)
and checked for the shape the deployment promises."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT, clean_env

COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
MESH_SERVICES = {
    "registry",
    "credit-bureau-a",
    "credit-bureau-b",
    "income-verifier",
    "underwriter",
    "loan-officer",
}
NODES = {
    "credit-bureau-a": "agents.credit_bureau:agent",
    "credit-bureau-b": "agents.credit_bureau:agent",
    "income-verifier": "agents.income_verifier:agent",
    "underwriter": "agents.underwriter:agent",
    "loan-officer": "agents.loan_officer:agent",
}
PUBLISHED = {"registry": 8400, "prometheus": 9090, "grafana": 3000}

needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (apt-get install docker-compose; see .ci/system-deps)",
)


def _config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker-compose", "-f", str(path), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=path.parent,
        env=clean_env(),
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    result = _config(COMPOSE)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


@needs_compose
def test_docker_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    # The validator is not a rubber stamp: a service without image or build is an error.
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  web:\n    ports: ['8080:80']\n")
    result = _config(broken)
    assert result.returncode != 0
    assert "web" in result.stderr


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == MESH_SERVICES | {
        "consul",
        "postgres",
        "prometheus",
        "grafana",
    }


def test_the_credit_bureau_replicas_share_postgres_with_the_password_from_a_secret(
    compose: dict[str, Any],
) -> None:
    # Issue 17: both replicas on one database; its URL names no password (visible to ps and in
    # `docker compose config`), the password is the file secret postgres is initialised with.
    password = compose["secrets"]["postgres-password"]["file"]
    assert Path(password) == ROOT / "mesh-keys" / "postgres-password"
    postgres = compose["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres-password"
    assert "POSTGRES_PASSWORD" not in postgres["environment"]
    assert [s if isinstance(s, str) else s["source"] for s in postgres["secrets"]] == [
        "postgres-password"
    ]
    assert "ports" not in postgres
    assert postgres["volumes"]
    user, db = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    stores = set()
    for name in ("credit-bureau-a", "credit-bureau-b"):
        svc = compose["services"][name]
        store = svc["environment"]["MESH_STORE"]
        assert store == f"postgresql://{user}@postgres:5432/{db}", name  # no password in it
        stores.add(store)
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        mounted = {s["source"]: s["target"] for s in svc["secrets"]}
        target = mounted["postgres-password"]
        entry = " ".join(svc["entrypoint"])
        assert f'PGPASSWORD="$(cat {target})" exec mesh "$@"' in entry.replace("$$", "$"), name
    assert len(stores) == 1
    # The other nodes keep their own SQLite file.
    for name in set(NODES) - {"credit-bureau-a", "credit-bureau-b"}:
        assert "MESH_STORE" not in compose["services"][name]["environment"], name


def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        test = svc.get("healthcheck", {}).get("test")
        assert test, f"{name} has no healthcheck"
        if name in MESH_SERVICES:
            # The slim image has no curl: the check is Python's urllib against /health.
            assert test[:3] == ["CMD", "python", "-c"], name
            assert "urllib" in test[3], name
            assert "/health" in test[3], name


def test_only_the_registry_page_prometheus_and_grafana_publish_ports(
    compose: dict[str, Any],
) -> None:
    published = {n: s["ports"] for n, s in compose["services"].items() if s.get("ports")}
    assert set(published) == set(PUBLISHED)
    for name, ports in published.items():
        assert len(ports) == 1, name
        port = ports[0]
        # docker-compose 1.x prints "127.0.0.1:8400:8400/tcp"-like strings or long syntax.
        spec = (
            port
            if isinstance(port, str)
            else f"{port['host_ip']}:{port['published']}:{port['target']}"
        )
        host_ip, published_port, target = spec.split("/")[0].split(":")
        assert host_ip == "127.0.0.1", f"{name} must publish on loopback only, got {spec}"
        assert int(published_port) == int(target) == PUBLISHED[name]


def test_mesh_services_share_one_image_built_from_deploy_dockerfile(
    compose: dict[str, Any],
) -> None:
    images = set()
    for name in MESH_SERVICES:
        svc = compose["services"][name]
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert Path(svc["build"]["context"]).resolve() == ROOT, name
        images.add(svc["image"])
    assert len(images) == 1, f"mesh services must use one image, got {images}"


def test_nodes_find_each_other_by_service_name(compose: dict[str, Any]) -> None:
    for name, module in NODES.items():
        svc = compose["services"][name]
        command = svc["command"] if isinstance(svc["command"], str) else " ".join(svc["command"])
        assert re.search(rf"\bserve {re.escape(module)}\b", command), (name, command)
        port = re.search(r"--port (\d+)", command)
        assert port, f"{name}: no --port in {command!r}"
        assert "--host 0.0.0.0" in command, name
        env = svc["environment"]
        assert env["MESH_PUBLIC_URL"] == f"http://{name}:{port.group(1)}"
        assert env["MESH_DISCOVERY"] == "consul://consul:8500"
        assert env["MESH_REGISTRY"] == "http://registry:8400"
        assert {"consul", "registry"} <= set(svc["depends_on"])
    bureaus = [n for n, m in NODES.items() if m == "agents.credit_bureau:agent"]
    assert len(bureaus) == 2, "the credit bureau runs two replicas"


def test_registry_reads_consul(compose: dict[str, Any]) -> None:
    registry = compose["services"]["registry"]
    assert "--backend consul://consul:8500" in registry["command"]
    assert "--port 8400" in registry["command"]
    assert registry["environment"]["MESH_PORT"] == "8400"  # what the image's healthcheck asks


def test_secrets_are_passed_through_never_written(compose: dict[str, Any]) -> None:
    for name in MESH_SERVICES:
        env = compose["services"][name]["environment"]
        for secret in ("MESH_REGISTRY_TOKEN", "MESH_TOKEN", "CONSUL_HTTP_TOKEN", "GOOGLE_API_KEY"):
            assert secret in env, f"{name}: {secret} is not passed through"
            assert env.get(secret, None) is None, f"{name}: {secret} must come from the host"


def test_each_node_mounts_its_agents_keys_as_file_secrets(compose: dict[str, Any]) -> None:
    # Issue 16: the key, the certificate and the root's public key are Compose secrets (files
    # mounted where MESH_KEYS points), never environment values; the root's private key is
    # never mounted.
    files = {name: Path(spec["file"]) for name, spec in compose["secrets"].items()}
    assert all(not str(f).endswith("root.key.jwk") for f in files.values())
    for name, module in NODES.items():
        agent = module.split(".")[1].split(":")[0].replace("_", "-")
        svc = compose["services"][name]
        folder = svc["environment"]["MESH_KEYS"]
        mounted = {
            s["target"]: files[s["source"]]
            for s in svc["secrets"]
            if s["source"] != "postgres-password"  # the bureau's database (test above)
        }
        assert mounted == {
            f"{folder}/key.jwk": ROOT / "mesh-keys" / "agents" / agent / "key.jwk",
            f"{folder}/cert.jwt": ROOT / "mesh-keys" / "agents" / agent / "cert.jwt",
            f"{folder}/root.jwk": ROOT / "mesh-keys" / "root.jwk",
        }, name


def test_the_call_policy_names_what_the_desk_calls(compose: dict[str, Any]) -> None:
    # MESH_ALLOW parses, and every rule names a skill its agent has (a node would refuse to
    # start otherwise).
    import importlib

    from mesh._policy import CallPolicy

    policy = CallPolicy.parse(compose["services"]["loan-officer"]["environment"]["MESH_ALLOW"])
    for module in set(NODES.values()):
        path, _, attr = module.partition(":")
        agent = getattr(importlib.import_module(path), attr)
        policy.check(agent.name, [s.id for s in agent.all_skills])
    assert policy.for_agent("credit-bureau").allows("loan-officer", "score")
    assert not policy.for_agent("credit-bureau").allows("underwriter", "score")


def test_monitoring_mounts_the_files_in_deploy(compose: dict[str, Any]) -> None:
    mounts = {
        name: [
            v if isinstance(v, str) else f"{v['source']}:{v['target']}"
            for v in svc.get("volumes", [])
        ]
        for name, svc in compose["services"].items()
    }
    assert any(
        m.startswith(f"{ROOT / 'deploy/prometheus'}:/etc/prometheus") for m in mounts["prometheus"]
    )
    assert any(m.startswith(f"{ROOT / 'deploy/grafana/provisioning'}:") for m in mounts["grafana"])
    assert any(m.startswith(f"{ROOT / 'deploy/grafana/dashboards'}:") for m in mounts["grafana"])
    assert (
        "--config.file=/etc/prometheus/prometheus.yml"
        in compose["services"]["prometheus"]["command"]
    )


# -- the Dockerfile --------------------------------------------------------------------------------


def _stages(text: str) -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_dockerfile_is_multi_stage_slim_non_root_with_a_python_healthcheck() -> None:
    stages = _stages(DOCKERFILE.read_text())
    assert len(stages) >= 2, "build wheels in one stage, run in another"
    assert all(re.match(r"FROM python:3\.11-slim\b", s[0]) for s in stages)
    build, runtime = stages[0], stages[-1]
    assert any("pip wheel" in i for i in build)
    runtime_text = "\n".join(runtime)
    assert "--no-index" in runtime_text, "the runtime installs only the built wheels"
    assert not re.search(r"apt-get|build-essential|gcc", runtime_text), "no build tools at runtime"
    users = [i.split()[1] for i in runtime if i.upper().startswith("USER ")]
    assert users
    assert users[-1].split(":")[0] not in ("root", "0")
    health = [i for i in runtime if i.upper().startswith("HEALTHCHECK")]
    assert len(health) == 1
    assert "urllib" in health[0]
    assert "/health" in health[0]
    assert "curl" not in health[0]
    assert any(i.startswith("ENTRYPOINT") and "mesh" in i for i in runtime)


def test_the_image_has_the_postgresql_driver() -> None:
    runtime = "\n".join(_stages(DOCKERFILE.read_text())[-1])
    assert "'mesh-agents[postgres]'" in runtime
    assert "'.[postgres]'" in DOCKERFILE.read_text()


def test_dockerfile_copies_what_the_package_needs() -> None:
    text = DOCKERFILE.read_text()
    for path in ("pyproject.toml", "README.md", "mesh", "registry", "agents"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", text, re.M), path
        assert (ROOT / path).exists(), path
