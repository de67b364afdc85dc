"""The error tree drawn in ``mesh/_errors.py`` is the tree of the real classes: every error mesh
defines is in it (under the parent the drawing shows, defined in ``mesh._errors``), or in the
docstring's list of signals kept out of it on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import mesh
import mesh._errors
from mesh._errors import MeshError

_LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z]\w+)\b")
_OUTSIDE = re.compile(r"^\s+(?P<path>mesh(?:\.\w+)+)\.(?P<name>[A-Z]\w+)\s")


def _drawn() -> dict[str, str | None]:
    """``{class name: parent name}`` as the docstring draws it (the root's parent is None)."""
    doc = mesh._errors.__doc__ or ""
    lines = doc[doc.index("    MeshError") :].split("\n\n", 1)[0].splitlines()
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        match = _LINE.match(line.strip("\n")[4:])
        assert match, line
        depth = len(match["indent"]) // 4
        stack = stack[:depth]
        parents[match["name"]] = stack[-1][1] if stack else None
        stack.append((depth, match["name"]))
    return parents


def _outside() -> set[str]:
    """``module.Class`` names the docstring lists as kept out of the tree."""
    doc = mesh._errors.__doc__ or ""
    section = doc[doc.index("Not in the tree") :]
    return {
        f"{m['path']}.{m['name']}" for line in section.splitlines() if (m := _OUTSIDE.match(line))
    }


def _mesh_exceptions() -> dict[str, type[BaseException]]:
    """Every public exception class defined in a module of the mesh package."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(mesh.__path__, "mesh."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = value
    return found


def test_the_drawing_is_the_tree_of_the_classes() -> None:
    drawn = _drawn()
    assert drawn["MeshError"] is None
    for name, parent in drawn.items():
        cls = getattr(mesh._errors, name)
        assert cls.__module__ == "mesh._errors", f"{name} is drawn but defined in {cls.__module__}"
        if parent is not None:
            mesh_bases = [b.__name__ for b in cls.__bases__ if issubclass(b, MeshError)]
            assert mesh_bases == [parent], f"{name}: drawn under {parent}, subclasses {mesh_bases}"
    exported = {n for n in mesh._errors.__all__ if inspect.isclass(getattr(mesh._errors, n))}
    assert exported == set(drawn)


def test_every_error_mesh_defines_is_drawn_or_listed_as_kept_out() -> None:
    drawn, outside = set(_drawn()), _outside()
    found = _mesh_exceptions()
    in_tree = {path for path, cls in found.items() if issubclass(cls, MeshError)}
    assert {path.rsplit(".", 1)[1] for path in in_tree} == drawn
    assert all(path.startswith("mesh._errors.") for path in in_tree), sorted(in_tree)
    assert set(found) - in_tree == outside
