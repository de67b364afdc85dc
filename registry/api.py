"""The registry's JSON API under ``/v1`` (contract: docs/architecture.md, "Registry API").

Errors are ``{"error": code, "message": text}`` with a 4xx status; the message says what is
wrong and, where it helps, what to do. The write token and the body limit are checked before
any route, by ``registry.gate``; ownership of an instance (its secret) here, by the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import JSONResponse

from mesh._errors import StoreError
from mesh._outbound import FetchFailed, bounded_get
from registry.card import CardRejected, agent_record, check_signature, fetch_card
from registry.prober import MAX_HEALTH_BYTES, answered_as
from registry.state import RegistryState, get_state
from registry.store import (
    InstanceRecord,
    InstanceTaken,
    NotOwner,
    RegistryFull,
    Unstorable,
    UrlTaken,
    secret_hash,
)
from registry.topology import Topology
from registry.wire import (
    AgentDetail,
    AgentList,
    AgentSummary,
    ErrorBody,
    InstanceCounts,
    InstanceList,
    InstanceOut,
    RegisterBody,
    RegisteredOut,
    SkillOut,
    StatusFilter,
    TargetGroup,
)

__all__ = [
    "SECRET_HEADER",
    "ApiError",
    "heartbeat_body",
    "instances_body",
    "router",
    "store_unavailable",
]


class ApiError(Exception):
    """Raised by a route; rendered as ``{"error": code, "message": message}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> JSONResponse:
        """The answer to a request that raised this (FastAPI's handler and
        ``registry.fast_routes`` both send it)."""
        response = JSONResponse(
            {"error": self.code, "message": self.message}, status_code=self.status
        )
        if self.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response


def store_unavailable(method: str, path: str, exc: StoreError) -> JSONResponse:
    """The answer to a request whose store call failed (logged: the client is told to look)."""
    log.error("store error on %s %s: %s", method, path, exc)
    return JSONResponse(
        {"error": "store_unavailable", "message": "the registry's store failed; see its log"},
        status_code=503,
    )


State = Annotated[RegistryState, Depends(get_state)]


_errors: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    404: {"model": ErrorBody},
    422: {"model": ErrorBody},
}

router = APIRouter(prefix="/v1", responses=_errors)
log = logging.getLogger("registry")

SECRET_HEADER = "Mesh-Instance-Secret"
# A proposed secret shorter than this is not taken (secrets.token_urlsafe(32) has 43).
MIN_SECRET_CHARS = 32
Secret = Annotated[
    str | None,
    Header(
        alias=SECRET_HEADER,
        description="the secret of this instance's registration answer (its owner's proof); "
        "on a first registration, a proposed secret of at least 32 characters",
    ),
]


def _presented(secret: str | None) -> str | None:
    return secret_hash(secret) if secret else None


def _not_owner(instance_id: str, secret: str | None) -> ApiError:
    if not secret:
        return ApiError(
            403,
            "not_owner",
            f"instance {instance_id!r} belongs to whoever registered it: send the 'secret' of "
            f"its registration answer in the '{SECRET_HEADER}' header",
        )
    return ApiError(
        403,
        "not_owner",
        f"wrong '{SECRET_HEADER}' for instance {instance_id!r}: send the 'secret' of its "
        "registration answer (a restarted node registers under a new instance id)",
    )


async def _proven_ghosts(state: RegistryState, body: RegisterBody) -> frozenset[str]:
    """The instances a registration of ``body`` may supersede: the other ids of its agent at its
    URL, if that URL's ``/health`` names ``body.instance_id`` (so the process serving the URL
    is the one registering, and those ids are its past lives); else none, and the store
    refuses to supersede them (``UrlTaken``). Without this proof anyone could evict a live
    instance by registering its URL under a new id, then take over the evicted id."""
    others = [
        i.instance_id
        for i in await state.store.instances(body.agent)
        if i.url == body.url and i.instance_id != body.instance_id
    ]
    if not others:
        return frozenset()
    try:
        answer = await bounded_get(
            state.http,
            body.url + "/health",
            max_bytes=MAX_HEALTH_BYTES,
            timeout_s=state.settings.probe_timeout_s,
        )
    except FetchFailed as exc:
        log.info("%s/health did not answer for %s: %s", body.url, body.instance_id, exc)
        return frozenset()
    return frozenset(others) if answered_as(answer.content) == body.instance_id else frozenset()


