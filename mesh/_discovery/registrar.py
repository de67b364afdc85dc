"""``Registrar``: a node's side of discovery: register when ready, heartbeat, deregister.

    registrar = Registrar(backend, Registration(instance_id, agent, url, version))
    await registrar.start()        # returns at once; registration happens in the background
    ...
    await registrar.aclose()       # deregisters (bounded time)

The background task registers, then heartbeats every ``interval_s``. When the registry is down it
keeps trying with exponential backoff (tenacity's, capped at ``max_backoff_s``), logging once per
state change rather than per attempt. A node that has not reached any registry yet says so once at
INFO (serving without one is a normal way to start); losing a registry it had, or one that
answers with a refusal, is a WARNING. Any other exception (a bug in a backend) is logged once at
ERROR with its traceback and retried with the same backoff: the node keeps trying to register
instead of losing its registrar task unseen. A heartbeat answered "unknown instance" (the registry lost
or expired us) registers again at once. One answered "instance id taken" (the registry forgot us
and someone else registered our id meanwhile: ``InstanceIdTaken``) registers under a new id,
told first to ``on_new_instance_id`` (a node shows it in ``/health`` before the registry asks).
The backend is not closed here: its owner closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Literal

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from mesh._discovery.base import (
    DiscoveryBackend,
    DiscoveryUnreachable,
    InstanceIdTaken,
    Registration,
    UnknownInstance,
)
from mesh._errors import DiscoveryError

__all__ = ["Registrar", "RegistrarState"]

RegistrarState = Literal["idle", "registering", "registered", "retrying", "stopped"]


class Registrar:
    def __init__(
        self,
        backend: DiscoveryBackend,
        registration: Registration,
        *,
        interval_s: float = 5.0,
        first_backoff_s: float = 0.5,
        max_backoff_s: float | None = None,
        close_timeout_s: float = 3.0,
        logger: logging.Logger | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_new_instance_id: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.registration = registration
        self._on_new_instance_id = on_new_instance_id
        self.interval_s = interval_s
        # Doubling from first_backoff_s, never longer than a heartbeat interval (a returning
        # registry sees us soon) unless max_backoff_s says otherwise.
        cap = max_backoff_s if max_backoff_s is not None else max(interval_s, 1.0)
        self._backoff = wait_exponential(multiplier=first_backoff_s, max=cap)
        self._close_timeout_s = close_timeout_s
        self._log = logger or logging.getLogger("mesh._discovery")
        self._sleep = sleep
        self._state: RegistrarState = "idle"
        self._last_error = ""
        self._task: asyncio.Task[None] | None = None
        self._registered_once = False
        self._registered = asyncio.Event()
        # "waiting": no registry has answered yet (said once, at INFO); "failing": a WARNING;
        # "broken": the backend raised something else (an ERROR).
        self._outage: Literal["waiting", "failing", "broken"] | None = None

    @property
    def state(self) -> RegistrarState:
        """``idle`` -> ``registering`` -> ``registered`` (<-> ``retrying``) -> ``stopped``."""
        return self._state

    @property
    def last_error(self) -> str:
        """Why the last attempt failed ('' after a success)."""
        return self._last_error

    async def start(self) -> None:
        """Start registering in the background (returns immediately)."""
        if self._task is not None or self._state == "stopped":
            return
        self._set_state("registering")
        self._task = asyncio.create_task(self._run(), name=f"registrar-{self.registration.agent}")

    async def wait_registered(self) -> None:
        """Wait until registered at least once (bound it with ``asyncio.timeout``)."""
        await self._registered.wait()

    async def aclose(self) -> None:
        """Stop heartbeating and deregister (giving up after ``close_timeout_s``)."""
        if self._state == "stopped":
            return
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._registered_once:
            try:
                await asyncio.wait_for(
                    self.backend.deregister(self.registration.instance_id), self._close_timeout_s
                )
                self._log.info(
                    "deregistered %s (%s)", self.registration.agent, self.registration.instance_id
                )
            except (DiscoveryError, TimeoutError) as exc:
                # The registry will notice by TTL and probes; stopping must not hang on it.
                self._log.warning("could not deregister %s: %s", self.registration.agent, exc)
        self._set_state("stopped")

    def _set_state(self, state: RegistrarState, error: str = "") -> None:
        changed = state != self._state
        self._state = state
        self._last_error = error
        if not changed:
            return
        reg = self.registration
        if state == "registered":
            self._log.info(
                "registered %s (%s) at %s with %s",
                reg.agent,
                reg.instance_id,
                reg.url,
                self.backend,
            )
        elif state == "registering" and self._registered_once:
            self._log.warning("discovery forgot %s (%s): registering again", reg.agent, error)

    def _retrying(self, exc: DiscoveryError) -> None:
        """Enter ``retrying`` after ``exc``; log it once per kind of outage."""
        self._set_state("retrying", str(exc))
        reg = self.registration
        if not self._registered_once and isinstance(exc, DiscoveryUnreachable):
            if self._outage is None:
                self._outage = "waiting"
                where = getattr(self.backend, "url", None) or str(self.backend)
                self._log.info(
                    "%s: no registry at %s yet; registering when one answers (--no-register "
                    "to serve alone)",
                    reg.agent,
                    where,
                )
        elif self._outage != "failing":
            self._outage = "failing"
            self._log.warning(
                "discovery unavailable for %s: %s; retrying in the background", reg.agent, exc
            )

    def _broken(self, exc: Exception) -> None:
        """Enter ``retrying`` after an exception no backend should raise; log it once (with
        its traceback) until a success."""
        self._set_state("retrying", f"{type(exc).__name__}: {exc}")
        if self._outage != "broken":
            self._outage = "broken"
            self._log.error(
                "registering %s failed: the discovery backend %s raised %s: %s (a bug, not an "
                "outage); retrying in the background",
                self.registration.agent,
                self.backend,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )

    def _take_new_instance_id(self, exc: InstanceIdTaken) -> None:
        old = self.registration
        new_id = f"{old.agent}-{uuid.uuid4().hex[:8]}"
        if self._on_new_instance_id is not None:
            self._on_new_instance_id(new_id)
        self.registration = dataclasses.replace(old, instance_id=new_id)
        self._log.warning(
            "%s: instance id %s was given to someone else while this node was away (%s); "
            "registering as %s",
            old.agent,
            old.instance_id,
            exc,
            new_id,
        )
        # Not through _set_state: its "discovery forgot" line would say less than the above.
        self._state = "registering"
        self._last_error = str(exc)

    async def _run(self) -> None:
        # One retry loop per registered period: a success ends it, and the next failure starts
        # the backoff over from ``first_backoff_s``.
        retrying = AsyncRetrying(
            # Any exception: one the backend should not raise must not end the task (the node
            # would never register again, and nobody would know); _attempt logs it.
            retry=retry_if_exception_type(Exception),
            wait=self._backoff,
            sleep=self._sleep,
        )
        while True:
            async for attempt in retrying:
                with attempt:
                    await self._attempt()
            await self._sleep(self.interval_s)

    async def _attempt(self) -> None:
        """Heartbeat when registered, else register; a failure moves the state and is raised
        for the retry loop to wait on."""
        try:
            if self._state == "registered":
                try:
                    await self.backend.heartbeat(self.registration.instance_id)
                    return
                except UnknownInstance as exc:
                    self._set_state("registering", str(exc))  # and register again at once
            await self.backend.register(self.registration)
        except InstanceIdTaken as exc:
            self._take_new_instance_id(exc)
            # A fresh id is nobody's: waiting is only for a registry that says otherwise.
            raise
        except DiscoveryError as exc:
            # After an outage, register again rather than heartbeat: it is idempotent and
            # covers a registry that came back without our record.
            self._retrying(exc)
            raise
        except Exception as exc:
            self._broken(exc)
            raise
        self._registered_once = True
        self._registered.set()
        self._outage = None
        self._set_state("registered")
