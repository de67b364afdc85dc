"""The registry's JSON shapes (pydantic at the process boundary; OpenAPI comes from these)."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mesh.discovery.base import CARD_PATH, Status
from registry.store import AgentRecord, InstanceRecord, SkillRecord

__all__ = [
    "AgentDetail",
    "AgentList",
    "AgentSummary",
    "ErrorBody",
    "InstanceCounts",
    "InstanceList",
    "InstanceOut",
    "RegisterBody",
    "RegisteredOut",
    "SkillOut",
    "TargetGroup",
]

_AGENT_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class RegisterBody(BaseModel):
    """What a node sends to register. The registry reads everything else from its card."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    url: str = Field(description="base URL of the instance, e.g. http://127.0.0.1:8017")
    agent: str = Field(description="agent name; must equal the card's name")
    version: str = Field(default="", max_length=100)
    card_path: str = Field(default=CARD_PATH, max_length=200)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http(s) URL such as http://127.0.0.1:8017")
        if parts.query or parts.fragment:
            raise ValueError("must be a base URL without query or fragment")
        return value.rstrip("/")

    @field_validator("agent")
    @classmethod
    def _agent(cls, value: str) -> str:
        if not _AGENT_NAME.match(value):
            raise ValueError("must be lowercase letters, digits and '-', starting with a letter")
        return value

    @field_validator("card_path")
    @classmethod
    def _card_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class ErrorBody(BaseModel):
    error: str
    message: str


class InstanceOut(BaseModel):
    instance_id: str
    agent: str
    url: str
    version: str
    status: Status
    status_reason: str
    status_changed_at: float
    last_heartbeat_at: float
    registered_at: float
    skills: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, rec: InstanceRecord, agent: AgentRecord | None) -> InstanceOut:
        return cls(
            instance_id=rec.instance_id,
            agent=rec.agent,
            url=rec.url,
            version=rec.version,
            status=rec.status,
            status_reason=rec.status_reason,
            status_changed_at=rec.status_changed_at,
            last_heartbeat_at=rec.last_heartbeat_at,
            registered_at=rec.registered_at,
            skills=[s.id for s in agent.skills] if agent else [],
        )


class RegisteredOut(InstanceOut):
    """The answer to a registration: the stored instance, and the secret that owns it."""

    secret: str = Field(
        description="send it as 'Mesh-Instance-Secret' to heartbeat, re-register or "
        "deregister this instance; the registry keeps only its hash"
    )


class InstanceList(BaseModel):
    instances: list[InstanceOut]


class SkillOut(BaseModel):
    id: str
    name: str
    description: str
    tags: list[str]
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    @classmethod
    def of(cls, rec: SkillRecord, *, schemas: bool) -> SkillOut:
        return cls(
            id=rec.id,
            name=rec.name,
            description=rec.description,
            tags=list(rec.tags),
            input_schema=rec.input_schema if schemas else None,
            output_schema=rec.output_schema if schemas else None,
        )


class InstanceCounts(BaseModel):
    passing: int
    total: int


class AgentSummary(BaseModel):
    name: str
    description: str
    version: str
    skills: list[SkillOut]
    tags: list[str]
    instances: InstanceCounts


class AgentList(BaseModel):
    agents: list[AgentSummary]


class AgentDetail(BaseModel):
    name: str
    description: str
    version: str
    card: dict[str, Any]
    skills: list[SkillOut]
    tags: list[str]
    instances: list[InstanceOut]


class TargetGroup(BaseModel):
    """One Prometheus HTTP SD target group."""

    targets: list[str]
    labels: dict[str, str]


StatusFilter = Literal["passing", "warning", "critical", "any"]
