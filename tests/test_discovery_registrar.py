"""Registrar: background registration, heartbeats, re-registration, backoff, deregistration.
A scripted backend makes failures exact; the integration tests run it against the registry."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mesh._discovery import Instance, Registrar, Registration, UnknownInstance
from mesh._discovery.base import DiscoveryUnreachable, InstanceIdTaken
from mesh._errors import DiscoveryError
from tests.support import eventually

REG = Registration(instance_id="n-1", agent="bureau", url="http://127.0.0.1:9", version="1")


class ScriptedBackend:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down = False
        self.forget = False
        self.hang_deregister = False

    async def register(self, registration: Registration) -> None:
        self.calls.append("register")
        if self.down:
            raise DiscoveryError("no registry at http://registry.test")

    async def heartbeat(self, instance_id: str) -> None:
        self.calls.append("heartbeat")
        if self.down:
            raise DiscoveryError("no registry at http://registry.test")
        if self.forget:
            self.forget = False
            raise UnknownInstance("unknown n-1")

    async def deregister(self, instance_id: str) -> None:
        self.calls.append("deregister")
        if self.hang_deregister:
            await asyncio.Event().wait()

    async def find(
        self, *, agent: str | None = None, skill: str | None = None, passing_only: bool = True
    ) -> list[Instance]:
        return []

    async def aclose(self) -> None: ...


class Sleeps:
    """An injected sleep that records delays and only yields to the loop."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


async def test_start_is_non_blocking_then_registers_and_heartbeats() -> None:
    backend, sleeps = ScriptedBackend(), Sleeps()
    registrar = Registrar(backend, REG, interval_s=5.0, sleep=sleeps)
    assert registrar.state == "idle"
    await registrar.start()
    assert registrar.state == "registering"
    await eventually(lambda: backend.calls.count("heartbeat") >= 3)
    assert registrar.state == "registered"
    assert backend.calls[0] == "register"
    assert set(sleeps.delays) == {5.0}
    await registrar.aclose()
    assert backend.calls[-1] == "deregister"
    assert registrar.state == "stopped"


async def test_unknown_instance_registers_again() -> None:
    backend, sleeps = ScriptedBackend(), Sleeps()
    registrar = Registrar(backend, REG, sleep=sleeps)
    await registrar.start()
    await eventually(lambda: "heartbeat" in backend.calls)
    backend.forget = True
    await eventually(lambda: backend.calls.count("register") == 2)
    await eventually(lambda: registrar.state == "registered")
    await registrar.aclose()


class TakenBackend(ScriptedBackend):
    """Its first heartbeat says another owner holds the id (the registry forgot this node and
    someone registered the id meanwhile), as ``RegistryBackend`` reports a 403 not_owner."""

    def __init__(self) -> None:
        super().__init__()
        self.registered: list[str] = []
        self.taken = {"n-1"}

    async def register(self, registration: Registration) -> None:
        await super().register(registration)
        if registration.instance_id in self.taken:
            raise InstanceIdTaken(f"{registration.instance_id} is someone else's")
        self.registered.append(registration.instance_id)

    async def heartbeat(self, instance_id: str) -> None:
        await super().heartbeat(instance_id)
        if instance_id in self.taken:
            raise InstanceIdTaken(f"{instance_id} is someone else's")


async def test_an_id_taken_while_away_is_replaced_by_a_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, sleeps = TakenBackend(), Sleeps()
    backend.taken = set()
    told: list[str] = []

    def on_new(instance_id: str) -> None:
        # The node shows the new id before the registry can ask for it.
        assert instance_id not in backend.registered
        told.append(instance_id)

    registrar = Registrar(backend, REG, sleep=sleeps, on_new_instance_id=on_new)
    with caplog.at_level(logging.WARNING, logger="mesh._discovery"):
        await registrar.start()
        await eventually(lambda: backend.registered == ["n-1"])
        backend.taken = {"n-1"}
        await eventually(lambda: len(backend.registered) == 2)
        await eventually(lambda: registrar.state == "registered")
        (new_id,) = told
        assert backend.registered == ["n-1", new_id]
        assert new_id.startswith("bureau-")
        assert registrar.registration.instance_id == new_id
        await registrar.aclose()
    assert caplog.text.count("given to someone else") == 1
    assert backend.calls[-1] == "deregister"


async def test_outage_backs_off_logs_once_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    backend, sleeps = ScriptedBackend(), Sleeps()
    backend.down = True
    registrar = Registrar(backend, REG, interval_s=4.0, sleep=sleeps)
    with caplog.at_level(logging.INFO, logger="mesh._discovery"):
        await registrar.start()
        await eventually(lambda: len(sleeps.delays) >= 6)
        assert registrar.state == "retrying"
        assert "no registry" in registrar.last_error
        assert sleeps.delays[:6] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
        backend.down = False
        await eventually(lambda: registrar.state == "registered")
        await registrar.aclose()
    assert caplog.text.count("discovery unavailable for bureau") == 1
    assert caplog.text.count("registered bureau (n-1) at") == 1


class ScriptBackend(ScriptedBackend):
    """Answers each call (register or heartbeat) as its script says, then "ok"."""

    def __init__(self, script: list[str]) -> None:
        super().__init__()
        self.script = script

    async def _answer(self) -> None:
        outcome = self.script.pop(0) if self.script else "ok"
        if outcome == "down":
            raise DiscoveryError("no registry at http://registry.test")
        if outcome == "forget":
            raise UnknownInstance("unknown n-1")

    async def register(self, registration: Registration) -> None:
        self.calls.append("register")
        await self._answer()

    async def heartbeat(self, instance_id: str) -> None:
        self.calls.append("heartbeat")
        await self._answer()


