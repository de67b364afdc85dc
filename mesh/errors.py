"""The one error tree of mesh.

    MeshError
    ├── ConfigError            a developer or operator mistake, found at start-up; says what to do
    ├── ModelError             the model provider failed (after its own retries)
    │   └── ModelRateLimited   429 / quota
    ├── RunError               a turn could not finish
    │   └── MaxModelCallsExceeded
    ├── ToolError              raised by or about a tool; goes back to the model as a structured error
    ├── SkillInputError        typed input failed validation (-> task REJECTED, names the field)
    ├── SkillOutputError       typed output failed validation after the repair attempt
    ├── StoreError             a session/task store could not read or write
    ├── DiscoveryError         the registry / Consul could not answer
    │   └── AgentNotFound      no such agent (or no passing instance)
    ├── NetworkRefused         (mesh.netpolicy) a host is, or resolves, outside the allowed networks
    ├── PeerRefused            (mesh.trust) a peer URL is not a verified member of the mesh
    ├── FetchFailed            (mesh.outbound) a bounded GET got no whole answer; a fixed reason word
    └── RemoteError            a delegation to a peer failed; carries peer, skill and reason
            reasons: "rejected" | "unavailable" | "deadline" | "failed" | "canceled" | "invalid_output"

Third-party errors (google-genai, a2a-sdk, httpx, sqlite3, consul) are translated into this tree
once, at the module that talks to them, with ``raise X(...) from exc``.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "AgentNotFound",
    "ConfigError",
    "DiscoveryError",
    "MaxModelCallsExceeded",
    "MeshError",
    "ModelError",
    "ModelRateLimited",
    "RemoteError",
    "RemoteReason",
    "RunError",
    "SkillInputError",
    "SkillOutputError",
    "StoreError",
    "ToolError",
]


class MeshError(Exception):
    """Base class of every error mesh raises on purpose."""


class ConfigError(MeshError):
    """A mistake in how mesh was configured. The message says how to fix it."""


class ModelError(MeshError):
    """The model provider failed. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class ModelRateLimited(ModelError):
    """The provider answered 429 (quota or rate limit)."""


class RunError(MeshError):
    """A turn could not complete."""


class MaxModelCallsExceeded(RunError):
    """The model kept asking for tools past the agent's ``max_model_calls``."""


class ToolError(MeshError):
    """A tool failed. Raise it from a tool to send a clean message back to the model."""

    def __init__(self, message: str, *, kind: str = "tool_error", details: Any = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.details = details

    def to_result(self) -> dict[str, Any]:
        """The structured error the model sees as the tool's result."""
        error: dict[str, Any] = {"type": self.kind, "message": str(self)}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}


class SkillInputError(MeshError):
    """Typed skill input did not validate. ``errors`` are (field path, message) pairs."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class SkillOutputError(MeshError):
    """A skill produced output that does not match its output model (after one repair)."""


class StoreError(MeshError):
    """A persistent store failed to read or write."""


class DiscoveryError(MeshError):
    """The discovery backend (registry or Consul) could not be reached or answered badly."""


class AgentNotFound(DiscoveryError):
    """No agent of that name (or no passing instance of it) is known."""


RemoteReason = Literal[
    "rejected", "unavailable", "deadline", "failed", "canceled", "invalid_output"
]


class RemoteError(ToolError):
    """A delegation failed. Reaches the model as a tool error naming peer, skill and reason."""

    def __init__(self, message: str, *, peer: str, skill: str, reason: RemoteReason) -> None:
        super().__init__(message, kind=f"remote_{reason}", details={"peer": peer, "skill": skill})
        self.peer = peer
        self.skill = skill
        self.reason = reason
