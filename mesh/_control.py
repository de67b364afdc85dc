"""The control channel of a running ``mesh up``: a lock and a unix socket in its state dir.

    <state_dir>/up.lock    flock()ed by the running ``mesh up`` for its lifetime; holds its pid
    <state_dir>/up.sock    one JSON line each way:
                           {"op": "ps"} | {"op": "restart" | "stop", "name": "credit-bureau-1"}
                           -> {"ok": true, "processes": [...]} | {"ok": false, "error": "..."}

``UpLock`` makes ``mesh up`` one per state dir: a second one fails at once, before it touches
the live mesh's logs. ``ControlServer`` answers ``mesh ps`` / ``restart`` / ``stop`` for a
``Supervisor``; ``ask()`` is their client. The socket is only reachable by the user who runs the
mesh (mode 0600, in a directory of theirs), which is all the authentication it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from mesh._errors import ConfigError

if TYPE_CHECKING:
    from mesh._supervisor import Supervisor

__all__ = [
    "ControlReply",
    "ControlRequest",
    "ControlServer",
    "ProcessInfo",
    "UpLock",
    "ask",
    "up_running",
]

# A restart waits for the process to be healthy: as long as `mesh up --start-timeout` allows.
_ASK_TIMEOUT_S = 300.0
_READ_LIMIT = 64 * 1024
# sun_path holds 108 bytes on Linux (104 on macOS); deeper state dirs get a socket in /tmp.
_MAX_SOCKET_PATH = 100


class ControlRequest(BaseModel):
    """What a ``mesh ps`` / ``restart`` / ``stop`` asks of the running ``mesh up``."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["ps", "restart", "stop"]
    name: str | None = None


class ProcessInfo(BaseModel):
    """One process as ``mesh ps`` shows it."""

    name: str
    agent: str
    pid: int | None
    url: str
    status: str
    detail: str
    restarts: int
    uptime_s: float | None
    log: str


class ControlReply(BaseModel):
    """The answer: every process after the operation, or an error saying what to do."""

    ok: bool
    error: str = ""
    processes: list[ProcessInfo] = []


def socket_path(state_dir: Path) -> Path:
    """Where the running ``mesh up`` of ``state_dir`` listens."""
    path = state_dir / "up.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"mesh-up-{os.getuid()}-{digest}.sock"


def up_running(state_dir: Path) -> bool:
    """Whether a ``mesh up`` holds the ``UpLock`` of ``state_dir`` (asked without taking it)."""
    try:
        fd = os.open(state_dir / "up.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        # A shared lock is refused only while the exclusive one is held; if granted, it is
        # dropped at once (a mesh up starting in that instant would be told to try again).
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class UpLock:
    """An exclusive ``flock`` on ``<state_dir>/up.lock``, held while ``mesh up`` runs. The
    kernel drops it when the process ends, however it ends, so a stale file locks nothing."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "up.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``ConfigError`` naming the ``mesh up`` that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise ConfigError(
                f"another `mesh up`{who} is already running this mesh (state dir "
                f"{self.path.parent}): see it with `mesh ps`; stop it with Ctrl-C in its "
                "terminal first to start again"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None

    def __enter__(self) -> UpLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class ControlServer:
    """Serves ``ControlRequest``s for ``supervisor`` on ``socket_path(state_dir)`` while in
    ``async with``. Start it only while holding the ``UpLock``: it replaces any socket file."""

    def __init__(self, supervisor: Supervisor, state_dir: Path) -> None:
        self.supervisor = supervisor
        self.path = socket_path(state_dir)
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> ControlServer:
        # Left behind by a mesh up that was killed; we hold the lock, so nobody serves it.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(
            self._handle, path=str(self.path), limit=_READ_LIMIT
        )
        os.chmod(self.path, 0o600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10.0)
            reply = await self._answer(line)
            writer.write(reply.model_dump_json().encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):
            pass  # the client went away or sent too much: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, line: bytes) -> ControlReply:
        try:
            request = ControlRequest.model_validate_json(line)
        except ValidationError as exc:
            return ControlReply(ok=False, error=f"bad request: {exc.errors()[0]['msg']}")
        sup = self.supervisor
        try:
            if request.op != "ps":
                if not request.name:
                    return ControlReply(ok=False, error=f"{request.op} needs a process name")
                if request.op == "restart":
                    await sup.restart_process(request.name)
                else:
                    await sup.stop_process(request.name)
        except ConfigError as exc:
            return ControlReply(ok=False, error=str(exc))
        except asyncio.CancelledError:
            # stop() cancelled the operation; if this handler itself is cancelled, let it be.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return ControlReply(ok=False, error="mesh up is stopping")
        processes = [ProcessInfo.model_validate(c.info()) for c in sup.children]
        return ControlReply(ok=True, processes=processes)


async def ask(state_dir: Path, request: ControlRequest, *, meshfile: str) -> ControlReply:
    """Send ``request`` to the ``mesh up`` running for ``state_dir``; ``ConfigError`` (saying
    how to start one) when none is."""
    path = socket_path(state_dir)
    try:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=_READ_LIMIT * 16)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise ConfigError(
            f"no `mesh up` is running for {meshfile} (state dir {state_dir}): start it with "
            f"`mesh up {meshfile}`, or run this from the folder it was started in"
        ) from exc
    try:
        writer.write(request.model_dump_json().encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), _ASK_TIMEOUT_S)
    except TimeoutError as exc:
        raise ConfigError(
            f"the `mesh up` running for {meshfile} did not answer within {_ASK_TIMEOUT_S:.0f}s"
        ) from exc
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    if not line:
        raise ConfigError(f"the `mesh up` running for {meshfile} closed the connection: stopping?")
    return ControlReply.model_validate_json(line)
