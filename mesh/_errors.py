"""The one error tree of mesh: every error mesh raises on purpose is defined here.

    MeshError
    ├── ConfigError              a developer or operator mistake, found at start-up; says what to do
    ├── ModelError               the model provider failed (after its own retries)
    │   └── ModelRateLimited     429 / quota
    ├── RunError                 a turn could not finish
    │   ├── MaxModelCallsExceeded
    │   ├── ReplayDiverged       a re-run skill asked something else than before at a step
    │   └── SessionWaiting       a new turn in a session whose turn waits for an answer
    ├── ToolError                raised by or about a tool; the model sees it as a structured error
    │   └── RemoteError          a delegation failed: peer, skill and reason (below)
    ├── SkillInputError          typed input failed validation (-> task REJECTED, names the field)
    ├── SkillOutputError         typed output failed validation after the repair attempt
    ├── SchemaViolation          a value does not match a JSON Schema (also a ValueError)
    ├── StoreError               a session/task store could not read or write
    ├── DiscoveryError           the registry / Consul could not answer, or refused
    │   ├── AgentNotFound        no such agent (or no passing instance)
    │   ├── UnknownInstance      the backend does not know this instance: register again
    │   ├── InstanceIdTaken      the instance id belongs to another owner: take a new one
    │   └── DiscoveryUnreachable nothing answered at the backend's address: try later
    ├── NetworkRefused           a host is, or resolves, outside the allowed networks
    ├── PeerRefused              a peer URL is not a verified member of the mesh
    ├── FetchFailed              a bounded GET got no whole answer; a fixed reason word
    ├── CircuitOpen              every instance's breaker is open (a delegation: "unavailable")
    └── DeadlineExceeded         the deadline passed before an attempt succeeded ("deadline")

``RemoteError.reason`` is one of ``RemoteReason``; only ``"unavailable"`` (this instance could not
take the call: another one may) is retried, at the next instance, with the same message id
(``mesh._resilience.is_retryable``). Third-party errors (google-genai, a2a-sdk, httpx, sqlite3,
consul) are translated into this tree once, at the module that talks to them, with
``raise X(...) from exc``; for a call to a peer that module is ``mesh._a2a.client``, and the
reason of an httpx error is ``mesh._failures.reason_of``'s, which the retry policy uses too.

Not in the tree, on purpose: signals that never leave mesh, and must be another library's type
for the code that catches them (a test checks this list and the tree against the classes):

    mesh._a2a.bounded.AnswerTooLarge   an httpx.RequestError: the a2a-sdk wraps it like a failed read
    mesh._netguard.AddressRefused      an httpcore.ConnectError: httpx reports it as ConnectError
    mesh._asgi.BodyTooLarge            the gate answers 413
    mesh._asgi.BodyTimeout             the gate answers 408
    mesh._rpc_body.RpcRefused          the gate answers the JSON-RPC error it carries
    mesh._asks.Suspend                 a BaseException, like CancelledError: a skill's ask ends
                                       the run waiting, and skill code's `except Exception`
                                       must not swallow it
    mesh._pending.TurnSuspended        a BaseException, like Suspend: a tool's Ask stops the turn
                                       waiting (the runner's caller keeps its PendingTurn)
    mesh._asks.ChildWaiting            a BaseException, like Suspend: a remote skill's task asks,
                                       and the tool layer's `except Exception` must not make it a
                                       tool error (the runner relays the question)

The registry service (``registry/``) keeps its own errors, answered as HTTP errors by its API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "AgentNotFound",
    "CircuitOpen",
    "ConfigError",
    "DeadlineExceeded",
    "DiscoveryError",
    "DiscoveryUnreachable",
    "FetchFailed",
    "InstanceIdTaken",
    "MaxModelCallsExceeded",
    "MeshError",
    "ModelError",
    "ModelRateLimited",
    "NetworkRefused",
    "PeerRefused",
    "RemoteError",
    "RemoteReason",
    "ReplayDiverged",
    "RunError",
    "SchemaViolation",
    "SessionWaiting",
    "SkillInputError",
    "SkillOutputError",
    "StoreError",
    "ToolError",
    "UnknownInstance",
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


class ReplayDiverged(RunError):
    """A skill re-run on resume asked something else at a step than the run before it did
    (its asks depend on time or outside data): the task fails, since the recorded answers no
    longer fit."""


class SessionWaiting(RunError):
    """A new turn in a session whose last turn waits for an answer (a tool asked): answer that
    task, or cancel it. ``task_id`` is the waiting task."""

    def __init__(self, message: str, *, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id


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


#: Why a delegation failed. ``unavailable``: this instance could not take the call (down,
#: refused as a peer, stopped under the task, answered what no A2A node answers), so the same
#: message may go to another one; the others are answers that another attempt would repeat.
RemoteReason = Literal[
    "rejected", "unavailable", "deadline", "failed", "canceled", "invalid_output"
]


class RemoteError(ToolError):
    """A delegation failed. Reaches the model as a tool error naming peer, skill and reason;
    ``detail`` is what happened without the peer's name (the message, unless told)."""

    def __init__(
        self,
        message: str,
        *,
        peer: str,
        skill: str,
        reason: RemoteReason,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, kind=f"remote_{reason}", details={"peer": peer, "skill": skill})
        self.peer = peer
        self.skill = skill
        self.reason: RemoteReason = reason
        self.detail = message if detail is None else detail

    @classmethod
    def unavailable(cls, peer: str, skill: str, detail: str) -> RemoteError:
        """``"<peer> is unavailable: <detail>"``, the one form every unavailable delegation
        takes, whichever layer found out (``detail`` says what happened, and where)."""
        message = f"{peer} is unavailable: {detail}"
        return cls(message, peer=peer, skill=skill, reason="unavailable", detail=detail)


