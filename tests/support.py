"""Helpers for tests that run real processes on 127.0.0.1.

port = free_port()
with Proc.start(["mesh", "serve", "agents.credit_bureau:agent", "--port", str(port)],
                name="bureau", tmp=tmp_path) as node:
    wait_until_ok(f"http://127.0.0.1:{port}/health")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Variables that configure mesh, Consul or a model provider: a test (tests/conftest.py) and a
# child it starts (clean_env) see none of the developer's, only what the test sets itself.
ISOLATED_PREFIXES = ("GOOGLE_", "GEMINI_", "MESH_", "CONSUL_")

# What the credit bureau scores the applicants on file (agents.applicants). Written out rather
# than computed with the bureau's own function, so a change to its scoring fails the tests
# instead of moving their expectations along with it.
BUREAU_SCORES = {"APP-501": 445, "APP-612": 482, "APP-738": 864, "APP-847": 816, "APP-902": 642}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child: no model keys (so the scripted model is used), no mesh or
    Consul settings, no proxies."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(ISOLATED_PREFIXES)
        and k.lower() not in {"http_proxy", "https_proxy", "all_proxy"}
    }
    env["PYTHONUNBUFFERED"] = "1"
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


def archived_tree(commit: str, dest: Path) -> Path:
    """``git archive commit`` of this checkout extracted into ``dest`` (made), for a test that
    serves the tree before a change beside this one; skips the test when there is no such
    commit (a shallow clone). Its processes need ``PYTHONSAFEPATH=1`` with the tree on
    PYTHONPATH: ``python -m`` and ``-c`` put the working directory, this checkout, first."""
    import pytest

    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.skip(f"no git archive of {commit}: {archive.stderr.decode()[:200]}")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def wait_for(
    predicate: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the condition may raise while the service starts
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or predicate}: {last_exc!r}"
    )


@contextlib.asynccontextmanager
async def uvicorn_serving(
    app: Any, port: int, *, host: str = "127.0.0.1", what: str = "the server", **options: Any
) -> AsyncIterator[Any]:
    """``app`` served by a real uvicorn in this event loop on ``host:port`` (``options`` go to
    ``uvicorn.Config``) until the block ends; yields the ``uvicorn.Server``."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), what=f"{what} to start")
        assert not task.done(), f"{what} did not start"
        yield server
    finally:
        server.should_exit = True
        await task


async def eventually(
    predicate: Callable[[], Any], *, within: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """The async twin of ``wait_for``: poll ``predicate`` (sync or async) until it returns a
    truthy value, keeping the event loop running; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while loop.time() < deadline:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(
        f"timed out after {within}s waiting for {what or predicate} (last value {last!r})"
    )


def wait_until_ok(url: str, *, timeout: float = 20.0, proc: Proc | None = None) -> httpx.Response:
    """Wait until GET ``url`` answers 200 (fails early if ``proc`` exits)."""

    def check() -> httpx.Response | None:
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(
                f"{proc.name} exited with {proc.popen.returncode}:\n{proc.output()}"
            )
        r = httpx.get(url, timeout=2.0)
        return r if r.status_code == 200 else None

    return wait_for(check, timeout=timeout, what=f"200 from {url}")


class Proc:
    """A child process whose output goes to a log file (read it with ``output()``)."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, log: Path) -> None:
        self.popen = popen
        self.name = name
        self.log = log

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        name: str,
        tmp: Path,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> Proc:
        log = tmp / f"{name}.log"
        argv = list(argv)
        if argv[0] == "mesh":
            argv = [sys.executable, "-m", "mesh", *argv[1:]]
        fh = log.open("ab")
        popen = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=env or clean_env(), cwd=cwd
        )
        fh.close()
        return cls(popen, name, log)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return int(self.popen.returncode)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            self.terminate()


@contextlib.contextmanager
def running(
    argv: Sequence[str],
    *,
    name: str,
    tmp: Path,
    health: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Iterator[Proc]:
    """Start a process, wait for ``health`` to answer 200, stop it on exit."""
    proc = Proc.start(argv, name=name, tmp=tmp, env=env)
    try:
        if health:
            wait_until_ok(health, timeout=timeout, proc=proc)
        yield proc
    finally:
        proc.terminate()


class StaticDiscovery:
    """Stands in for ``DiscoveryClient`` (``remote(...).bind(discovery=...)``): always the same
    instances, in this order."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    async def require(self, *, agent: str | None = None, skill: str | None = None) -> list[Any]:
        from mesh._discovery.base import Instance

        return [Instance(instance_id=u, agent=agent or "", url=u) for u in self.urls]

    def invalidate(self, *, agent: str | None = None) -> None:
        pass

    async def aclose(self) -> None:
        pass
