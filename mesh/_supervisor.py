"""``Supervisor``: start the processes of a mesh, watch them, restart crashed ones, stop all.

    supervisor = Supervisor(meshfile.plan(root), log_dir=root / ".mesh" / "logs")
    supervisor.check_ports()          # ConfigError naming a busy port; nothing started
    await supervisor.start()          # registry first, then the nodes; waits until all healthy
    await supervisor.watch()          # restarts a crashed node with backoff, until stop()
    await supervisor.restart_process("credit-bureau-1")   # what `mesh restart` asks for
    await supervisor.stop()           # nodes first (they deregister), then the registry

A process is healthy when its health URL answers 200 naming the pid the supervisor started
(``{"pid": N}``, as ``mesh serve`` and ``mesh registry`` do): an answer from another pid means
another process holds the port, and that start fails for good. A node with a ``registry_url``
is healthy only once that registry also lists it (the ``instance_id`` its health names) as
passing: callers find it from then on, so "healthy" means "reachable by name".

How an exit is read: 0 is "exited" (someone stopped it; not restarted), ``EX_CONFIG`` (78, a
start-up ``ConfigError`` of ``mesh serve`` / ``mesh registry`` such as a busy port) is "failed"
(the same start would fail the same way; not restarted), anything else is "crashed" and restarted
with backoff. A process the supervisor itself ended (``stop()``, ``mesh stop``, the siblings of
a process that failed to start) is "stopped", never "crashed". ``mesh stop`` leaves a process
"stopped" until ``mesh restart``.

Each process appends to ``<log_dir>/<name>.log``, every start behind a ``RUN_MARKER`` line, and
runs in its own session, so a Ctrl-C in the terminal reaches only ``mesh up``, which then stops
the children in order: nodes get SIGTERM while the registry is still up to receive their
deregistration.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from tenacity import AsyncRetrying, RetryCallState, wait_exponential

from mesh._errors import ConfigError
from mesh._listener import bind_listener
from mesh._meshfile import ProcessSpec
from mesh._settings import CONSUL_SCHEMES

__all__ = ["RUN_MARKER", "Child", "ChildStatus", "Supervisor", "current_run"]

ChildStatus = Literal[
    "pending", "starting", "healthy", "unhealthy", "crashed", "exited", "failed", "stopped"
]

# The first line of each start in a process's log: `mesh logs` and crash reports begin there.
RUN_MARKER = "--- mesh up: starting "


def current_run(data: bytes) -> bytes:
    """The part of a process's log (``data``) written since its latest start."""
    marker = RUN_MARKER.encode()
    at = data.rfind(b"\n" + marker)
    if at >= 0:
        return data[at + 1 :]
    return data


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
    # The supervisor keeps it running; False once it exited, failed or was stopped by hand.
    wanted: bool = False
    log_offset: int = 0  # where its latest start begins in ``log``
    # The crash streak: restarts since it last ran ``stable_after`` (None: none).
    _streak: RetryCallState | None = field(default=None, repr=False)
    _busy: bool = field(default=False, repr=False)  # a restart is in progress
    _restart_task: asyncio.Task[None] | None = field(default=None, repr=False)
    _op_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def tail(self, lines: int = 20) -> str:
        """The last lines the process wrote since its latest start, to show why it died."""
        try:
            with self.log.open("rb") as fh:
                fh.seek(self.log_offset)
                text = fh.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def error_line(self) -> str:
        """The ``mesh: error: ...`` line of its latest start (else its last line)."""
        lines = [ln.strip() for ln in self.tail(200).splitlines() if ln.strip()]
        for line in reversed(lines):
            if line.startswith("mesh: error: "):
                return line.removeprefix("mesh: error: ")
        return lines[-1] if lines else ""

    def info(self) -> dict[str, Any]:
        """What ``mesh ps`` shows of it."""
        return {
            "name": self.spec.name,
            "agent": self.spec.agent,
            "pid": self.pid if self.running else None,
            "url": self.spec.url,
            "status": self.status,
            "detail": self.detail,
            "restarts": self.restarts,
            "uptime_s": round(time.monotonic() - self.started_at, 1) if self.running else None,
            "log": str(self.log),
        }


