"""Run the code blocks of a Markdown document as a reader would, top to bottom.

What runs, per fenced block (the language after the backticks):

* ``python``: saved as a script and run with the venv's Python (exit 0 expected). A block whose
  first line is ``# file: PATH`` is saved as ``PATH`` instead, and imported if it is a module,
  so later blocks (``mesh serve pkg.mod:agent``) can use it. ``# file:`` works for any language
  (a ``toml`` mesh file, say).
* ``sh`` / ``bash`` / ``console``: each command (``\\`` continues a line) runs with bash.
  ``mesh serve``, ``mesh registry`` and ``mesh up`` keep running, in the background, until the
  document ends (a server on a port an earlier one holds, or a ``mesh up``, replaces it, as a
  reader would stop the first with Ctrl-C); the next command runs once it answers on
  ``/health``. A command naming an agent (``mesh call fx-desk ...``) waits until the registry
  lists a passing instance of it. ``mesh up`` counts as started once it prints its table. A
  trailing ``# error: TEXT`` means the command must fail and say TEXT; ``# -> TEXT`` that its
  output contains TEXT (for ``mesh up``: its output up to the table). A command that prints a Python warning (``...Warning:``) fails: a reader
  following the docs should see nothing alarming. Only ``mesh`` and ``python`` commands run:
  anything else must be marked (below).
* Other languages and unlabelled blocks (output, JSON, YAML...) are not code to run.

``<!-- not-run: REASON -->`` on the line before a fence marks an illustration: the test skips it
and shows REASON.

Each document gets a workspace (a temporary directory with ``.venv`` linked to the repo's, and
the repo on ``PYTHONPATH`` so ``agents.*`` imports) and its own free ports: every port the
document names (``--port 8017``, ``127.0.0.1:8400``, ``port = 8400``) is replaced by a free
one, the same everywhere in the document, and ``MESH_REGISTRY`` points at the replacement of
8400, the default registry. No model key is set: LLM agents run their offline scripts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from mesh._meshfile import meshfiles_in
from tests.support import ROOT, Proc, clean_env, free_port, wait_for, wait_until_ok

__all__ = ["Block", "DocRun", "blocks_of"]

RUN_LANGS = {"python": "python", "sh": "sh", "bash": "sh", "console": "sh"}
DEFAULT_REGISTRY_PORT = 8400
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<reason>.+?)\s*-->\s*$")
_FILE = re.compile(r"^\s*#\s*file:\s*(?P<path>\S+)\s*$")
_PORT = re.compile(
    r"(?P<pre>(?:127\.0\.0\.1|localhost):|--port[ =]|^\s*port\s*=\s*)(?P<port>\d{4,5})\b", re.M
)
_DIRECTIVE = re.compile(r"\s#\s*(?P<kind>error:|->)\s*(?P<text>.+?)\s*$")
_SERVERS = {"serve", "registry", "up"}
_NAMED = {"call", "show", "card"}
_AGENT = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
# A Python warning's category (DeprecationWarning, PytestDeprecationWarning, ...), not a log level.
_WARNING = re.compile(r"\b[A-Z]\w*Warning\b")
_UP_READY = "Ctrl-C stops everything"


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repo
    line: int  # of the opening fence, 1-based
    lang: str  # "python", "sh", or the file's language
    code: str
    skip: str | None = None  # the not-run reason
    file: str | None = None  # the ``# file:`` path

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    def __repr__(self) -> str:
        return f"Block({self.id})"


def blocks_of(doc: Path) -> list[Block]:
    """The blocks of ``doc`` that run or are saved (others are left out)."""
    rel = str(doc.relative_to(ROOT))
    lines = doc.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, fence, lang = i, m.group("fence"), m.group("lang").lower()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m.group("indent")) :])
            i += 1
        i += 1
        previous = lines[start - 1] if start > 0 else ""
        skip = _NOT_RUN.match(previous)
        file = _FILE.match(body[0]) if body else None
        if lang not in RUN_LANGS and file is None:
            continue
        found.append(
            Block(
                doc=rel,
                line=start + 1,
                lang=RUN_LANGS.get(lang, lang),
                code="\n".join(body) + "\n",
                skip=skip.group("reason") if skip else None,
                file=file.group("path") if file else None,
            )
        )
    return found


@dataclass
class _Server:
    proc: Proc
    ports: list[int]


@dataclass
class DocRun:
    """One document's workspace, ports and background servers."""

    doc: str
    blocks: list[Block]
    tmp: Path
    ports: dict[int, int] = field(default_factory=dict)
    servers: list[_Server] = field(default_factory=list)
    done: dict[str, str | None] = field(default_factory=dict)  # block id -> failure or None

    def __repr__(self) -> str:
        return f"DocRun({self.doc}, {self.tmp})"

    def __post_init__(self) -> None:
        (self.tmp / ".venv").symlink_to(ROOT / ".venv")
        for block in self.blocks:
            if block.skip is None:
                for m in _PORT.finditer(block.code):
                    self._port(int(m.group("port")))
        self._port(DEFAULT_REGISTRY_PORT)
        bin_dir = str(Path(sys.executable).parent)
        self.env = clean_env(
            PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONPATH=f"{self.tmp}{os.pathsep}{ROOT}",
            MESH_REGISTRY=f"http://127.0.0.1:{self._port(DEFAULT_REGISTRY_PORT)}",
        )

    # -- running ------------------------------------------------------------------------------
    def run_through(self, block: Block) -> None:
        """Run every block up to ``block`` that has not run, then ``block``; fail like it.

        An earlier block that failed does not stop this one (it may not need it); if this one
        fails too, the message names the earlier failures.
        """
        failed_before: list[str] = []
        try:
            for earlier in self.blocks:
                if earlier.skip is not None:
                    continue
                if earlier.id not in self.done:
                    try:
                        self._run(earlier)
                        self.done[earlier.id] = None
                    except Exception as exc:
                        self.done[earlier.id] = str(exc) or type(exc).__name__
                        if earlier is block:
                            raise
                if earlier is block:
                    break
                if self.done[earlier.id] is not None:
                    failed_before.append(earlier.id)
        except AssertionError as exc:
            if failed_before:
                raise AssertionError(f"{exc}\n(earlier blocks failed: {failed_before})") from exc
            raise
        finally:
            if block is self._last_runnable():
                self.stop()

    def stop(self) -> None:
        for server in reversed(self.servers):
            with contextlib.suppress(Exception):
                server.proc.terminate()
        self.servers.clear()

    def _last_runnable(self) -> Block | None:
        runnable = [b for b in self.blocks if b.skip is None]
        return runnable[-1] if runnable else None

    def _run(self, block: Block) -> None:
        code = self._substitute(block.code)
        if block.file is not None:
            self._save(block.file, code)
        elif block.lang == "python":
            self._python(block, code)
        else:
            self._shell(block, code)

    def _save(self, rel: str, code: str) -> None:
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
        if path.suffix == ".py":
            module = ".".join(Path(rel).with_suffix("").parts)
            self._check([sys.executable, "-c", f"import {module}"], what=f"import {module} ({rel})")

    def _python(self, block: Block, code: str) -> None:
        script = self.tmp / f"snippet_{block.line}.py"
        script.write_text(code)
        self._check([sys.executable, str(script)], what=f"python block {block.id}")

    def _shell(self, block: Block, code: str) -> None:
        for command in _commands(code):
            self._command(block, command)

    def _command(self, block: Block, command: str) -> None:
        directive = _DIRECTIVE.search(command)
        argv = shlex.split(command, comments=True)
        if not argv:
            return
        program = Path(argv[0]).name
        if argv[0].startswith(">") or program not in {"mesh", "python", "python3", "pytest"}:
            raise AssertionError(
                f"{block.id}: {command!r} is not a mesh or python command; mark the block "
                "<!-- not-run: REASON --> or teach tests/snippets.py to run it"
            )
        if program == "mesh" and len(argv) > 1 and argv[1] == "chat" and "-m" not in argv:
            raise AssertionError(f"{block.id}: `mesh chat` without -m is interactive; mark it")
        if program == "mesh" and len(argv) > 1 and argv[1] in _SERVERS:
            said = self._start(block, argv)
            if directive is not None and directive.group("kind") == "->":
                text = directive.group("text")
                assert text in said, (
                    f"{block.id}: {command!r} should say {text!r}; it said:\n{said}"
                )
            return
        if program == "mesh" and len(argv) > 2 and argv[1] in _NAMED and _AGENT.match(argv[2]):
            self._wait_registered(argv[2])
        expect_error = directive is not None and directive.group("kind") == "error:"
        done = self._check(
            ["bash", "-c", command], what=f"{block.id}: {command}", ok=not expect_error
        )
        warning = _WARNING.search(done.stdout + done.stderr)
        assert warning is None, (
            f"{block.id}: {command!r} printed a warning ({warning.group()}):\n"
            f"{done.stdout}{done.stderr}"
        )
        if directive is not None:
            text = directive.group("text")
            assert text in done.stdout + done.stderr, (
                f"{block.id}: {command!r} should say {text!r}; it said:\n{done.stdout}{done.stderr}"
            )

    def _start(self, block: Block, argv: list[str]) -> str:
        """Start a server command in the background; what it printed once ready."""
        name = f"{Path(block.doc).stem}-{block.line}-{argv[1]}-{len(self.servers)}"
        if argv[1] == "up":
            given = next((a for a in argv[2:] if not a.startswith("-")), None)
            meshfile = self.tmp / given if given else meshfiles_in(self.tmp)[0]
            ports = _meshfile_ports(meshfile)
            self.stop()  # `mesh up` runs the whole mesh: the reader stopped what ran before
        else:
            ports = [int(argv[argv.index("--port") + 1])] if "--port" in argv else [8000]
        for server in [s for s in self.servers if set(s.ports) & set(ports)]:
            server.proc.terminate()  # the reader stopped it: the port is needed again
            self.servers.remove(server)
        proc = Proc.start(
            ["bash", "-c", "exec " + shlex.join(argv)], name=name, tmp=self.tmp, env=self.env,
            cwd=self.tmp,
        )  # fmt: skip
        self.servers.append(_Server(proc, ports))
        if argv[1] == "up":
            # Its table comes once every node is healthy and registered: what a reader waits for.
            wait_for(lambda: _UP_READY in proc.output() or proc.popen.poll() is not None,
                     timeout=90, what=f"{block.id}: mesh up's table")  # fmt: skip
            assert _UP_READY in proc.output(), f"{block.id}: mesh up failed:\n{proc.output()}"
            return proc.output()
        for port in ports:
            wait_until_ok(f"http://127.0.0.1:{port}/health", timeout=60, proc=proc)
        return proc.output()

    def _wait_registered(self, agent: str) -> None:
        registry = self.env["MESH_REGISTRY"]

        def passing() -> bool:
            r = httpx.get(
                f"{registry}/v1/instances", params={"agent": agent}, timeout=2, trust_env=False
            )
            return r.status_code == 200 and bool(r.json().get("instances"))

        wait_for(passing, timeout=30, what=f"{agent} registered at {registry}")

    def _check(
        self, argv: list[str], *, what: str, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, cwd=self.tmp, env=self.env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        if (done.returncode == 0) != ok:
            expected = "succeed" if ok else "fail"
            raise AssertionError(
                f"{what} should {expected}; exit {done.returncode}\n"
                f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
                + self._server_logs()
            )
        return done

    def _server_logs(self) -> str:
        return "".join(
            f"\n--- {s.proc.name} (last lines)\n" + "\n".join(s.proc.output().splitlines()[-15:])
            for s in self.servers
        )

    # -- ports --------------------------------------------------------------------------------
    def _port(self, port: int) -> int:
        if port not in self.ports:
            self.ports[port] = free_port()
        return self.ports[port]

    def _substitute(self, code: str) -> str:
        return _PORT.sub(lambda m: m.group("pre") + str(self._port(int(m.group("port")))), code)


def _commands(code: str) -> list[str]:
    """Command lines of a shell block: comments and blank lines dropped, ``\\`` joined."""
    commands: list[str] = []
    current = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        commands.append(current + line)
        current = ""
    if current:
        commands.append(current)
    return commands


def _meshfile_ports(path: Path) -> list[int]:
    data = tomllib.loads(path.read_text())
    ports = [int(data.get("registry", {}).get("port", DEFAULT_REGISTRY_PORT))]
    for node in data.get("nodes", {}).values():
        first, _, last = str(node["port"]).partition("-")
        ports += range(int(first), int(last or first) + 1)
    return ports
