"""``mesh reply``: answer a task that waits for input, found at whichever agent of the registry
holds it, and print what became of it.

mesh reply 6f1c… --json '{"decision": "approve", "note": "collateral checked"}'
mesh reply 9d03… --text "R-17" --agent loan-officer
mesh reply 9d03… --text "R-17" --url http://127.0.0.1:8401

The answer is checked against the question's schema before anything is sent; it goes to the
task as A2A answers a waiting task (``taskId`` and the task's ``contextId``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from mesh._a2a.metadata_keys import CALLER_TASK, read
from mesh._asks import TASKS_EXTENSION, Question
from mesh._cli.question import (
    EXIT_NOT_FOUND,
    EXIT_WAITING,
    WAITING_STATES,
    answer_hint,
    check_answer,
    problems_of,
    questions_of,
    waiting_lines,
)
from mesh._cli.serve import Lookup, in_declared_order, lookup_location
from mesh._cli.tasks import PARALLEL, Unreachable, failure, instances, registry_flag, task_client
from mesh._errors import ConfigError, MeshError, RemoteError

if TYPE_CHECKING:
    import httpx

    from mesh._a2a.client import A2APeer
    from mesh._a2a.results import TaskResult

__all__ = ["add_parsers", "print_outcome", "reply"]


async def reply(
    task_id: str,
    answer: dict[str, Any] | str,
    *,
    location: Lookup | str,
    agent: str | None = None,
    url: str | None = None,
    question_id: str | None = None,
    token: str | None = None,
    timeout_s: float = 300.0,
    registry_args: Sequence[str] = (),
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Answer the waiting task ``task_id`` (found at ``url``, else at ``agent``'s instances,
    else at every agent's) and print what became of it. The exit code: 0 answered, 1 refused
    (an invalid answer, a task that does not wait) or the task failed, 3 no agent has the
    task, 4 it waits again (its next question is printed, with the ``mesh reply`` command that
    answers it: ``registry_args`` go in it when the registry is not the default one)."""
    from mesh._cli.up import mesh_command

    places = [(url, url)] if url else await instances(location, [agent] if agent else [])
    async with task_client(token, timeout_s) as http:
        found, unreachable = await _find(http, places, task_id)
        if found is None:
            asked = ", ".join(dict.fromkeys(name for name, _ in places)) or "none"
            print(f"mesh: error: no agent has task {task_id} (asked: {asked})", file=err)
            for u in unreachable:
                print(f"mesh: could not ask {u}", file=err)
            return EXIT_NOT_FOUND
        name, peer, task = found
        label = peer.name if peer.name != peer.base_url else name  # the card's name
        try:
            question = _question(task, question_id)
            if question is not None:
                answer = _checked(answer, question, task)
            ext = (
                {TASKS_EXTENSION: {"answers": question.id}}
                if question is not None and question.id
                else None
            )
            if parent := str(read(task.metadata, CALLER_TASK) or ""):
                # A hop of a chain: its caller's task learns of this answer only when it runs
                # again (design: answer at the top, the answer goes down).
                caller = str(task.metadata.get("caller") or "its caller")
                print(
                    f"mesh: note: task {task.task_id} works for {caller}'s task {parent}; "
                    f"answering that one instead lets {caller} go on with the answer",
                    file=err,
                )
            result = await peer.send(
                answer,
                task_id=task.task_id,
                context_id=task.context_id,
                metadata=ext,
                timeout=timeout_s,
            )
            result = await in_declared_order(peer, result)
        except (ConfigError, RemoteError) as exc:
            print(f"mesh: error: {exc}", file=err)
            return 1
        finally:
            await peer.aclose()
    where = ["--url", url] if url else ["--agent", name, *registry_args]
    return print_outcome(result, label, where, out, err, mesh_command())


def print_outcome(
    result: TaskResult,
    agent: str,
    where: Sequence[str],
    out: TextIO,
    err: TextIO,
    mesh: str = "mesh",
) -> int:
    """Print a task after an answer: its result, or its next question (exit 4), or why it
    ended (exit 1); an answer it refused (``invalid`` in its question) is exit 1."""
    if result.state in WAITING_STATES:
        problems = [p for q in questions_of(result) for p in problems_of(q)]
        for line in waiting_lines(result, agent, where, mesh):
            print(line, file=out)
        return 1 if problems else EXIT_WAITING
    if result.ok:
        if result.data is not None:
            print(json.dumps(result.data, indent=2), file=out)
        elif result.text:
            print(result.text, file=out)
        print(f"(task {result.task_id} completed)", file=err)
        return 0
    if result.done:
        error = result.error or {}
        print(
            f"mesh: task {result.task_id} {result.state}: {error.get('message', result.text)}",
            file=err,
        )
        return 1
    print(f"task {result.task_id} is {result.state}", file=out)
    return 0