@contextlib.asynccontextmanager
async def _fetch_slot(state: RegistryState) -> AsyncIterator[None]:
    """One of the registration fetches allowed at once; 503 ``registry_busy`` when none frees
    within the card timeout (a burst of registrations waits here, not in the HTTP pool)."""
    try:
        async with asyncio.timeout(state.settings.card_timeout_s):
            await state.fetch_slots.acquire()
    except TimeoutError:
        raise ApiError(
            503,
            "registry_busy",
            "too many registrations in progress at once: retry in a few seconds "
            "(nodes do, with backoff)",
        ) from None
    try:
        yield
    finally:
        state.fetch_slots.release()


@router.post(
    "/instances",
    status_code=201,
    tags=["instances"],
    responses={409: {"model": ErrorBody}, 503: {"model": ErrorBody}},
)
async def register(body: RegisterBody, state: State, secret: Secret = None) -> RegisteredOut:
    """Register an instance, or re-register one you own (send its secret). The registry
    fetches and validates its card. A new instance id is owned by the secret in the answer
    (the one proposed in the header if it has at least 32 characters, else a fresh one). It
    supersedes another instance of the same agent at the same URL only if that URL's
    ``/health`` names the registering ``instance_id`` (the process there is the one
    registering: a restarted node), else 409 ``url_taken``."""
    try:
        async with _fetch_slot(state):
            card = await fetch_card(state.http, body.url, body.card_path)
            now = time.time()
            agent = agent_record(card, expected_name=body.agent, now=now)
            if state.settings.trust_root is not None:
                check_signature(card, state.settings.trust_root, body.url)
            supersede = await _proven_ghosts(state, body)
    except CardRejected as exc:
        raise ApiError(422, exc.code, str(exc)) from exc
    # A new instance is owned by the secret it proposes (RegistryBackend does, so that a
    # registration sent again after a lost answer still owns it), or by a fresh one.
    fresh = secret if secret and len(secret) >= MIN_SECRET_CHARS else secrets.token_urlsafe(32)
    try:
        done = await state.store.put(
            agent,
            InstanceRecord(
                instance_id=body.instance_id,
                agent=body.agent,
                url=body.url,
                version=body.version or agent.version,
                status="passing",
                status_reason="registered (card fetched)",
                status_changed_at=now,
                last_heartbeat_at=now,
                registered_at=now,
            ),
            secret_hash=secret_hash(fresh),
            presented=_presented(secret),
            supersede=supersede,
            max_instances=state.settings.max_instances,
        )
    except UrlTaken as exc:
        old = exc.instance
        raise ApiError(
            409,
            "url_taken",
            f"agent {body.agent!r} already has instance {old.instance_id!r} at {body.url}, and "
            f"{body.url}/health does not answer as instance {body.instance_id!r}: a restarted "
            "node replaces its old instance once its /health names its new instance_id (mesh "
            "nodes do); another process needs a URL of its own, or the old instance's owner "
            "deregisters it first",
        ) from exc
    except Unstorable as exc:
        raise ApiError(422, "unstorable", str(exc)) from exc
    except RegistryFull as exc:
        raise ApiError(
            503,
            "registry_full",
            f"the registry holds its maximum of {exc.limit} instances (--max-instances): "
            "deregister instances that are gone, or ask its operator to raise the limit",
        ) from exc
    except InstanceTaken as exc:
        raise ApiError(
            409,
            "instance_conflict",
            f"instance id {exc.instance_id!r} is registered to agent {exc.agent!r}: register "
            f"{body.agent!r} under an instance id of its own",
        ) from exc
    except NotOwner as exc:
        raise _not_owner(body.instance_id, secret) from exc
    for old in done.superseded:
        log.info(
            "%s %s (%s) superseded by %s: one instance per agent and URL",
            old.agent,
            old.instance_id,
            old.url,
            body.instance_id,
        )
    owner = fresh if done.created else str(secret)
    return RegisteredOut(**InstanceOut.of(done.instance, agent).model_dump(), secret=owner)


_to_json = InstanceOut.__pydantic_serializer__.to_json


@router.put("/instances/{instance_id}/heartbeat", tags=["instances"], response_model=InstanceOut)
async def heartbeat(instance_id: str, state: State, secret: Secret = None) -> Response:
    """Keep an instance you own alive. 404 ``unknown_instance``: register again."""
    body = await heartbeat_body(state, instance_id, secret, time.time())
    return Response(body, media_type="application/json")


async def heartbeat_body(
    state: RegistryState, instance_id: str, secret: str | None, at: float
) -> bytes:
    """A heartbeat's work and its answer's JSON (this route's and ``registry.fast_routes``'s):
    ``ApiError`` 403 ``not_owner`` or 404 ``unknown_instance``."""
    try:
        stored = await state.store.heartbeat(instance_id, at, presented=_presented(secret))
    except NotOwner as exc:
        raise _not_owner(instance_id, secret) from exc
    if stored is None:
        raise ApiError(
            404, "unknown_instance", f"no instance {instance_id!r} here: register it again"
        )
    # Encoded here: FastAPI would validate the model again before encoding it.
    return _to_json(InstanceOut.of(stored, await state.store.agent(stored.agent)))


