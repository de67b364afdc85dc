"""Suite-wide guards: no test reaches a real model provider or a real registry by accident."""

from __future__ import annotations

import pytest

# Variables that would switch a test onto Gemini, Vertex, Consul or someone's registry.
_LEAKY_ENV = (
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_ENTERPRISE",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_GENAI_API_VERSION",
    "GOOGLE_GEMINI_BASE_URL",
    "MESH_REGISTRY",
    "MESH_REGISTRY_TOKEN",
    "MESH_DISCOVERY",
    "MESH_DATA_DIR",
    "MESH_PUBLIC_URL",
)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    # Tests marked `gemini` or `consul` talk to the real service on purpose.
    if request.node.get_closest_marker("gemini") or request.node.get_closest_marker("consul"):
        return
    for name in _LEAKY_ENV:
        monkeypatch.delenv(name, raising=False)
