"""deploy/prometheus/*.yml: valid for promtool, and their relabelling gives every node series
``agent`` and ``instance`` labels when a real Prometheus discovers targets with them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import ROOT, Proc, free_port, wait_for, wait_until_ok

PROM_DIR = ROOT / "deploy" / "prometheus"
# Debian builds Prometheus without Consul SD ("Disable Consul SD until its Debian package is back
# in shape"); upstream builds have it. These are the keys upstream's consul_sd_config accepts.
CONSUL_SD_KEYS = {
    "server", "path_prefix", "token", "datacenter", "namespace", "partition", "scheme",
    "username", "password", "services", "tags", "node_meta", "tag_separator", "allow_stale",
    "refresh_interval", "filter", "basic_auth", "authorization", "oauth2", "proxy_url",
    "no_proxy", "proxy_from_environment", "proxy_connect_header", "follow_redirects",
    "enable_http2", "tls_config",
}  # fmt: skip

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (apt-get install prometheus; see .ci/system-deps)",
)
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not installed (apt-get install prometheus; see .ci/system-deps)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=60, check=False
    )


def load(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((PROM_DIR / name).read_text())
    return config


def job(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(j for j in config["scrape_configs"] if j["job_name"] == name)


def loopback(config: dict[str, Any]) -> dict[str, Any]:
    """The config with the registry's static target moved to a closed loopback port (tests
    reach nothing but 127.0.0.1), and fast intervals."""
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    for static in job(config, "mesh-registry")["static_configs"]:
        static["targets"] = [f"127.0.0.1:{free_port()}"]
    return config


# -- promtool --------------------------------------------------------------------------------------


@needs_promtool
def test_promtool_accepts_the_registry_http_sd_config() -> None:
    result = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    nodes = job(load("prometheus.yml"), "mesh-nodes")
    assert nodes["http_sd_configs"][0]["url"] == "http://registry:8400/v1/prometheus/targets"


@needs_promtool
def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    broken = tmp_path / "p.yml"
    broken.write_text(
        "scrape_configs:\n  - job_name: x\n    relabel_configs:\n      - action: nope\n"
    )
    assert promtool("check", "config", str(broken)).returncode != 0


@needs_promtool
def test_promtool_accepts_the_consul_sd_config(tmp_path: Path) -> None:
    path = PROM_DIR / "prometheus-consul.yml"
    result = promtool("check", "config", str(path))
    if result.returncode == 0:
        return  # an upstream promtool, with Consul SD compiled in
    output = result.stdout + result.stderr
    assert "field consul_sd_configs not found" in output, output
    # This promtool lacks Consul SD: check everything else with the SD swapped for file SD,
    # and the consul_sd block's keys against upstream's schema.
    config = load("prometheus-consul.yml")
    for scrape in config["scrape_configs"]:
        for sd in scrape.pop("consul_sd_configs", []):
            assert set(sd) <= CONSUL_SD_KEYS, (
                f"unknown consul_sd_configs keys {set(sd) - CONSUL_SD_KEYS}"
            )
            assert re.fullmatch(r"[\w.-]+:\d+", sd["server"]), sd["server"]
            scrape["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
    swapped = tmp_path / "prometheus-consul-file-sd.yml"
    swapped.write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(swapped))
    assert result.returncode == 0, result.stdout + result.stderr


# -- relabelling, by a real Prometheus --------------------------------------------------------------


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Any]:
    procs: list[Proc] = []

    def start(config: dict[str, Any]) -> str:
        n = len(procs)
        path = tmp_path / f"prometheus-{n}.yml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        proc = Proc.start(
            [
                "prometheus",
                f"--config.file={path}",
                f"--storage.tsdb.path={tmp_path / f'tsdb-{n}'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            name=f"prometheus-{n}",
            tmp=tmp_path,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_until_ok(f"{url}/-/ready", proc=proc, timeout=30)
        return url

    yield start
    for proc in procs:
        proc.terminate()


def targets(prom: str, job_name: str, *, count: int) -> dict[str, Any]:
    """Active and dropped targets of ``job_name`` once ``count`` were discovered."""

    def ready() -> dict[str, Any] | None:
        data = httpx.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]
        active = [t for t in data["activeTargets"] if t["labels"].get("job") == job_name]
        dropped = [
            t for t in data["droppedTargets"] if t["discoveredLabels"].get("job") == job_name
        ]
        return (
            {"active": active, "dropped": dropped} if len(active) + len(dropped) >= count else None
        )

    return wait_for(ready, timeout=30, what=f"{count} targets of {job_name}")


@pytest.mark.integration
@pytest.mark.prometheus
@needs_prometheus
def test_consul_relabelling_gives_agent_instance_and_version(
    tmp_path: Path, prometheus_factory: Any
) -> None:
    # The __meta_consul_* labels Consul SD attaches, fed through file SD (which keeps __meta
    # labels for relabelling): the same relabel rules run on them.
    def meta(service: str, sid: str, url: str, **extra: str) -> dict[str, str]:
        labels = {
            "__meta_consul_service": service,
            "__meta_consul_service_id": sid,
            "__meta_consul_service_metadata_url": url,
        }
        labels.update({f"__meta_consul_service_metadata_{k}": v for k, v in extra.items()})
        return labels

    p1, p2, p3, p4 = free_port(), free_port(), free_port(), free_port()
    groups = [
        {"targets": [f"127.0.0.1:{p1}"], "labels": meta("credit-bureau", "cb-1", f"http://127.0.0.1:{p1}", card_path="/c", version="1.2.0")},
        {"targets": [f"127.0.0.1:{p2}"], "labels": meta("loan-officer", "lo-1", f"https://127.0.0.1:{p2}", card_path="/c", version="0.3")},
        {"targets": [f"127.0.0.1:{p3}"], "labels": meta("consul", "consul", "")},
        {"targets": [f"127.0.0.1:{p4}"], "labels": meta("income-verifier", "iv-1", f"http://127.0.0.1:{p4}/mesh/verifier/", card_path="/c", version="1")},
    ]  # fmt: skip
    sd_file = tmp_path / "consul-targets.json"
    sd_file.write_text(json.dumps(groups))
    config = loopback(load("prometheus-consul.yml"))
    nodes = job(config, "mesh-nodes")
    del nodes["consul_sd_configs"]
    nodes["file_sd_configs"] = [{"files": [str(sd_file)]}]
    prom = prometheus_factory(config)

    found = targets(prom, "mesh-nodes", count=4)
    labels = {t["labels"]["instance"]: t for t in found["active"]}
    assert set(labels) == {"cb-1", "lo-1", "iv-1"}, "consul itself is not a mesh node"
    assert labels["cb-1"]["labels"]["agent"] == "credit-bureau"
    assert labels["cb-1"]["labels"]["version"] == "1.2.0"
    assert labels["cb-1"]["scrapeUrl"] == f"http://127.0.0.1:{p1}/metrics"
    assert labels["lo-1"]["labels"]["agent"] == "loan-officer"
    assert labels["lo-1"]["scrapeUrl"] == f"https://127.0.0.1:{p2}/metrics"
    # A node behind a path prefix is scraped under it (Prometheus knows only address:port).
    assert labels["iv-1"]["scrapeUrl"] == f"http://127.0.0.1:{p4}/mesh/verifier/metrics"
    assert [t["discoveredLabels"]["__meta_consul_service"] for t in found["dropped"]] == ["consul"]


@pytest.mark.integration
@pytest.mark.prometheus
@needs_prometheus
def test_registry_http_sd_relabelling_keeps_the_instance_id(
    tmp_path: Path, prometheus_factory: Any
) -> None:
    # The registry's /v1/prometheus/targets answer, served by a real HTTP server.
    p1, p2 = free_port(), free_port()
    answer = [
        {"targets": [f"127.0.0.1:{p1}"], "labels": {"agent": "credit-bureau", "version": "1", "instance": "cb-7f3a"}},
        {"targets": [f"127.0.0.1:{p2}"], "labels": {"version": "1"}},
    ]  # fmt: skip
    root = tmp_path / "sd"
    (root / "v1" / "prometheus").mkdir(parents=True)
    # .json: http.server then says application/json, which HTTP SD requires.
    (root / "v1" / "prometheus" / "targets.json").write_text(json.dumps(answer))
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with Proc.start([*argv, "--directory", str(root)], name="sd", tmp=tmp_path) as sd:
        sd_url = f"http://127.0.0.1:{port}/v1/prometheus/targets.json"
        wait_until_ok(sd_url, proc=sd)
        config = loopback(load("prometheus.yml"))
        nodes = job(config, "mesh-nodes")
        nodes["http_sd_configs"][0].update(url=sd_url, refresh_interval="1s")
        prom = prometheus_factory(config)
        found = targets(prom, "mesh-nodes", count=2)
    assert [(t["labels"]["agent"], t["labels"]["instance"]) for t in found["active"]] == [
        ("credit-bureau", "cb-7f3a")
    ]
    assert len(found["dropped"]) == 1, "a group without an agent label is not scraped"