@router.delete("/instances/{instance_id}", status_code=204, tags=["instances"])
async def deregister(instance_id: str, state: State, secret: Secret = None) -> Response:
    """Forget an instance you own (idempotent: unknown ids answer 204 too)."""
    try:
        await state.store.deregister(instance_id, presented=_presented(secret))
    except NotOwner as exc:
        raise _not_owner(instance_id, secret) from exc
    return Response(status_code=204)


@router.get("/instances", tags=["instances"], response_model=InstanceList)
async def list_instances(
    state: State,
    agent: str | None = None,
    skill: str | None = None,
    status: Annotated[StatusFilter, Query(description="'any' for every status")] = "passing",
) -> Response:
    """Instances, by default only passing ones."""
    body = await instances_body(state, agent=agent, skill=skill, status=status)
    return Response(body, media_type="application/json")


async def instances_body(
    state: RegistryState, *, agent: str | None, skill: str | None, status: str
) -> bytes:
    """A lookup's answer (this route's and ``registry.fast_routes``'s)."""
    found = await state.catalog.instances(agent=agent, skill=skill, status=status)
    # Every delegation's discovery asks this: each instance's JSON is made once per change
    # (``InstanceJson``), not once per lookup, and FastAPI does not validate it again.
    parts = state.instance_json
    return b'{"instances":[' + b",".join(parts.of(i, a) for i, a in found) + b"]}"


@router.get("/agents", tags=["agents"])
async def list_agents(
    state: State,
    skill: Annotated[str | None, Query(description="skill id the agent offers")] = None,
    tag: str | None = None,
    q: Annotated[str | None, Query(description="free text: name, description, skills")] = None,
) -> AgentList:
    """Agents with their skills and instance counts."""
    views = await state.catalog.agents(skill=skill, tag=tag, q=q)
    return AgentList(
        agents=[
            AgentSummary(
                name=v.agent.name,
                description=v.agent.description,
                version=v.agent.version,
                skills=[SkillOut.of(s, schemas=False) for s in v.agent.skills],
                tags=list(v.agent.tags),
                instances=InstanceCounts(passing=v.passing, total=len(v.instances)),
            )
            for v in views
        ]
    )


@router.get("/agents/{name}", tags=["agents"])
async def get_agent(name: str, state: State) -> AgentDetail:
    """One agent: card, skills with schemas, every instance (any status)."""
    view = await state.catalog.agent(name)
    if view is None:
        raise ApiError(404, "unknown_agent", f"no agent named {name!r} is registered")
    return AgentDetail(
        name=view.agent.name,
        description=view.agent.description,
        version=view.agent.version,
        card=view.agent.card,
        skills=[SkillOut.of(s, schemas=True) for s in view.agent.skills],
        tags=list(view.agent.tags),
        instances=[InstanceOut.of(i, view.agent) for i in view.instances],
    )


@router.get("/topology", tags=["agents"], response_class=JSONResponse)
async def topology(state: State) -> JSONResponse:
    """Every agent (registered, or called by one) with its live traffic, and the delegation
    edges between them per skill: calls since each instance started, and over the nodes'
    recent window calls/min, errors and p50/p95 seconds (docs/console.md)."""
    views = await state.catalog.agents()
    # Plain JSON already: FastAPI's encoder would walk it again (4x the build at 1,000 instances).
    return JSONResponse(Topology.build(views, state.prober.traffic).as_dict())


@router.get("/prometheus/targets", tags=["prometheus"])
async def prometheus_targets(state: State) -> list[TargetGroup]:
    """Prometheus HTTP SD: one target group per live (passing or warning) instance.

    One group per instance (not per agent) so each target carries its own ``instance`` label
    (the instance id); ``agent`` and ``version`` are on every group.
    """
    groups = []
    for inst, _agent in await state.catalog.instances(status="any"):
        if inst.status == "critical":
            continue
        scheme, _, rest = inst.url.partition("://")
        host, _, path = rest.partition("/")
        labels = {"agent": inst.agent, "version": inst.version, "instance": inst.instance_id}
        if scheme == "https":
            labels["__scheme__"] = "https"
        if path:
            labels["__metrics_path__"] = f"/{path}/metrics"
        groups.append(TargetGroup(targets=[host], labels=labels))
    return groups
