"""The registry's JSON shapes (pydantic at the process boundary; OpenAPI comes from these)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mesh._discovery.base import CARD_PATH, Status
from registry.store import AgentRecord, InstanceRecord, SkillRecord

__all__ = [
    "AGENT_NAME_PATTERN",
    "CARD_PATH_PATTERN",
    "URL_PATTERN",
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
    "card_path_problem",
    "url_problem",
]

# The URL rules, stated once: the OpenAPI schema publishes these patterns and the validators
# below apply the same ones (with ``fullmatch``: a JSON Schema ``$`` is the end of the text,
# Python's also matches before a final newline). Every repetition is separated by a character
# it cannot contain, so no input backtracks for long.
AGENT_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,62}$"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_SEGMENT_CHARS = r"[A-Za-z0-9._~!$&'()*+,;=:@-]"  # RFC 3986 pchar without '%'
URL_PATTERN = (
    rf"^https?://(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?"
    rf"(?:/{_SEGMENT_CHARS}*)*$"
)
CARD_PATH_PATTERN = rf"^/(?:{_SEGMENT_CHARS}+(?:/{_SEGMENT_CHARS}+)*/?)?$"
_URL_MAX = 2048
_CARD_PATH_MAX = 200
_AGENT_NAME = re.compile(AGENT_NAME_PATTERN[:-1])
_URL = re.compile(URL_PATTERN[:-1])
_CARD_PATH = re.compile(CARD_PATH_PATTERN[:-1])
_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f-\x9f]")


def _has_dot_segment(path: str) -> bool:
    return any(seg in (".", "..") for seg in path.split("/"))


def url_problem(value: str) -> str | None:
    """Why ``value`` is not a base URL the registry will fetch from, or None if it is.

    Allowed: ``http(s)://host[:port][/path]``, the host a DNS name (ASCII; an internationalised
    name in its ``xn--`` form) or an IP address (IPv6 in brackets), port 1-65535, a path of
    plain segments; no user or password, query, fragment, ``%``-escapes, ``.``/``..`` segments,
    spaces or control characters; at most 2048 characters."""
    if len(value) > _URL_MAX:
        return f"must be at most {_URL_MAX} characters"
    if _CONTROL_OR_SPACE.search(value):
        return "must not contain spaces or control characters"
    if not value.isascii():
        return "must be ASCII: write an internationalised host name in its xn-- form"
    try:
        parts = urlsplit(value)
    except ValueError:  # e.g. brackets around something that is not an IPv6 address
        return "must have a valid host (an IPv6 address goes between brackets)"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an absolute http(s) URL such as http://127.0.0.1:8017"
    if "?" in value or "#" in value:
        return "must be a base URL without query or fragment"
    if "@" in parts.netloc:
        return "must not carry a user name or password"
    if not _URL.fullmatch(value):
        return (
            "must be http(s)://host[:port][/path] with a DNS name or an IP address as host "
            "and plain path segments (no '%'), e.g. http://127.0.0.1:8017"
        )
    try:
        port = parts.port
    except ValueError:  # above 65535
        port = 0
    if port == 0:
        return "must have a port between 1 and 65535"
    host = parts.hostname or ""
    if value[len(parts.scheme) + 3 :].startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "must have a valid IPv6 address between the brackets"
    elif len(host) > 253:
        return "must have a host name of at most 253 characters"
    if _has_dot_segment(parts.path):
        return "must not have '.' or '..' path segments"
    try:
        # .host decodes xn-- labels: the check httpx would otherwise make mid-request.
        httpx.URL(value).host  # noqa: B018
    except (httpx.InvalidURL, UnicodeError, ValueError):  # idna's errors are UnicodeErrors
        return "must have a valid host name (an xn-- label that is not valid IDNA?)"
    return None


def card_path_problem(value: str) -> str | None:
    """Why ``value`` is not a card path (a plain absolute path, at most 200 characters, no
    query, fragment, ``%``-escapes, backslash, ``.``/``..`` segments or control characters),
    or None if it is."""
    if len(value) > _CARD_PATH_MAX:
        return f"must be at most {_CARD_PATH_MAX} characters"
    if not value.startswith("/"):
        return "must start with '/'"
    if _CONTROL_OR_SPACE.search(value):
        return "must not contain spaces or control characters"
    if "?" in value or "#" in value:
        return "must be a path only, without query or fragment"
    if _has_dot_segment(value):
        return "must not have '.' or '..' segments"
    if not _CARD_PATH.fullmatch(value):
        return (
            "must be a plain path such as /.well-known/agent-card.json: letters, digits and "
            "-._~!$&'()*+,;=:@ between single slashes (no '%', no backslash)"
        )
    return None


class RegisterBody(BaseModel):
    """What a node sends to register. The registry reads everything else from its card."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    url: str = Field(
        max_length=_URL_MAX,
        description="base URL of the instance, e.g. http://127.0.0.1:8017: "
        "http(s)://host[:port][/path], no user, query or fragment; its host must resolve "
        "inside the registry's allowed networks (--allow-networks)",
        json_schema_extra={"pattern": URL_PATTERN},
    )
    agent: str = Field(
        max_length=63,
        description="agent name; must equal the card's name",
        json_schema_extra={"pattern": AGENT_NAME_PATTERN},
    )
    version: str = Field(default="", max_length=100)
    card_path: str = Field(
        default=CARD_PATH,
        max_length=_CARD_PATH_MAX,
        description="where the instance serves its agent card: a path only",
        json_schema_extra={"pattern": CARD_PATH_PATTERN},
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = url_problem(value)
        if problem:
            raise ValueError(problem)
        return value.rstrip("/")

    @field_validator("agent")
    @classmethod
    def _agent(cls, value: str) -> str:
        if not _AGENT_NAME.fullmatch(value):
            raise ValueError("must be lowercase letters, digits and '-', starting with a letter")
        return value

    @field_validator("card_path")
    @classmethod
    def _card_path(cls, value: str) -> str:
        problem = card_path_problem(value)
        if problem:
            raise ValueError(problem)
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