async def test_each_outage_backs_off_afresh_and_a_forgotten_id_registers_at_once() -> None:
    script = ["ok", "ok", "down", "down", "down", "ok", "ok", "forget", "ok", "down", "down", "ok"]
    backend, sleeps = ScriptBackend(script), Sleeps()
    registrar = Registrar(backend, REG, interval_s=5.0, max_backoff_s=3.0, sleep=sleeps)
    await registrar.start()
    await eventually(lambda: len(sleeps.delays) >= 11)
    await registrar.aclose()
    # heartbeat interval 5; each outage waits 0.5, 1, 2 (capped at 3) from its own start.
    assert sleeps.delays[:11] == [5.0, 5.0, 0.5, 1.0, 2.0, 5.0, 5.0, 5.0, 0.5, 1.0, 5.0]
    assert backend.calls[:12] == [
        "register", "heartbeat", "heartbeat", "register", "register", "register",
        "heartbeat", "heartbeat", "register", "heartbeat", "register", "register",
    ]  # fmt: skip


class BuggyBackend(ScriptedBackend):
    """Raises what no backend should (a ValueError from a bug) while ``failures`` lasts."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def register(self, registration: Registration) -> None:
        self.calls.append("register")
        if self.failures:
            self.failures -= 1
            raise ValueError("bad port in 'http://127.0.0.1:9'")


async def test_an_unexpected_error_is_logged_once_and_registration_keeps_trying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It ended the registrar's task silently: the node never registered, and nobody knew."""
    backend, sleeps = BuggyBackend(failures=1_000_000), Sleeps()
    registrar = Registrar(backend, REG, interval_s=5.0, sleep=sleeps)
    with caplog.at_level(logging.INFO, logger="mesh._discovery"):
        await registrar.start()
        await eventually(lambda: backend.calls.count("register") >= 4)
        assert registrar.state == "retrying"
        assert registrar.last_error == "ValueError: bad port in 'http://127.0.0.1:9'"
        backend.failures = 0
        await eventually(lambda: registrar.state == "registered")
        await registrar.aclose()
    assert backend.calls[:4] == ["register"] * 4
    assert sleeps.delays[:3] == [0.5, 1.0, 2.0]  # the same backoff as an outage
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].getMessage().startswith("registering bureau failed: the discovery backend ")
    assert "raised ValueError: bad port in 'http://127.0.0.1:9' (a bug, not an outage)" in (
        errors[0].getMessage()
    )
    assert errors[0].exc_info is not None


async def test_never_registered_means_no_deregister() -> None:
    backend, sleeps = ScriptedBackend(), Sleeps()
    backend.down = True
    registrar = Registrar(backend, REG, sleep=sleeps)
    await registrar.start()
    await eventually(lambda: len(sleeps.delays) >= 1)
    await registrar.aclose()
    assert "deregister" not in backend.calls


async def test_aclose_is_bounded_when_the_registry_hangs() -> None:
    backend, sleeps = ScriptedBackend(), Sleeps()
    backend.hang_deregister = True
    registrar = Registrar(backend, REG, sleep=sleeps, close_timeout_s=0.2)
    await registrar.start()
    async with asyncio.timeout(5):
        await registrar.wait_registered()
        await registrar.aclose()
    assert registrar.state == "stopped"
    await registrar.start()  # a stopped registrar stays stopped
    assert registrar.state == "stopped"


class UnreachableBackend(ScriptedBackend):
    """Down means nothing answers (a connection refused), as ``RegistryBackend`` reports it."""

    url = "http://registry.test"

    async def register(self, registration: Registration) -> None:
        self.calls.append("register")
        if self.down:
            raise DiscoveryUnreachable("no registry at http://registry.test: start one")

    async def heartbeat(self, instance_id: str) -> None:
        self.calls.append("heartbeat")
        if self.down:
            raise DiscoveryUnreachable("no registry at http://registry.test: start one")


async def test_no_registry_yet_is_said_once_at_info_losing_one_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend, sleeps = UnreachableBackend(), Sleeps()
    backend.down = True
    registrar = Registrar(backend, REG, sleep=sleeps)
    with caplog.at_level(logging.INFO, logger="mesh._discovery"):
        await registrar.start()
        await eventually(lambda: len(sleeps.delays) >= 4)
        waiting = [r for r in caplog.records if "registry" in r.getMessage()]
        assert [(r.levelname, r.getMessage()) for r in waiting] == [
            (
                "INFO",
                "bureau: no registry at http://registry.test yet; registering when one answers "
                "(--no-register to serve alone)",
            )
        ]
        backend.down = False
        await eventually(lambda: registrar.state == "registered")
        caplog.clear()
        # A registry it had, gone: that is worth a warning (once), whatever the error.
        before = backend.calls.count("register")
        backend.down = True
        await eventually(lambda: backend.calls.count("register") >= before + 3)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "discovery unavailable for bureau: no registry at http://registry.test: start one; "
            "retrying in the background"
        ]
        await registrar.aclose()


async def test_the_registry_backend_reports_a_closed_port_as_unreachable() -> None:
    from mesh._discovery.registry_client import RegistryBackend
    from tests.support import free_port

    backend = RegistryBackend(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(DiscoveryUnreachable, match=r"no registry at http://127\.0\.0\.1:"):
            await backend.register(REG)
    finally:
        await backend.aclose()
