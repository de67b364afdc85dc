"""Issue 19 item 5: a node imports what its first request needs, nothing more. ``import mesh``
and building a node (an agent with one typed skill, no keys, no registry: what ``mesh serve``
does before it listens, app included) must not import the modules only some nodes need: PyJWT
and cryptography (keys), tenacity (push retries, the registrar, delegation's retries), a model
provider's SDK, JSON Schema, templates, gRPC. Checked in a fresh interpreter: ``sys.modules`` of
this one holds whatever earlier tests imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, clean_env, free_port

# The modules a keyless typed node does not need before (or at) its first request.
HEAVY = (
    "jwt",  # mesh keys: call tokens, signed cards
    "cryptography",
    "tenacity",  # push delivery retries, the registrar's backoff, delegation retries
    "google.genai",  # the Gemini model
    "jsonschema",
    "jinja2",
    "grpc",
)

BUILD = """
import asyncio, json, ssl, sys

# Every CA store loaded (httpx's certifi bundle, the system's): counted.
loaded_stores = []
_create = ssl.create_default_context
def counted(*args, **kwargs):
    loaded_stores.append(kwargs.get("cafile") or "system")
    return _create(*args, **kwargs)
ssl.create_default_context = counted

import mesh
from mesh import Agent, MeshSettings, Node, NodeSettings, skill
from pydantic import BaseModel

class Ask(BaseModel):
    applicant_id: str

class Score(BaseModel):
    score: int

async def score(req: Ask) -> Score:
    '''Score an applicant.'''
    return Score(score=700)

agent = Agent(name="import-cost", skills=[skill(score, id="score")])
settings = NodeSettings.build(
    MeshSettings.from_environment(), agent_name=agent.name, port=8999,
    data_dir=sys.argv[1], no_register=True,
)
node = Node(agent, settings)
assert node.app is not None
print(json.dumps(sorted(sys.modules)))

async def start_and_stop():
    async with node.app.router.lifespan_context(node.app):
        print(json.dumps(sorted(sys.modules)))

asyncio.run(start_and_stop())
print(json.dumps(loaded_stores))
"""

# Nor does it need these to start: its first push delivery opens the outbox's guarded client
# (httpcore, h11), an LLM node checks for the scripted model, a misspelt skill asks difflib;
# FastAPI imports pydantic.v1 to check a route's typed parameter or return annotation.
HEAVY_TO_START = (
    "httpcore",
    "h11",
    "mesh._netguard",
    "mesh._models.scripted",
    "difflib",
    "pydantic.v1",
)


def _script(script: str, *args: str) -> list[str]:
    """The lines ``script`` printed, run in a fresh interpreter (its exit checked)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The lines the script printed: the modules after building, once started, and the CA
    stores loaded by then."""
    return _script(BUILD, str(tmp_path_factory.mktemp("node")))[-3:]


def test_building_a_node_imports_no_module_its_first_request_does_not_need(
    built: list[str],
) -> None:
    loaded = set(json.loads(built[0]))
    found = {
        heavy: sorted(m for m in loaded if m == heavy or m.startswith(heavy + "."))[:3]
        for heavy in HEAVY
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_starting_a_node_imports_no_module_its_first_request_does_not_need(
    built: list[str],
) -> None:
    loaded = set(json.loads(built[1]))
    found = {
        heavy: sorted(m for m in loaded if m == heavy or m.startswith(heavy + "."))[:3]
        for heavy in HEAVY + HEAVY_TO_START
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_a_node_serving_http_loads_no_ca_store_to_start(built: list[str]) -> None:
    """~50 ms each: httpx's own context (thrown away with the pool mesh replaces) and the
    system's trust store, which a node reads at its first https connection instead."""
    assert json.loads(built[2]) == []


def test_each_command_is_registered_by_the_module_main_imports_for_it() -> None:
    """``mesh serve`` builds only its own module's parsers (mesh._cli.main._COMMANDS): the table
    must name, for every command, the module that registers it."""
    import argparse
    import importlib

    from mesh._cli import main

    registered: dict[str, str] = {}
    for name in main._COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).add_parsers(sub)
        registered |= dict.fromkeys(sub.choices, name)
    assert registered == main._COMMANDS


SERVE = """
import gc, json, sys
import uvicorn
import mesh._cli.serve as serve
from mesh._cli.main import main

seen = {}
load_agent = serve.load_agent
def loading(target):
    seen["collecting while the agent loads"] = gc.isenabled()
    return load_agent(target)
serve.load_agent = loading

async def ready(self):
    seen["collecting when ready"] = gc.isenabled()
    seen["frozen when ready"] = gc.get_freeze_count()
    self.should_exit = True
uvicorn.Server.main_loop = ready

code = main(["serve", "tests.bench.agents.specialist:agent", "--port", sys.argv[1],
             "--data-dir", sys.argv[2], "--no-register"])
seen["exit"] = code
seen["collecting after"] = gc.isenabled()
seen["command modules"] = sorted(m for m in sys.modules if m.startswith("mesh._cli."))
print(json.dumps(seen))
"""


@pytest.mark.integration
def test_mesh_serve_starts_without_the_collector_then_freezes_what_it_built(
    tmp_path: Path,
) -> None:
    """Start-up allocates ~160,000 objects: the collector's passes over them cost ~70 ms of a
    node's start. ``mesh serve`` pauses it until the node is ready, then freezes the start-up's
    objects (no later pass scans them) and collects again. It loads no other command's module."""
    seen = json.loads(_script(SERVE, str(free_port()), str(tmp_path / "node"))[-1])
    assert seen.pop("frozen when ready") > 10_000
    assert seen == {
        "collecting while the agent loads": False,
        "collecting when ready": True,
        "exit": 0,
        "collecting after": True,
        # serve's own and its log lines' (mesh._cli.log_lines): no other command's.
        "command modules": ["mesh._cli.log_lines", "mesh._cli.main", "mesh._cli.serve"],
    }
