"""mesh uses a2a-sdk through its public interfaces only, so a minor SDK upgrade needs no change.

Read from the source (no import of mesh needed): every ``a2a`` import in ``mesh/``,
``registry/`` and ``agents/`` names no private module (a ``_``-prefixed part, or one of the
SDK's internal task-machinery modules, which its packages do not export) and no private name,
and no code there reads a private attribute of an SDK object: a ``_``-prefixed name the SDK
defines (on ``self``, or as a function or method) that mesh does not define itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import a2a

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mesh", "registry", "agents")
SDK = Path(a2a.__file__).parent
#: Modules of the SDK's own task machinery: none of their names is exported by their package.
INTERNAL = frozenset(
    {
        "a2a.server.agent_execution.active_task",
        "a2a.server.agent_execution.active_task_registry",
        "a2a.server.events.event_queue_v2",
    }
)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _sources(root: Path, packages: tuple[str, ...]) -> Iterator[tuple[Path, ast.Module]]:
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(), filename=str(path))


def _defined_private(tree: ast.AST) -> set[str]:
    """The ``_``-prefixed attributes and functions a source defines."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if _private(n)}


def _sdk_private() -> set[str]:
    names: set[str] = set()
    for path in SDK.rglob("*.py"):
        names |= _defined_private(ast.parse(path.read_text()))
    return names


def _import_violations(where_: str, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        modules: list[tuple[str, list[str]]]
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in modules:
            if module.split(".")[0] != "a2a":
                continue
            where = f"{where_}:{node.lineno}"
            if any(_private(part) for part in module.split(".")) or module in INTERNAL:
                found.append(f"{where}: private module {module}")
            found += [f"{where}: private name {module}.{n}" for n in names if _private(n)]
    return found


def _attribute_violations(where_: str, tree: ast.Module, sdk: set[str], own: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr"}
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
        if name is not None and name in sdk and name not in own:
            where = f"{where_}:{getattr(node, 'lineno', 0)}"
            found.append(f"{where}: private SDK attribute {ast.unparse(node)}")
    return found


def _violations(root: Path, packages: tuple[str, ...]) -> list[str]:
    sources = list(_sources(root, packages))
    own: set[str] = set()
    for _, tree in sources:
        own |= _defined_private(tree)
    sdk = _sdk_private()
    found = []
    for path, tree in sources:
        where = str(path.relative_to(root))
        found += _import_violations(where, tree)
        found += _attribute_violations(where, tree, sdk, own)
    return found


def test_mesh_uses_only_public_sdk_interfaces() -> None:
    assert _violations(ROOT, PACKAGES) == []


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """Each kind of private use is caught (the fast path had all three before issue 12)."""
    bad = tmp_path / "mesh" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(
        "from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES\n"
        "from a2a.utils._async_queue_compat import QueueShutDown\n"
        "from a2a.server.tasks import TaskManager as _TM\n"
        "def f(handler):\n"
        "    return handler._request_context_builder, getattr(handler, '_active_task_registry')\n"
    )
    found = _violations(tmp_path, ("mesh",))
    assert len(found) == 4, found
    assert "private module a2a.server.agent_execution.active_task" in found[0]
    assert "private module a2a.utils._async_queue_compat" in found[1]
    assert any("handler._request_context_builder" in f for f in found)
    assert any("_active_task_registry" in f for f in found)
