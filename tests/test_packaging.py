"""pyproject.toml installs without deprecation noise."""

from __future__ import annotations

import tomllib

from packaging.licenses import canonicalize_license_expression
from packaging.requirements import Requirement

from tests.support import ROOT


def test_license_is_an_spdx_string_the_build_backend_understands() -> None:
    # A `{text = ...}` table made setuptools >= 77 print a deprecation on every install step.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    license = project["project"]["license"]
    assert isinstance(license, str), f"project.license should be an SPDX string, got {license!r}"
    assert canonicalize_license_expression(license) == license
    # setuptools reads SPDX strings from 77.0.0 on (older ones reject them): require it.
    backend = {r.name: r.specifier for r in map(Requirement, project["build-system"]["requires"])}
    assert "setuptools" in backend
    assert not backend["setuptools"].contains("76.9")
    assert backend["setuptools"].contains("77.0.0")
