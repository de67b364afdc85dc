"""deploy/k8s: plain manifests, parsed and checked for what a cluster needs to run the desk
safely (no cluster here: the checks are structural)."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml

from mesh._meshfile import MeshFile
from tests.support import ROOT

K8S = ROOT / "deploy" / "k8s"
AGENTS = {
    "credit-bureau": ("agents.credit_bureau:agent", 2),
    "income-verifier": ("agents.income_verifier:agent", 1),
    "underwriter": ("agents.underwriter:agent", 1),
    "loan-officer": ("agents.loan_officer:agent", 1),
}


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def workloads() -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] in ("Deployment", "StatefulSet")]


def test_every_object_has_api_version_kind_name_and_the_mesh_namespace() -> None:
    docs = documents()
    assert docs
    for doc in docs:
        assert doc.get("apiVersion"), doc
        assert doc.get("kind"), doc
        assert doc["metadata"].get("name"), doc
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "mesh", doc["metadata"]["name"]
    assert find("Namespace", "mesh")


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_each_agent_has_a_deployment_and_a_matching_service(agent: str) -> None:
    module, replicas = AGENTS[agent]
    deployment = find("Deployment", agent)
    service = find("Service", agent)
    spec = deployment["spec"]
    assert spec["replicas"] == replicas
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = spec["template"]["spec"]["containers"]
    assert container["args"][:2] == ["serve", module]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in port_names or port["targetPort"] in port_names.values()
    env = {e["name"]: e for e in container["env"]}
    # Each replica advertises its own pod address, so callers can fail over between them.
    assert env["MESH_PUBLIC_URL"]["value"].startswith("http://$(POD_IP):")
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert list(env).index("POD_IP") < list(env).index("MESH_PUBLIC_URL")


def test_registry_is_one_replica_with_persistent_storage() -> None:
    registry = find("StatefulSet", "registry")
    assert registry["spec"]["replicas"] == 1
    (claim,) = registry["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    (container,) = registry["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "registry"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"
    assert "--data-dir" in container["args"]
    assert container["args"][container["args"].index("--data-dir") + 1] == "/data"
    assert find("Service", "registry")["spec"]["ports"][0]["port"] == 8400


@pytest.mark.parametrize("workload", [w["metadata"]["name"] for w in workloads()])
def test_probes_resources_security_and_scrape_annotations(workload: str) -> None:
    (doc,) = [w for w in workloads() if w["metadata"]["name"] == workload]
    pod = doc["spec"]["template"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    pod_security = pod["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] != 0
    for container in pod["spec"]["containers"]:
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert int(annotations["prometheus.io/port"]) in ports.values()
        for probe in ("readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] == "/health", probe
            assert get["port"] in ports or get["port"] in ports.values(), probe
        resources = container["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[kind]), kind
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"]["drop"] == ["ALL"]
        # A read-only root needs somewhere writable for data and temp files.
        assert {"/data", "/tmp"} <= {m["mountPath"] for m in container["volumeMounts"]}


def test_no_secret_values_in_manifests() -> None:
    for doc in documents():
        assert doc["kind"] != "Secret", "secrets are created by the operator, not committed"
        for workload in [doc] if doc["kind"] in ("Deployment", "StatefulSet") else []:
            for container in workload["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    if env["name"].endswith(("TOKEN", "API_KEY")):
                        assert "value" not in env, env["name"]
                        assert env["valueFrom"]["secretKeyRef"]["name"] == "mesh-secrets"


def test_every_agent_gets_the_mesh_token_from_the_secret() -> None:
    for doc in documents():
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            names = {env["name"] for env in container.get("env", [])}
            assert "MESH_TOKEN" in names, doc["metadata"]["name"]


def test_every_agent_mounts_its_key_and_the_root_from_secrets() -> None:
    # Issue 16: a Secret per agent key (key.jwk, cert.jwt) and one for the root's public key,
    # projected read-only into the folder MESH_KEYS names; never the root's private key.
    for agent in AGENTS:
        spec = find("Deployment", agent)["spec"]["template"]["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        folder = env["MESH_KEYS"]["value"]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == folder)
        assert mount["readOnly"] is True
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        sources = {
            s["secret"]["name"]: {i["key"]: i["path"] for i in s["secret"]["items"]}
            for s in volume["projected"]["sources"]
        }
        assert sources == {
            f"mesh-key-{agent}": {"key.jwk": "key.jwk", "cert.jwt": "cert.jwt"},
            "mesh-root": {"root.jwk": "root.jwk"},
        }
        # Readable by the node's group (fsGroup 10001), by nobody else.
        assert volume["projected"]["defaultMode"] == 0o440
        assert spec["securityContext"]["fsGroup"] == 10001


def test_the_call_policy_names_skills_the_desk_has() -> None:
    import importlib

    from mesh._policy import CallPolicy

    policy = CallPolicy.parse(find("ConfigMap", "mesh-config")["data"]["MESH_ALLOW"])
    for module, _ in AGENTS.values():
        path, _, attr = module.partition(":")
        agent = getattr(importlib.import_module(path), attr)
        policy.check(agent.name, [s.id for s in agent.all_skills])
    assert policy.for_agent("underwriter").allows("loan-officer", "review")


def test_config_map_holds_a_valid_mesh_file_matching_the_deployments() -> None:
    config = find("ConfigMap", "mesh-config")
    text = config["data"]["mesh.toml"]
    meshfile = MeshFile.model_validate(tomllib.loads(text))
    assert {name: (node.module, node.replicas) for name, node in meshfile.nodes.items()} == AGENTS
    assert config["data"]["MESH_REGISTRY"].startswith("http://registry.mesh.svc")
    # The mesh file in the ConfigMap describes the same desk as the one `mesh up` runs.
    local = tomllib.loads((ROOT / "agents" / "mesh.toml").read_text())
    assert {n: v["module"] for n, v in local["nodes"].items()} == {
        n: m for n, (m, _) in AGENTS.items()
    }


# -- Kubernetes' own schemas ----------------------------------------------------------------------

# The versions docs/production.md names: the oldest the manifests support and the newest schema
# kubernetes-validate ships. Strict: a misspelt field is an error, as `kubectl apply
# --validate=strict` makes it.
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_passes_kubernetes_own_schema(version: str) -> None:
    import kubernetes_validate

    docs = documents()
    failures = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            failures.append(f"{doc['kind']}/{doc['metadata']['name']} {where}: {exc.message}")
    assert failures == []
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "StatefulSet", "Deployment"}


def test_the_schema_check_catches_a_misspelt_field() -> None:
    # What the check above would say about a manifest a person got wrong.
    import kubernetes_validate

    deployment = find("Deployment", "credit-bureau")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    deployment = find("Deployment", "credit-bureau")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError, match="'two' is not of type"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_the_credit_bureau_replicas_share_an_external_postgres_from_a_secret() -> None:
    # Issue 17: MESH_STORE from the Secret the operator creates (not optional: a replica
    # without it would keep its tasks alone); the database is external, not a workload here.
    (container,) = find("Deployment", "credit-bureau")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["MESH_STORE"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "mesh-store-credit-bureau", "key": "url"}
    assert "value" not in env["MESH_STORE"]
    for doc in workloads():
        images = [c["image"] for c in doc["spec"]["template"]["spec"]["containers"]]
        assert not any("postgres" in image for image in images), doc["metadata"]["name"]
    for agent, (_, replicas) in AGENTS.items():
        if replicas == 1:
            (single,) = find("Deployment", agent)["spec"]["template"]["spec"]["containers"]
            assert "MESH_STORE" not in {e["name"] for e in single.get("env", [])}, agent
