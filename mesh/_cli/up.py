"""``mesh up`` (run a whole mesh from a mesh.toml) and ``mesh chat`` (talk to one agent).

mesh up                       # ./mesh.toml, else agents/mesh.toml (the loan desk)
mesh up path/to/mesh.toml     # then mesh ps / logs / restart / stop (mesh/_cli/control.py)
mesh chat loan-officer        # by name, through the registry
mesh chat http://127.0.0.1:8401
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from mesh._asks import TASKS_EXTENSION
from mesh._cli.progress import attached_lines, chat_progress_line, turn_answer
from mesh._cli.question import (
    WAITING_STATES,
    parse_answer,
    question_lines,
    questions_of,
    reply_command,
)
from mesh._cli.serve import Lookup, find_agent_url, lookup_location
from mesh._cli.table import format_table
from mesh._settings import DEFAULT_REGISTRY_URL
from mesh._tls import client_context

if TYPE_CHECKING:
    from mesh._a2a.client import A2APeer
    from mesh._a2a.results import TaskResult
    from mesh._meshfile import MeshFile
    from mesh._supervisor import Child, Supervisor

__all__ = ["add_parsers", "mesh_command", "shown_path"]

_MARK = {
    "pending": " ",
    "starting": "…",
    "healthy": "✓",
    "unhealthy": "!",
    "crashed": "✗",
    "exited": "■",
    "failed": "✗",
    "stopped": "■",
}
# Lines of a crashed process's log (its latest start only) shown under the crash.
_CRASH_LINES = 8


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser(
        "up",
        help="start the registry and every node of a mesh file; Ctrl-C stops them",
        description="Start the registry and every node of a mesh file as separate processes, "
        "restart crashed nodes, and stop everything on Ctrl-C or SIGTERM. Nothing starts unless "
        "every port is free and no other `mesh up` runs for the same state dir. Logs go to "
        "<state_dir>/logs/; `mesh ps`, `mesh logs`, `mesh restart` and `mesh stop` act on the "
        "running mesh.",
    )
    up.add_argument(
        "meshfile",
        nargs="?",
        default=None,
        help="default: mesh.toml in the root, else agents/mesh.toml (the demo)",
    )
    up.add_argument(
        "--root",
        default=".",
        help="directory the processes run in (modules and relative paths resolve here)",
    )
    up.add_argument(
        "--start-timeout", type=float, default=60.0, help="seconds to wait for each process"
    )
    up.set_defaults(handler=_run_up)

    chat = sub.add_parser(
        "chat",
        help="talk to an agent (by name through the registry, or by URL)",
        description="An interactive conversation with one agent over A2A, in one context: "
        "tool and peer calls are shown as they happen. When a task asks something (it waits "
        "for input), its question is shown and the next line answers it (JSON when the "
        "question has a schema). Type 'exit' or Ctrl-D to leave.",
    )
    chat.add_argument("agent", help="agent name (e.g. loan-officer) or URL")
    chat.add_argument(
        "--registry",
        default=None,
        help=f"registry URL to find the agent (default $MESH_REGISTRY or {DEFAULT_REGISTRY_URL})",
    )
    chat.add_argument("--context-id", default=None, help="continue an existing context")
    chat.add_argument(
        "-m",
        "--message",
        action="append",
        default=None,
        help="send this message instead of reading the terminal (repeatable)",
    )
    chat.add_argument("--timeout", type=float, default=120.0, help="seconds per answer")
    chat.set_defaults(handler=_run_chat)


def _run_up(args: argparse.Namespace) -> int:
    # Imported here: every `mesh` command builds this parser, only `up` needs these.
    from mesh._meshfile import load_meshfile, meshfiles_in
    from mesh._settings import MeshSettings

    # Read (and checked) once here: a bad variable stops `mesh up` before any child inherits it.
    settings = MeshSettings.from_environment()
    root = Path(args.root).resolve()
    path = args.meshfile or shown_path(meshfiles_in(root)[0])
    meshfile = load_meshfile(path)
    return asyncio.run(
        up(
            meshfile,
            root=root,
            start_timeout=args.start_timeout,
            meshfile_path=path,
            cli_registry=settings.registry_url,
        )
    )


def shown_path(path: Path) -> str:
    """``path`` as the user would type it here: relative to the current folder when inside."""
    here = Path.cwd()
    for full in (Path(os.path.abspath(path)), path.resolve()):
        if full.is_relative_to(here):
            return str(full.relative_to(here))
    return str(path)


def mesh_command() -> str:
    """How to run this very ``mesh`` from the user's shell: ``mesh`` when that is the one on
    PATH, else its path (``.venv/bin/mesh`` after ``make run``, whose venv is not active), else
    ``python -m mesh`` with this Python."""
    scripts = [Path(sys.executable).parent / "mesh"]
    if Path(sys.argv[0]).name == "mesh":
        scripts.insert(0, Path(sys.argv[0]))
    script = next((s for s in scripts if s.is_file()), None)
    if script is None:
        return f"{shlex.quote(sys.executable)} -m mesh"
    on_path = shutil.which("mesh")
    if on_path is not None and os.path.samefile(on_path, script):
        return "mesh"
    return shlex.quote(shown_path(script))


async def up(
    meshfile: MeshFile,
    *,
    root: Path,
    start_timeout: float = 60.0,
    out: TextIO = sys.stdout,
    meshfile_path: str = "agents/mesh.toml",
    cli_registry: str = DEFAULT_REGISTRY_URL,
) -> int:
    """Run the mesh until SIGINT/SIGTERM. Returns the exit code. ``cli_registry`` is the
    registry the CLI finds by default (the commands it suggests name this mesh's when it differs).

    Nothing starts, and no log is written, unless this is the only ``mesh up`` of the state
    dir (``UpLock``) and every port of the plan is free; a ``ConfigError`` says which is not.
    """
    from mesh._control import ControlServer, UpLock
    from mesh._supervisor import Supervisor

    state_dir = meshfile.state_path(root)
    log_dir = state_dir / "logs"
    started = False

    def report(child: Child) -> None:
        # Before everything is up, show every step; afterwards only what matters.
        if started and child.status in ("starting", "pending"):
            return
        restarts = f"(restart {child.restarts})" if child.restarts else ""
        about = " ".join(x for x in (child.detail, restarts) if x)
        line = f"  {_MARK[child.status]} {child.spec.name:<20} {child.status:<9} {about}"
        print(line.rstrip(), file=out, flush=True)
        if started and child.status == "crashed":
            for line in child.tail(_CRASH_LINES).splitlines():
                print(f"      | {line}", file=out, flush=True)

    specs = meshfile.plan(root)
    supervisor = Supervisor(
        specs, log_dir=log_dir, cwd=root, on_change=report, start_timeout=start_timeout
    )
    with UpLock(state_dir):
        supervisor.check_ports()
        async with ControlServer(supervisor, state_dir):
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                print(
                    f"mesh up: starting {len(specs)} processes of {meshfile_path} (logs in "
                    f"{shown_path(log_dir)})",
                    file=out,
                    flush=True,
                )
                start = asyncio.create_task(supervisor.start())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not start.done():
                    start.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await start
                    stopper.cancel()
                    await supervisor.stop()
                    print("mesh up: interrupted while starting; stopped", file=out, flush=True)
                    return 130
                stopper.cancel()
                start.result()  # raises ConfigError (after stopping everything) on a failure
                started = True
                _print_table(meshfile, supervisor, out)
                try_it = await _first_command(supervisor, _registry_flag(meshfile, cli_registry))
                _print_next_steps(meshfile, out, meshfile_path, root, try_it)
                watcher = asyncio.create_task(supervisor.watch())
                await stop.wait()
                print("mesh up: stopping…", file=out, flush=True)
                await supervisor.stop()
                await watcher
                print("mesh up: stopped", file=out, flush=True)
                return 0
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)


def _print_table(meshfile: MeshFile, supervisor: Supervisor, out: TextIO) -> None:
    rows = [
        (c.spec.agent, c.spec.name, c.spec.url, "ok" if c.status == "healthy" else c.status)
        for c in supervisor.children
    ]
    print(file=out)
    print(
        textwrap.indent(format_table(("AGENT", "PROCESS", "URL", "HEALTH"), rows), "  "), file=out
    )
    print(file=out)


def _registry_flag(meshfile: MeshFile, cli_registry: str) -> str:
    """``--registry URL`` when the CLI would not find this mesh's registry by default."""
    registry = meshfile.registry.public_url
    return "" if registry.rstrip("/") == cli_registry.rstrip("/") else f" --registry {registry}"


def _print_next_steps(
    meshfile: MeshFile, out: TextIO, meshfile_path: str, root: Path, try_it: str
) -> None:
    """The registry page, a first command that works with this mesh, how to manage it."""
    from mesh._meshfile import MESHFILE_NAMES

    mesh = mesh_command()
    print(f"registry page: {meshfile.registry.public_url}/", file=out)
    if try_it:
        print(f"try:           {mesh} {try_it}", file=out)
    # Without --meshfile, `mesh ps` in this folder finds the running one of these.
    found_anyway = Path(meshfile_path).resolve() in {(root / n).resolve() for n in MESHFILE_NAMES}
    which = "" if found_anyway else f" --meshfile {shlex.quote(meshfile_path)}"
    print(f"manage:        {mesh} ps{which}; {mesh} logs|restart|stop NAME{which}", file=out)
    print("Ctrl-C stops everything.", file=out, flush=True)


async def _first_command(supervisor: Supervisor, flag: str) -> str:
    """A command to try first, read from the running nodes' cards: ``chat`` with the first
    agent that takes text, else ``call`` of the first typed skill (with its example)."""
    import httpx

    from mesh._discovery.base import CARD_PATH

    urls: dict[str, str] = {}
    for child in supervisor.children:
        if child.spec.kind == "node":
            urls.setdefault(child.spec.agent, child.spec.url)
    cards: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
        for url in urls.values():
            try:
                card = (await http.get(url + CARD_PATH)).json()
            except (httpx.HTTPError, ValueError):
                continue
            if isinstance(card, dict) and isinstance(card.get("name"), str):
                cards.append(card)
    for card in cards:
        # A text skill (chat): text in, no JSON (a typed skill takes JSON text too).
        modes = [_input_modes(card, skill) for skill in _skills(card)]
        if any("text/plain" in m and "application/json" not in m for m in modes):
            return f"chat {card['name']}{flag}"
    for card in cards:
        for skill in _skills(card):
            example = next(iter(skill.get("examples") or []), None)
            if isinstance(example, str) and _is_json(example) and isinstance(skill.get("id"), str):
                return (
                    f"call {card['name']} --skill {skill['id']} --json {shlex.quote(example)}{flag}"
                )
    return ""


def _skills(card: dict[str, Any]) -> list[dict[str, Any]]:
    skills = card.get("skills")
    return [s for s in skills if isinstance(s, dict)] if isinstance(skills, list) else []


def _input_modes(card: dict[str, Any], skill: dict[str, Any]) -> list[str]:
    modes = skill.get("inputModes") or card.get("defaultInputModes") or []
    return modes if isinstance(modes, list) else []


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# -- chat -------------------------------------------------------------------------------------
def _run_chat(args: argparse.Namespace) -> int:
    from mesh._settings import MeshSettings

    settings = MeshSettings.from_environment()
    messages: list[str] | None = args.message
    return asyncio.run(
        chat(
            args.agent,
            registry=lookup_location(args.registry, settings),
            token=settings.mesh_token,
            messages=messages,
            context_id=args.context_id,
            answer_timeout_s=args.timeout,
            registry_args=["--registry", args.registry] if args.registry else [],
        )
    )


async def _resolve(agent: str, registry: Lookup | str) -> str:
    if agent.startswith(("http://", "https://")):
        return agent.rstrip("/")
    return await find_agent_url(agent, registry)


async def chat(
    agent: str,
    *,
    registry: Lookup | str,
    token: str | None = None,
    messages: list[str] | None = None,
    context_id: str | None = None,
    answer_timeout_s: float = 120.0,
    registry_args: Sequence[str] = (),
    out: TextIO = sys.stdout,
) -> int:
    """Talk to ``agent`` (name or URL, looked up at ``registry``: a registry's URL or
    ``consul://host:port``): ``messages`` in order, or lines read from stdin. ``token``: the
    mesh token, sent as a bearer token.

    When a task stops to ask something (input-required, auth-required), its question is shown
    and the next message is the answer to it (JSON checked against the question's schema when
    it has one: a wrong answer is explained and not sent); ``registry_args`` go in the
    ``mesh reply`` command shown for a task still waiting when the chat ends."""
    import httpx

    from mesh._a2a.client import A2APeer, auth_headers

    url = await _resolve(agent, registry)
    where = ["--url", url] if agent.startswith(("http://", "https://")) else ["--agent", agent]
    timeout = httpx.Timeout(10.0, read=answer_timeout_s)
    headers = auth_headers(token)
    async with httpx.AsyncClient(
        timeout=timeout, headers=headers, trust_env=False, verify=client_context()
    ) as http:
        peer = A2APeer(http, url)
        try:
            card = await peer.card_dict()
            print(f"talking to {card.get('name', agent)} at {url} (exit or Ctrl-D to leave)",
                  file=out, flush=True)  # fmt: skip
            name = str(card.get("name") or agent)
            pending = list(messages) if messages is not None else None
            failures = 0
            waiting: TaskResult | None = None  # the task whose question the next line answers
            while True:
                prompt = "answer> " if waiting is not None else "you> "
                if pending is not None:
                    if not pending:
                        break
                    text = pending.pop(0)
                    print(f"{prompt}{text}", file=out, flush=True)
                else:
                    try:
                        text = await asyncio.to_thread(input, prompt)
                    except EOFError:
                        print(file=out)
                        break
                    if not sys.stdin.isatty():  # piped: show what was read, as a terminal does
                        print(text, file=out, flush=True)
                text = text.strip()
                if not text:
                    continue
                if text in ("exit", "quit"):
                    break
                if waiting is None:
                    context_id, result = await _turn(peer, text, context_id, answer_timeout_s, out)
                else:
                    answered = await _answer(peer, waiting, text, answer_timeout_s, out)
                    if answered is None:  # not sent: the same question waits for a better one
                        continue
                    context_id, result = answered
                waiting = result if result is not None and result.state in WAITING_STATES else None
                if waiting is not None:
                    _show_question(waiting, name, out)
                failures += 0 if waiting is not None or (result and result.ok) else 1
            if waiting is not None:
                hint = reply_command(waiting, [*where, *registry_args], mesh=mesh_command())
                print(f"(task {waiting.task_id} still waits: {hint})", file=out, flush=True)
        finally:
            await peer.aclose()
    if context_id:
        print(f"(context {context_id})", file=out, flush=True)
    return 1 if failures else 0


def _show_question(task: TaskResult, agent: str, out: TextIO) -> None:
    """The questions of a waiting task, inline: who asks, what, and how to answer."""
    for line in question_lines(task, agent):
        print(line, file=out)
    out.flush()


async def _answer(
    peer: A2APeer, task: TaskResult, text: str, read_timeout_s: float, out: TextIO
) -> tuple[str | None, TaskResult | None] | None:
    """Send ``text`` as the answer to the first question of ``task`` and show what follows;
    None when it was not sent (not the JSON the question asks for: said why)."""
    from mesh._errors import ConfigError, RemoteError

    questions = questions_of(task)
    question = questions[0] if questions else None
    try:
        answer = parse_answer(text, question) if question is not None else text
    except ConfigError as exc:
        print(f"  ! {exc}", file=out, flush=True)
        return None
    meta = (
        {TASKS_EXTENSION: {"answers": question.id}}
        if question is not None and question.id
        else None
    )
    try:
        return await _turn(
            peer,
            answer,
            task.context_id,
            read_timeout_s,
            out,
            task_id=task.task_id,
            metadata=meta,
        )
    except RemoteError as exc:  # refused (the task no longer waits): say so, read it again
        print(f"  ! {exc}", file=out, flush=True)
        return task.context_id, await peer.get_task(task.task_id)


async def _turn(
    peer: A2APeer,
    payload: dict[str, Any] | str,
    context_id: str | None,
    read_timeout_s: float,
    out: TextIO,
    *,
    task_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> tuple[str | None, TaskResult | None]:
    """One message (or an answer to the waiting ``task_id``): show progress (tool and peer
    calls) as it streams, then the answer; the task as it ended (None without one)."""
    streamed = ""
    stream = peer.stream(
        payload, context_id=context_id, timeout=read_timeout_s, task_id=task_id, metadata=metadata
    )
    async for update in stream:
        task_id = update.task_id or task_id
        context_id = update.context_id or context_id
        if update.kind == "message":  # a direct reply, no task
            shown = json.dumps(update.data) if update.data is not None else update.text
            print(f"agent> {shown}", file=out, flush=True)
            return context_id, None
        if update.partial and update.text:
            if not streamed:
                print("agent> ", end="", file=out)
            streamed += update.text
            print(update.text, end="", file=out, flush=True)
        elif (line := chat_progress_line(update)) is not None:
            print(line, file=out, flush=True)
    if streamed:
        print(file=out)
    if not task_id:
        print("agent> (no answer)", file=out, flush=True)
        return context_id, None
    result = await peer.get_task(task_id)
    if result.state in WAITING_STATES:
        return result.context_id or context_id, result
    if said := turn_answer(result, streamed):
        print(f"agent> {said}", file=out, flush=True)
    if result.ok:
        for line in attached_lines(result):
            print(f"  {line}", file=out, flush=True)
    return result.context_id or context_id, result