@dataclass(frozen=True)
class _Probe:
    """One look at a process's health URL."""

    ready: bool  # 200, naming the pid we started
    other_pid: int | None = None  # another process answered instead
    instance_id: str = ""
    agent: str = ""


class _StartFailed(ConfigError):
    """A start did not reach healthy. ``permanent``: trying again would fail the same way."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


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
        low, high = restart_backoff
        # The wait before each restart of a streak: low, 2 x low, 4 x low ... high.
        self._restarts = AsyncRetrying(wait=wait_exponential(multiplier=low, max=high))
        self.stable_after = stable_after
        self.poll_interval = poll_interval
        self._http = httpx.AsyncClient(timeout=2.0, trust_env=False)
        self._started = False
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ----------------------------------------------------------------------------
    def check_ports(self) -> None:
        """Bind every port of the plan (and let go): a busy one is a one-line ``ConfigError``
        naming the port and the process it was meant for. Call it before ``start()``."""
        busy: list[tuple[str, str, int]] = []
        for child in self.children:
            if child.spec.listen is None:
                continue
            host, port = child.spec.listen
            try:
                bind_listener(host, port).close()
            except ConfigError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE):
                    raise ConfigError(f"{child.spec.name}: {exc}") from exc
                busy.append((child.spec.name, host, port))
        if not busy:
            return
        name, host, port = busy[0]
        more = ""
        if len(busy) > 1:
            others = ", ".join(str(p) for _, _, p in busy[1:])
            more = f" (and {len(busy) - 1} more of this mesh's ports: {others})"
        raise ConfigError(
            f"port {port} on {host} (for {name}) is already in use{more}: is another "
            "`mesh up` running? see `mesh ps`, or stop what listens there"
        )

    async def start(self) -> None:
        """Start the registry (if any) and wait for it, then every node concurrently; return
        when all are healthy. Raises ``ConfigError`` (naming the process, with its error line
        or log tail) when one fails to start, after stopping what was started."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        registries = [c for c in self.children if c.spec.kind == "registry"]
        nodes = [c for c in self.children if c.spec.kind != "registry"]
        try:
            for group in (registries, nodes):
                for child in group:
                    await self._spawn(child)
                await self._all_healthy(group)
        except BaseException:
            await self.stop()
            raise
        self._started = True

    async def _all_healthy(self, children: list[Child]) -> None:
        """Wait until each of ``children`` is healthy; on the first failure, stop waiting for
        the others (``stop()`` ends them next: a wait left running would read that as a
        crash) and raise it."""
        waits = [asyncio.ensure_future(self._wait_healthy(c)) for c in children]
        try:
            await asyncio.gather(*waits)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def watch(self) -> None:
        """Restart crashed processes with exponential backoff until ``stop()`` is called."""
        while not self._stopping.is_set():
            now = time.monotonic()
            for child in self.children:
                proc = child.process
                if not child.wanted or child._busy or proc is None:
                    continue
                if proc.returncode is None:
                    if child._streak is not None and now - child.started_at > self.stable_after:
                        child._streak = None
                    continue
                # An exit seen while starting by hand is recorded already.
                recorded = child.exit_code is not None
                status = child.status if recorded else self._exited(child, proc.returncode)
                if status == "crashed":
                    child._busy = True
                    child._restart_task = self._task(self._restart(child))
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
            await asyncio.gather(*(self._stop_child(c, "") for c in group))
        await self._http.aclose()

    # -- one process, on request (`mesh restart` / `mesh stop`) --------------------------------
    def find(self, name: str) -> list[Child]:
        """The processes called ``name``, or every replica of the agent ``name``."""
        found = [c for c in self.children if c.spec.name == name]
        found = found or [c for c in self.children if c.spec.agent == name]
        if not found:
            names = ", ".join(c.spec.name for c in self.children)
            raise ConfigError(f"no process or agent named {name!r} in this mesh (it has: {names})")
        return found

    async def restart_process(self, name: str) -> list[Child]:
        """Stop (if running) and start again each process ``find(name)`` names; return them
        once each is healthy or has failed (``status`` and ``detail`` say which)."""
        children = self._ready_for_requests(name)
        await self._task(self._each(self._restart_by_hand, children))
        return children

    async def stop_process(self, name: str) -> list[Child]:
        """Stop each process ``find(name)`` names; the watcher leaves it stopped."""
        children = self._ready_for_requests(name)
        await self._task(self._each(self._stop_by_hand, children))
        return children

    def _ready_for_requests(self, name: str) -> list[Child]:
        if self._stopping.is_set():
            raise ConfigError("mesh up is stopping")
        if not self._started:
            raise ConfigError("mesh up is still starting: try again once it is up")
        return self.find(name)

    async def _restart_by_hand(self, child: Child) -> None:
        async with child._op_lock:
            await self._cancel_restart(child)
            child._busy = True
            try:
                await self._stop_child(child, "by mesh restart")
                child.wanted = True
                child._streak = None
                await self._spawn(child)
                with contextlib.suppress(_StartFailed):
                    await self._wait_healthy(child)
            finally:
                child._busy = False

    async def _stop_by_hand(self, child: Child) -> None:
        async with child._op_lock:
            await self._cancel_restart(child)
            child.wanted = False
            await self._stop_child(child, "by mesh stop")

    async def _cancel_restart(self, child: Child) -> None:
        task = child._restart_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- internals ----------------------------------------------------------------------------
    def _task(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task ``stop()`` cancels (so nothing spawns behind its back)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _each(
        op: Callable[[Child], Coroutine[Any, Any, None]], children: list[Child]
    ) -> None:
        await asyncio.gather(*(op(c) for c in children))

    async def _spawn(self, child: Child) -> None:
        if self._stopping.is_set():
            raise _StartFailed("mesh up is stopping", permanent=True)
        env = self._env(child)
        with child.log.open("ab") as log:
            child.log_offset = log.tell()
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"{RUN_MARKER}{' '.join(child.spec.argv)} ({stamp})\n".encode())
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
        child.wanted = True
        self._set(child, "starting", f"pid {child.process.pid}")

    def _env(self, child: Child) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **child.spec.env}
        # Modules named in mesh.toml (agents.loan_officer) are imported relative to cwd.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(self.cwd), env.get("PYTHONPATH", "")) if p
        )
        return env

    def _registry_of(self, child: Child) -> str | None:
        """The registry that must list ``child`` before it counts as healthy, if any."""
        if child.spec.registry_url is None:
            return None
        # A node told to use Consul registers there, not with the mesh's registry.
        if self._env(child).get("MESH_DISCOVERY", "").strip().startswith(CONSUL_SCHEMES):
            return None
        return child.spec.registry_url

    async def _probe(self, child: Child) -> _Probe:
        """What the health URL says: ours and ready, another process's, or not yet."""
        try:
            response = await self._http.get(child.spec.health_url)
        except httpx.HTTPError:
            return _Probe(False)
        try:
            body = response.json()
        except ValueError:
            return _Probe(False)
        if not isinstance(body, dict):
            return _Probe(False)
        pid = body.get("pid")
        if not isinstance(pid, int):
            return _Probe(False)
        if pid != child.pid:
            return _Probe(False, other_pid=pid)
        instance = body.get("instance_id")
        agent = body.get("agent")
        return _Probe(
            response.status_code == 200,
            instance_id=instance if isinstance(instance, str) else "",
            agent=agent if isinstance(agent, str) else child.spec.agent,
        )

    async def _listed(self, child: Child, registry: str, probe: _Probe) -> bool:
        """Whether ``registry`` lists the instance that answered ``probe`` as passing."""
        try:
            response = await self._http.get(
                f"{registry.rstrip('/')}/v1/instances", params={"agent": probe.agent}
            )
            listed = response.json().get("instances", []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        for inst in listed if isinstance(listed, list) else []:
            if not isinstance(inst, dict) or inst.get("status", "passing") != "passing":
                continue
            if probe.instance_id and inst.get("instance_id") == probe.instance_id:
                return True
            # A health answer without an instance id: the URL is the next best name.
            if not probe.instance_id and inst.get("url") == child.spec.url:
                return True
        return False

    async def _wait_healthy(self, child: Child) -> None:
        name = child.spec.name
        registry = self._registry_of(child)
        answered = False  # its health said ready: only the registry is missing
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            proc = child.process
            if proc is not None and proc.returncode is not None:
                if child.status == "stopped":  # we ended it: not an exit of its own
                    raise _StartFailed(f"{name} was stopped while starting", permanent=True)
                status = self._exited(child, proc.returncode)
                if status == "failed":
                    raise _StartFailed(
                        f"{name} could not start: {child.detail} (log: {child.log})",
                        permanent=True,
                    )
                raise _StartFailed(
                    f"{name} exited with code {proc.returncode} while starting "
                    f"(log: {child.log}):\n{child.tail()}",
                    permanent=status == "exited",
                )
            probe = await self._probe(child)
            other = probe.other_pid
            if other is not None:
                child.wanted = False
                await self._stop_child(child, "")
                self._set(child, "failed", f"port taken by another process (pid {other})")
                raise _StartFailed(
                    f"{name}: {child.spec.health_url} is answered by another process (pid "
                    f"{other}), not the one mesh up started: is another `mesh up` running? "
                    "see `mesh ps`, or stop that process",
                    permanent=True,
                )
            if probe.ready and (registry is None or await self._listed(child, registry, probe)):
                self._set(child, "healthy", child.spec.url)
                return
            if probe.ready and not answered:
                answered = True
                self._set(child, "starting", f"pid {child.pid}; waiting for {registry} to list it")
            await asyncio.sleep(self.poll_interval)
        if answered:
            self._set(child, "unhealthy", f"up, but {registry} does not list it as passing")
            raise _StartFailed(
                f"{name} answers on {child.spec.health_url}, but the registry at {registry} "
                f"did not list it as passing within {self.start_timeout:.0f}s, so nobody can "
                f"find it by name; its log says why (log: {child.log}):\n{child.tail()}",
                permanent=False,
            )
        self._set(child, "unhealthy", f"no 200 naming pid {child.pid} from {child.spec.health_url}")
        raise _StartFailed(
            f"{name} did not become healthy within {self.start_timeout:.0f}s "
            f"(log: {child.log}):\n{child.tail()}",
            permanent=False,
        )

    def _exited(self, child: Child, code: int) -> ChildStatus:
        """Record an exit and say what it was: exited (0), failed (EX_CONFIG) or crashed."""
        child.exit_code = code
        if code == 0:
            child.wanted = False
            self._set(child, "exited", "exited with code 0")
        elif code == os.EX_CONFIG:
            child.wanted = False
            self._set(child, "failed", child.error_line() or f"exited with code {code}")
        else:
            self._set(child, "crashed", f"exited with code {code}")
        return child.status

    async def _restart(self, child: Child) -> None:
        try:
            while not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self._next_restart_wait(child))
                if self._stopping.is_set():
                    return
                child.restarts += 1
                await self._spawn(child)
                try:
                    await self._wait_healthy(child)
                    return
                except _StartFailed as exc:
                    if exc.permanent:
                        return
                    # Still broken: stop what is left of it and try again, later.
                    await self._stop_child(child, "")
        finally:
            child._busy = False
            child._restart_task = None

    def _next_restart_wait(self, child: Child) -> float:
        """Count one more restart in ``child``'s crash streak; the seconds to wait before it."""
        if child._streak is None:
            child._streak = RetryCallState(self._restarts, fn=None, args=(), kwargs={})
        else:
            child._streak.prepare_for_next_attempt()
        return self._restarts.wait(child._streak)

    async def _stop_child(self, child: Child, detail: str) -> None:
        """SIGTERM (SIGKILL after ``stop_timeout``); "stopped" unless it had already ended."""
        proc = child.process
        if proc is None or proc.returncode is not None:
            if child.status in ("pending", "starting", "healthy", "unhealthy"):
                self._set(child, "stopped", detail)
            return
        notes = [detail] if detail else []
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            notes.append(f"killed: still running {self.stop_timeout:.0f}s after SIGTERM")
        else:
            # 0 and -SIGTERM are what a SIGTERM should end in: nothing to report.
            if proc.returncode not in (0, -signal.SIGTERM):
                notes.append(f"exit code {proc.returncode}")
        child.exit_code = proc.returncode
        self._set(child, "stopped", "; ".join(notes))

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
