"""``Supervisor``: start the processes of a mesh, watch them, restart crashed ones, stop all.

    supervisor = Supervisor(meshfile.plan(root), log_dir=root / ".mesh" / "logs")
    await supervisor.start()          # registry first, then the nodes; waits until all healthy
    await supervisor.watch()          # restarts a crashed node with backoff, until stop()
    await supervisor.stop()           # nodes first (they deregister), then the registry

Each process writes to ``<log_dir>/<name>.log`` and runs in its own session, so a Ctrl-C in the
terminal reaches only ``mesh up``, which then stops the children in order: nodes get SIGTERM
while the registry is still up to receive their deregistration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from mesh.errors import ConfigError
from mesh.meshfile import ProcessSpec

__all__ = ["Child", "ChildStatus", "Supervisor"]

ChildStatus = Literal["pending", "starting", "healthy", "unhealthy", "crashed", "stopped"]


@dataclass
class Child:
    """One supervised process and what we know about it."""

    spec: ProcessSpec
    log: Path
    status: ChildStatus = "pending"
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    exit_code: int | None = None
    detail: str = ""
    _backoff: float = field(default=0.0, repr=False)
    _restarting: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def tail(self, lines: int = 20) -> str:
        """The last lines of the log, to show why a process died."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    """Runs ``ProcessSpec``s as child processes. ``on_change(child)`` reports progress."""

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        *,
        log_dir: Path,
        cwd: Path | None = None,
        on_change: Callable[[Child], None] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        restart_backoff: tuple[float, float] = (0.5, 30.0),
        # A node healthy this long after a restart has its backoff reset.
        stable_after: float = 30.0,
        poll_interval: float = 0.1,
    ) -> None:
        self.children = [Child(spec, log_dir / f"{spec.name}.log") for spec in specs]
        self.log_dir = log_dir
        self.cwd = cwd or Path.cwd()
        self.on_change = on_change
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.restart_backoff = restart_backoff
        self.stable_after = stable_after
        self.poll_interval = poll_interval
        self._http = httpx.AsyncClient(timeout=2.0, trust_env=False)
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the registry (if any) and wait for it, then every node concurrently; return
        when all answer 200 on their health URL. Raises ``ConfigError`` (with the log tail)
        when a process exits or stays unhealthy, after stopping what was started."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        registries = [c for c in self.children if c.spec.kind == "registry"]
        nodes = [c for c in self.children if c.spec.kind != "registry"]
        try:
            for group in (registries, nodes):
                for child in group:
                    await self._spawn(child)
                await asyncio.gather(*(self._wait_healthy(c) for c in group))
        except BaseException:
            await self.stop()
            raise

    async def watch(self) -> None:
        """Restart crashed processes with exponential backoff until ``stop()`` is called."""
        while not self._stopping.is_set():
            now = time.monotonic()
            for child in self.children:
                proc = child.process
                if child._restarting or proc is None:
                    continue
                if proc.returncode is None:
                    if child._backoff and now - child.started_at > self.stable_after:
                        child._backoff = 0.0
                    continue
                child.exit_code = proc.returncode
                self._set(child, "crashed", f"exited with code {proc.returncode}")
                child._restarting = True
                task = asyncio.get_running_loop().create_task(self._restart(child))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.poll_interval)

    async def stop(self) -> None:
        """SIGTERM every process (nodes first, registry last), SIGKILL after ``stop_timeout``."""
        self._stopping.set()
        # A restart in progress must not spawn behind our back.
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        nodes = [c for c in self.children if c.spec.kind != "registry"]
        registries = [c for c in self.children if c.spec.kind == "registry"]
        for group in (nodes, registries):
            await asyncio.gather(*(self._terminate(c) for c in group))
        await self._http.aclose()

    # -- internals ----------------------------------------------------------------------------
    async def _spawn(self, child: Child) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **child.spec.env}
        # Modules named in mesh.toml (agents.loan_officer) are imported relative to cwd.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.cwd), env.get("PYTHONPATH", "")) if p
        )
        with child.log.open("ab") as log:
            log.write(f"--- mesh up: starting {' '.join(child.spec.argv)}\n".encode())
            log.flush()
            child.process = await asyncio.create_subprocess_exec(
                *child.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.cwd,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        child.started_at = time.monotonic()
        child.exit_code = None
        self._set(child, "starting", f"pid {child.process.pid}")

    async def _healthy(self, child: Child) -> bool:
        try:
            response = await self._http.get(child.spec.health_url)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _wait_healthy(self, child: Child) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            proc = child.process
            if proc is not None and proc.returncode is not None:
                child.exit_code = proc.returncode
                self._set(child, "crashed", f"exited with code {proc.returncode}")
                raise ConfigError(
                    f"{child.spec.name} exited with code {proc.returncode} while starting "
                    f"(log: {child.log}):\n{child.tail()}"
                )
            if await self._healthy(child):
                self._set(child, "healthy", child.spec.url)
                return
            await asyncio.sleep(self.poll_interval)
        self._set(child, "unhealthy", f"no 200 from {child.spec.health_url}")
        raise ConfigError(
            f"{child.spec.name} did not become healthy within {self.start_timeout:.0f}s "
            f"(log: {child.log}):\n{child.tail()}"
        )

    async def _restart(self, child: Child) -> None:
        low, high = self.restart_backoff
        try:
            while not self._stopping.is_set():
                child._backoff = min(high, child._backoff * 2) if child._backoff else low
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), child._backoff)
                if self._stopping.is_set():
                    return
                child.restarts += 1
                await self._spawn(child)
                try:
                    await self._wait_healthy(child)
                    return
                except ConfigError:
                    # Still broken: stop what is left of it and try again, later.
                    await self._terminate(child)
        finally:
            child._restarting = False

    async def _terminate(self, child: Child) -> None:
        proc = child.process
        if proc is None or proc.returncode is not None:
            if child.status not in ("crashed", "stopped"):
                self._set(child, "stopped", "")
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        child.exit_code = proc.returncode
        self._set(child, "stopped", f"exit code {proc.returncode}")

    def _set(self, child: Child, status: ChildStatus, detail: str) -> None:
        child.status = status
        child.detail = detail
        if self.on_change is not None:
            self.on_change(child)


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if ``mesh up`` dies without stopping us (Linux
    ``PR_SET_PDEATHSIG``; elsewhere a no-op). Children run in their own session, so without
    this a SIGKILLed supervisor would leave orphans holding the ports."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass
