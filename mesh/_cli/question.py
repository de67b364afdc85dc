"""What a task waiting for input asks, read off its status message, for the commands that show it
(``mesh tasks``, ``mesh reply``, ``mesh chat``, ``mesh call``) and the answer they send back.

Any A2A agent: a task in ``input-required`` or ``auth-required`` asks what its status message's
text says, and a data part with media type ``application/schema+json`` is the schema of the
answer. A mesh node says more in the message's (or task's) ``urn:mesh:tasks:v1`` metadata: one
entry per open question, with its id, who asks (``asker``, for a question relayed from further
down a chain), the hops it came through (``path``) and, after an invalid answer, what was wrong
(``invalid``). Either way the questions are ``mesh._asks.Question``s, the words the node
that asks uses too.

    [q] = questions_of(task)
    q.text, q.schema               # "Approve APP-738 for 600,000?", {"type": "object", ...}
    answer = parse_answer('{"decision": "approve"}', q)   # checked against the schema
    reply_command(task, ["--agent", "underwriter"])
    # mesh reply T --json '{"decision": "approve"}' --agent underwriter
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mesh._asks import Question
from mesh._errors import ConfigError, SchemaViolation

if TYPE_CHECKING:
    from mesh._a2a.results import TaskResult

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_WAITING",
    "WAITING_STATES",
    "answer_hint",
    "asker_of",
    "check_answer",
    "example_answer",
    "first_line",
    "parse_answer",
    "problems_of",
    "question_lines",
    "questions_of",
    "reply_command",
    "waiting_lines",
]

#: The exit code of ``mesh call`` / ``mesh reply`` when the task waits for an answer.
EXIT_WAITING = 4
#: The exit code of ``mesh reply`` when no agent holds the task.
EXIT_NOT_FOUND = 3
#: The states of a task that waits for its caller (as ``TaskResult.state`` spells them).
WAITING_STATES = frozenset({"input-required", "auth-required"})


def questions_of(task: TaskResult) -> list[Question]:
    """The open questions of ``task`` (none unless it waits), the oldest first
    (``TaskResult.questions``, what a delegation reads too)."""
    return task.questions


def asker_of(question: Question) -> str:
    """The agent that asks a relayed question ("" when the task's own agent asks)."""
    return (question.asker or {}).get("agent", "")


def problems_of(question: Question) -> list[str]:
    """What was wrong with the last answer to ``question``, one line per field."""
    return [
        f"{e['field']}: {e.get('message', '')}" if e.get("field") else e.get("message", "")
        for e in question.invalid
    ]


def first_line(question: Question) -> str:
    return next((line.strip() for line in question.text.splitlines() if line.strip()), "")


# -- answers --------------------------------------------------------------------------------
def parse_answer(line: str, question: Question) -> dict[str, Any] | str:
    """The answer typed as ``line``: for a question with a schema, the JSON object it must be,
    checked against the schema (``ConfigError`` says what is wrong and shows an example);
    otherwise the text itself."""
    if question.schema is None:
        return line
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"the answer must be JSON ({exc.msg}), e.g. {json.dumps(example_answer(question))}"
        ) from None
    return check_answer(value, question)


def check_answer(value: Any, question: Question) -> dict[str, Any]:
    """``value`` checked against the question's schema, as the asking node will check it."""
    from mesh._schema_check import check

    if not isinstance(value, dict):
        raise ConfigError(
            f"the answer must be a JSON object, e.g. {json.dumps(example_answer(question))}"
        )
    if question.schema is None:
        return value
    try:
        checked: dict[str, Any] = check(value, question.schema)
    except SchemaViolation as exc:
        raise ConfigError(f"invalid answer: {exc}") from None
    return checked


def example_answer(question: Question) -> dict[str, Any]:
    """A value of the shape the schema asks for, to show in a hint: each required field (every
    field when none is required) with its default, first choice, or a placeholder."""
    schema = question.schema or {}
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = [str(n) for n in schema.get("required") or () if n in props]
    names = required or [str(n) for n in _ordered(schema, props)]
    return {name: _example(props[name]) for name in names}


def _ordered(schema: Mapping[str, Any], props: Mapping[str, Any]) -> list[Any]:
    """The properties in the schema's ``propertyOrdering`` (a mesh node's hint), else the
    required ones first and the rest by name: a schema that crossed the wire as a protobuf
    ``Struct`` lost its order."""
    order = schema.get("propertyOrdering")
    if isinstance(order, list) and set(order) == set(props):
        return order
    required = [n for n in schema.get("required") or () if n in props]
    return [*dict.fromkeys(required), *sorted(n for n in props if n not in required)]


def _example(prop: Any) -> Any:
    if not isinstance(prop, Mapping):
        return "..."
    if "default" in prop:
        return prop["default"]
    if "const" in prop:
        return prop["const"]
    if isinstance(prop.get("enum"), list) and prop["enum"]:
        return prop["enum"][0]
    for option in prop.get("anyOf") or prop.get("oneOf") or ():
        if isinstance(option, Mapping) and option.get("type") != "null":
            return _example(option)
    kind = prop.get("type")
    return {"integer": 0, "number": 0, "boolean": True, "array": [], "object": {}}.get(
        str(kind), "..."
    )


def answer_hint(question: Question) -> str:
    """One line on how to answer: the schema's fields (``*`` required, choices shown), or that a
    line of text will do."""
    if question.schema is None:
        return "answer with text"
    props = question.schema.get("properties")
    if not isinstance(props, Mapping) or not props:
        return "answer with JSON matching the schema"
    required = set(question.schema.get("required") or ())
    fields = []
    for name in _ordered(question.schema, props):
        prop = props[name] if isinstance(props[name], Mapping) else {}
        if isinstance(prop.get("enum"), list):
            what = "|".join(str(v) for v in prop["enum"])
        else:
            what = str(prop.get("type") or "any")
        fields.append(f"{name}{'*' if name in required else ''}: {what}")
    return f"answer with JSON: {{{', '.join(fields)}}} (* required)"


def reply_command(
    task: TaskResult, where: Sequence[str], question: Question | None = None, mesh: str = "mesh"
) -> str:
    """The ``mesh reply`` command that answers ``task``; ``where`` finds it (``["--agent",
    NAME]`` or ``["--url", URL]``)."""
    question = question or next(iter(questions_of(task)), None)
    if question is not None and question.schema is not None:
        answer = ["--json", json.dumps(example_answer(question))]
    else:
        answer = ["--text", "..."]
    return shlex.join([mesh, "reply", task.task_id, *answer, *where])


def waiting_lines(
    task: TaskResult, agent: str, where: Sequence[str], mesh: str = "mesh"
) -> list[str]:
    """What ``mesh call`` and ``mesh reply`` print for a task that waits: each question (who
    asks it, how to answer it) and the command that answers it."""
    what = "authorization" if task.state == "auth-required" else "input"
    lines = [f"task {task.task_id} of {agent} waits for {what}:", *question_lines(task, agent)]
    question = next(iter(questions_of(task)), None)
    lines.append(f"reply with: {reply_command(task, where, question, mesh)}")
    return lines


def question_lines(task: TaskResult, agent: str) -> list[str]:
    """Each question of a waiting task of ``agent``: who asks (``underwriter (via
    loan-officer)`` for a relayed one), what, what was wrong with the last answer, how to
    answer."""
    lines = []
    for q in questions_of(task):
        asker = asker_of(q)
        who = f"{asker} (via {agent})" if asker and asker != agent else agent
        asks = "needs authorization" if q.kind == "auth" else "asks"
        text = q.text.strip().replace("\n", "\n    ")
        lines.append(f"  ? {who} {asks}: {text}")
        lines.extend(f"    ! {problem}" for problem in problems_of(q))
        lines.append(f"    {answer_hint(q)}")
    return lines