class SkillInputError(MeshError):
    """Typed skill input did not validate. ``errors`` are (field path, message) pairs."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class SkillOutputError(MeshError):
    """A skill produced output that does not match its output model (after one repair)."""


class SchemaViolation(MeshError, ValueError):
    """A value does not match its JSON Schema (``mesh._schema_check.check``).
    ``errors``: ``[{"field": "a.b.0", "message": ...}]``, one per problem."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))


class StoreError(MeshError):
    """A persistent store failed to read or write."""


class DiscoveryError(MeshError):
    """The discovery backend (registry or Consul) could not be reached or answered badly."""


class AgentNotFound(DiscoveryError):
    """No agent of that name (or no passing instance of it) is known."""


class UnknownInstance(DiscoveryError):
    """The backend does not know this instance (expired or lost): register again."""


class InstanceIdTaken(DiscoveryError):
    """The backend holds this instance id for another owner (it was taken while this node was
    away): register under a new instance id."""


class DiscoveryUnreachable(DiscoveryError):
    """Nothing answered at the backend's address (not running yet, or gone): try again later.
    Other ``DiscoveryError``s mean it answered, and refused or failed."""


class NetworkRefused(MeshError):
    """A URL's host is (or resolves to) an address outside the policy. The message says which
    (``mesh._netpolicy``)."""


class PeerRefused(MeshError):
    """A peer URL is not a verified member of the mesh (``mesh._trust``). The message says why
    and what to set."""


class FetchFailed(MeshError):
    """A bounded GET (``mesh._outbound``) did not produce a whole answer. ``reason`` is one of a
    fixed few words (``unreachable``, ``timeout``, ``too_large``, ``refused``: the host is
    outside the allowed networks; ``tls``: its certificate did not verify), never text from the answer; ``detail`` is for the fetcher's
    own log only (it may name resolved addresses)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class CircuitOpen(MeshError):
    """Every instance's breaker is open: nothing to try (``mesh._resilience``). A delegation
    reports it as ``RemoteError`` reason ``unavailable``."""

    def __init__(self, targets: Sequence[str]) -> None:
        super().__init__(f"circuit open for every instance: {', '.join(targets) or 'none'}")
        self.targets = tuple(targets)


class DeadlineExceeded(MeshError):
    """The call's deadline passed before an attempt succeeded (``mesh._resilience``). A
    delegation reports it as ``RemoteError`` reason ``deadline``."""