async def _find(
    http: httpx.AsyncClient, places: Sequence[tuple[str, str]], task_id: str
) -> tuple[tuple[str, A2APeer, TaskResult] | None, list[Unreachable]]:
    """The first instance that has ``task_id`` (asked all at once), its peer left open."""
    from mesh._a2a.client import A2APeer

    gate = asyncio.Semaphore(PARALLEL)
    failed: list[Unreachable] = []

    async def one(agent: str, url: str) -> tuple[str, A2APeer, TaskResult] | None:
        peer = A2APeer(http, url)
        try:
            async with gate, asyncio.timeout(10.0):
                task = await peer.find_task(task_id)
        except (MeshError, TimeoutError) as exc:
            failed.append(Unreachable(agent, url, failure(exc, url)))
            task = None
        if task is None:
            await peer.aclose()
            return None
        return agent, peer, task

    results = await asyncio.gather(*(one(agent, url) for agent, url in places))
    hits = [r for r in results if r is not None]
    for _, peer, _ in hits[1:]:  # replicas of one store: the first answer will do
        await peer.aclose()
    return (hits[0] if hits else None), failed


def _question(task: TaskResult, question_id: str | None) -> Question | None:
    questions = questions_of(task)
    if question_id is None:
        return questions[0] if questions else None
    for q in questions:
        if q.id == question_id:
            return q
    open_ids = ", ".join(q.id for q in questions if q.id) or "none"
    raise ConfigError(
        f"task {task.task_id} has no open question {question_id!r} (open: {open_ids})"
    )


def _checked(answer: dict[str, Any] | str, question: Question, task: TaskResult) -> Any:
    """The answer checked here, before it is sent: the agent would refuse it the same way."""
    if question.schema is None:
        return answer
    if isinstance(answer, str):
        raise ConfigError(
            f"task {task.task_id} asks for JSON matching a schema: answer with --json "
            f"(the question's fields: {_fields(question)})"
        )
    return check_answer(answer, question)


def _fields(question: Question) -> str:
    return answer_hint(question).removeprefix("answer with JSON: ")


def _reply(args: argparse.Namespace) -> int:
    from mesh._settings import MeshSettings

    answer: dict[str, Any] | str
    if args.json is not None:
        try:
            answer = json.loads(args.json)
        except ValueError as exc:
            raise ConfigError(f"--json is not valid JSON: {exc}") from exc
        if not isinstance(answer, dict):
            raise ConfigError('--json must be a JSON object, e.g. \'{"decision": "approve"}\'')
    else:
        answer = args.text
    settings = MeshSettings.from_environment()
    url = args.url.rstrip("/") if args.url else None
    if url is not None and not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {args.url!r}: give the node's URL, e.g. http://127.0.0.1:8401")
    code: int = asyncio.run(
        reply(
            args.task_id,
            answer,
            location=lookup_location(args.registry, settings),
            agent=args.agent,
            url=url,
            question_id=args.question,
            token=settings.mesh_token,
            timeout_s=args.timeout,
            registry_args=["--registry", args.registry] if args.registry else [],
        )
    )
    return code


def add_parsers(sub: Any) -> None:
    """Register ``reply`` on the ``mesh`` sub-command parser."""
    r = sub.add_parser(
        "reply",
        help="answer a task that waits for input",
        description="Send the answer to a task that waits for input (input-required or "
        "auth-required), found at the agent that holds it, and print what became of it. "
        "Exit codes: 0 answered, 1 refused (an invalid answer, a task that does not wait) or "
        "the task failed, 2 usage, 3 no agent has the task, 4 the task asks again.",
    )
    r.add_argument("task_id", metavar="TASK_ID", help="the task (see mesh tasks --waiting)")
    what = r.add_mutually_exclusive_group(required=True)
    what.add_argument("--json", default=None, help="the answer as a JSON object")
    what.add_argument("--text", default=None, help="the answer as text")
    at = r.add_mutually_exclusive_group()
    at.add_argument("--agent", default=None, help="the agent that holds the task (found faster)")
    at.add_argument("--url", default=None, help="the node that holds the task")
    registry_flag(r)
    r.add_argument("--question", default=None, help="the question's id, when several are open")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (300)")
    r.set_defaults(handler=_reply)
