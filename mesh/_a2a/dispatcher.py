"""``SkillDispatcher``: one skill request in, one validated outcome out (no A2A types here).

* Function skills: validate the input, call the handler, validate its output.
* LLM typed skills: render the input into the turn (JSON), run the agent's runner with
  ``response_schema`` = the output schema, validate; on a validation error tell the model what
  was wrong ONCE, then give up with ``SkillOutputError``.
* ``chat``: the text goes to the runner as is; the answer is text.

The runner is used through ``run_stream`` only, so progress (partial text, tool calls) can be
forwarded to the caller as it happens. Partial text is asked of the model only while someone
reads it: each model call streams when the task is followed at that moment (the run's
``Relay.live``: a streamed send, or a ``SubscribeToTask`` of it); otherwise the answer comes
whole, and a follower that arrives mid-turn gets partial text from the next model call on. A
turn whose tool asked (``mesh.Ask``) raises ``TurnSuspended`` through ``run``; ``resume`` goes
on with the answers (``resume_stream``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ValidationError

from mesh._agent import Agent
from mesh._errors import ConfigError, RunError, SkillInputError, SkillOutputError
from mesh._events import Event
from mesh._pending import PendingTurn
from mesh._skills import TEXT_SKILL_ID, Skill, SkillContext
from mesh._types import Usage

if TYPE_CHECKING:
    from mesh._a2a.json_text import JsonText
    from mesh._a2a.relay import Relay

__all__ = [
    "Outcome",
    "ProgressSink",
    "SkillDispatcher",
    "TurnRunner",
    "WaitCheck",
    "describe_validation",
    "skill_agent",
]


class TurnRunner(Protocol):
    """The part of ``mesh._runner.Runner`` a node needs."""

    def run_stream(
        self,
        *,
        user_id: str,
        session_id: str,
        message: str,
        response_schema: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        waiting: Callable[[str], Awaitable[bool]] | None = None,
        live: Callable[[], bool] | None = None,
        new_session: bool = False,
    ) -> AsyncIterator[Event]: ...

    def resume_stream(
        self,
        *,
        user_id: str,
        session_id: str,
        turn: PendingTurn,
        answers: Mapping[str, Any],
        response_schema: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        live: Callable[[], bool] | None = None,
    ) -> AsyncIterator[Event]: ...

    async def cancel_children(self, turn: PendingTurn) -> None: ...


#: Whether a task still waits (the runner's check of a session marked waiting).
WaitCheck = Callable[[str], Awaitable[bool]]
#: Whether anyone reads a turn's partial events now (asked before each model call).
Live = Callable[[], bool]
#: One turn's events: a new turn or a resumed one, for ``runner``, response schema, metadata.
TurnStream = Callable[
    [TurnRunner, dict[str, Any] | None, dict[str, Any], Live], AsyncIterator[Event]
]

ProgressSink = Callable[[Event], Awaitable[None]]


@dataclass
class Outcome:
    """What a skill produced: ``data`` for typed skills, ``text`` for chat."""

    data: dict[str, Any] | None = None
    text: str = ""
    usage: Usage = field(default_factory=Usage)


def _expected_type(schema: dict[str, Any] | None, loc: tuple[Any, ...]) -> str | None:
    if not schema or len(loc) != 1:
        return None
    prop = (schema.get("properties") or {}).get(str(loc[0])) or {}
    if "type" in prop:
        return str(prop["type"])
    options = [str(o["type"]) for o in prop.get("anyOf", []) if "type" in o]
    return " or ".join(options) or None


def describe_validation(
    exc: ValidationError, schema: dict[str, Any] | None = None, *, limit: int = 5
) -> tuple[str, list[dict[str, Any]]]:
    """A one-line message naming each bad field and what it expected, plus structured errors."""
    parts: list[str] = []
    errors: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False)[:limit]:
        loc = tuple(err.get("loc", ()))
        where = ".".join(str(p) for p in loc) or "(root)"
        expected = _expected_type(schema, loc)
        detail = str(err.get("msg", "invalid"))
        if err.get("type") == "missing":
            detail = "required field is missing"
        line = f"field '{where}': {detail}"
        if expected:
            line += f" (expected {expected})"
        if err.get("type") != "missing" and "input" in err:
            line += f", got {json.dumps(err['input'], default=str)[:60]}"
        parts.append(line)
        errors.append({"field": where, "message": detail, "expected": expected})
    return "; ".join(parts), errors


def skill_agent(agent: Agent, skill: Skill) -> Agent:
    """The agent as it runs an LLM typed skill: its instruction says what the JSON turn asks.

    The turn itself is the input as JSON only (so scripts can read ``{input.field}``); what to
    do with it travels in the system instruction.
    """
    lines = [agent.instruction or ""]
    lines.append(
        f"A user message that is a JSON object is a request for the skill '{skill.id}': "
        f"{skill.description} Answer with one JSON object matching the response schema."
    )
    if skill.instruction:
        lines.append(skill.instruction)
    return replace(agent, instruction="\n\n".join(line for line in lines if line))


def _stream(
    user_id: str,
    session_id: str,
    *,
    message: str = "",
    waiting: WaitCheck | None = None,
    resume: tuple[PendingTurn, Mapping[str, Any]] | None = None,
    new_session: bool = False,
) -> TurnStream:
    """A turn's events from a runner: a new turn on ``message`` (``new_session``: in a context
    the node made for it, see ``Runner.run_stream``), or the suspended turn of ``resume``
    going on with its answers."""

    def turn(
        runner: TurnRunner, schema: dict[str, Any] | None, meta: dict[str, Any], live: Live
    ) -> AsyncIterator[Event]:
        if resume is not None:
            pending, answers = resume
            events = functools.partial(runner.resume_stream, turn=pending, answers=answers)
        else:
            events = functools.partial(
                runner.run_stream, message=message, waiting=waiting, new_session=new_session
            )
        return events(
            user_id=user_id, session_id=session_id, response_schema=schema, metadata=meta, live=live
        )

    return turn


def _never() -> bool:
    return False


def _always() -> bool:
    return True


def _live(ctx: SkillContext, progress: ProgressSink | None) -> Live:
    """Whether partial text has a reader now: the run's relay says so in a node (someone
    follows its task); without a sink nobody reads any; a sink without a relay reads all."""
    if progress is None:
        return _never
    relay: Relay | None = ctx.metadata.get("relay")
    if relay is None:
        return _always
    return lambda: relay.live


#: pydantic's own ``model_dump`` and ``model_validate`` (``_plain``).
_DUMP = BaseModel.model_dump
_VALIDATE = BaseModel.model_validate.__func__  # type: ignore[attr-defined]


def _plain(model: type[BaseModel]) -> bool:
    """Whether ``model`` keeps pydantic's own ``model_dump`` and ``model_validate`` (no
    override): they are then its serializer's ``to_python`` and its validator's
    ``validate_python`` with their defaults, called here directly (``model_dump``'s and
    ``model_validate``'s own frames cost ~0.5 us a call, three calls a typed answer).
    Decided on every call, not cached by model: a method replaced on the class after the
    first request is called from then on, as calling it directly would (two class attribute
    reads, ~0.1 us)."""
    if model.model_dump is not _DUMP:
        return False
    return getattr(model.model_validate, "__func__", None) is _VALIDATE


def _parse_json(text: str) -> Any:
    body = text.strip()
    if body.startswith("```"):
        body = body.strip("`")
        body = body.removeprefix("json").strip()
    return json.loads(body)


class SkillDispatcher:
    """Runs the skills of one agent. ``runner`` (chat) and ``skill_runners`` (one per LLM typed
    skill, see ``skill_agent``) are needed only for LLM-handled skills."""

    def __init__(
        self,
        agent: Agent,
        runner: TurnRunner | None = None,
        skill_runners: dict[str, TurnRunner] | None = None,
    ) -> None:
        self.agent = agent
        self.runner = runner
        self.skill_runners = dict(skill_runners or {})
        self._skills = {s.id: s for s in agent.all_skills}
        self._typed = [s for s in agent.all_skills if s.typed]

    def resolve(
        self,
        skill_id: str | None,
        *,
        has_data: bool,
        has_text: bool,
        text_object: JsonText | None = None,
    ) -> Skill:
        """Which skill a request names (or implies). Raises ``SkillInputError`` with the fix.

        ``text_object``: the JSON object the request's text holds (``mesh._a2a.json_text``),
        None when its text does not look like one. Such text goes to a typed skill: the only
        one, or the single one whose input schema the object is valid against; other text goes
        to ``chat``. A skill named (``skill_id``) is found by its name alone: nothing else is
        read then (a caller that names one need not look at its parts)."""
        if skill_id:
            found = self._skills.get(skill_id)
            if found is None:
                import difflib  # a misspelt skill only

                close = difflib.get_close_matches(skill_id, self._skills, n=1, cutoff=0.6)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise SkillInputError(
                    f"unknown skill '{skill_id[:100]}'; {hint}{self.agent.name} offers: "
                    + ", ".join(sorted(self._skills))
                )
            return found
        if has_data:
            if len(self._typed) == 1:
                return self._typed[0]
            raise SkillInputError(
                "metadata field 'skill' is required with a data part: "
                f"{self.agent.name} has typed skills " + ", ".join(s.id for s in self._typed)
            )
        if text_object is not None and self._typed:
            if text_object.value is not None:
                return self._by_schema(text_object.value)
            if TEXT_SKILL_ID not in self._skills:
                raise SkillInputError(f"{text_object.problem}: {self._typed_need()}")
        if has_text and TEXT_SKILL_ID in self._skills:
            return self._skills[TEXT_SKILL_ID]
        if has_text and self._typed:
            raise SkillInputError(f"got text that is not a JSON object: {self._typed_need()}")
        raise SkillInputError(
            "the message needs a data part (typed skill) or text parts (chat), and metadata "
            "field 'skill' naming one of: " + ", ".join(sorted(self._skills))
        )

    def _typed_need(self) -> str:
        """What a typed skill of this agent takes (the end of a rejection)."""
        if len(self._typed) == 1:
            return (
                f"skill '{self._typed[0].id}' expects a data part (application/json), or one "
                "text part holding a JSON object, matching its input schema"
            )
        return (
            f"{self.agent.name}'s typed skills ("
            + ", ".join(s.id for s in self._typed)
            + ") expect a data part (application/json), or one text part holding a JSON "
            "object, matching the input schema of the skill named in metadata field 'skill'"
        )

    def _by_schema(self, value: dict[str, Any]) -> Skill:
        """The typed skill for a JSON object sent as text: the only typed skill (its input
        is validated next, naming the field), or the single one whose schema it matches."""
        if len(self._typed) == 1:
            return self._typed[0]
        matched: list[Skill] = []
        problems: list[str] = []
        for candidate in self._typed:
            try:
                self.validate_input(candidate, value)
            except SkillInputError as exc:
                problems.append(f"{candidate.id} ({exc.args[0].split(': ', 1)[-1]})")
            else:
                matched.append(candidate)
        if len(matched) == 1:
            return matched[0]
        chat = (
            f"; for {TEXT_SKILL_ID}, send text that is not a JSON object"
            if TEXT_SKILL_ID in self._skills
            else ""
        )
        if matched:
            raise SkillInputError(
                "the JSON object matches the input schema of several skills: "
                + ", ".join(s.id for s in matched)
                + "; name one in metadata field 'skill'"
                + chat
            )
        raise SkillInputError(
            "the JSON object matches the input schema of none of the typed skills: "
            + "; ".join(problems)
            + "; fix the object, or name the skill in metadata field 'skill'"
            + chat
        )

    def validate_input(self, skill: Skill, data: Any) -> BaseModel:
        """The validated input model; ``SkillInputError`` naming the field otherwise."""
        assert skill.input_model is not None
        if not isinstance(data, dict):
            raise SkillInputError(
                f"skill '{skill.id}' expects a JSON object matching its input schema, "
                f"got {type(data).__name__}"
            )
        model = skill.input_model
        try:
            if _plain(model):
                validated: BaseModel = model.__pydantic_validator__.validate_python(data)
                return validated
            return model.model_validate(data)
        except ValidationError as exc:
            message, errors = describe_validation(exc, skill.input_schema())
            raise SkillInputError(
                f"invalid input for skill '{skill.id}': {message}", errors
            ) from exc

    def validate_output(self, skill: Skill, value: Any) -> dict[str, Any]:
        output = skill.output_model
        assert output is not None
        plain = _plain(output)
        try:
            if isinstance(value, BaseModel):
                kind = type(value)
                if _plain(kind):
                    value = kind.__pydantic_serializer__.to_python(value, mode="json")
                else:
                    value = value.model_dump(mode="json")
            model: BaseModel
            if plain:
                model = output.__pydantic_validator__.validate_python(value)
            else:
                model = output.model_validate(value)
        except ValidationError as exc:
            message, _ = describe_validation(exc, skill.output_schema())
            raise SkillOutputError(
                f"skill '{skill.id}' produced invalid output: {message}"
            ) from exc
        if plain:
            dumped: dict[str, Any] = output.__pydantic_serializer__.to_python(model, mode="json")
            return dumped
        return model.model_dump(mode="json")

    async def run(
        self,
        skill: Skill,
        payload: BaseModel | str,
        ctx: SkillContext,
        *,
        user_id: str,
        progress: ProgressSink | None = None,
        waiting: WaitCheck | None = None,
        new_session: bool = False,
    ) -> Outcome:
        """Do the work. ``payload`` is the validated input model, or the text for ``chat``.
        ``waiting``: whether the task a waiting session names still waits (``Runner``).
        ``new_session``: the context id was made for this request (no session has it)."""
        if not skill.llm:
            return await self.call(skill, payload, ctx)
        text = payload if isinstance(payload, str) else payload.model_dump_json()
        turn = _stream(
            user_id, ctx.context_id, message=text, waiting=waiting, new_session=new_session
        )
        return await self._llm(skill, turn, ctx, user_id, progress)

    async def cancel_children(self, pending: PendingTurn) -> None:
        """CancelTask for the child tasks a waiting turn relays questions of (a cancel or a
        deadline of its task reaches them)."""
        runner = self.runner or next(iter(self.skill_runners.values()), None)
        if runner is not None and pending.children:
            await runner.cancel_children(pending)

    async def resume(
        self,
        skill: Skill,
        pending: PendingTurn,
        answers: Mapping[str, Any],
        ctx: SkillContext,
        *,
        user_id: str,
        progress: ProgressSink | None = None,
    ) -> Outcome:
        """Go on with an LLM skill's turn that stopped because a tool asked (``TurnSuspended``),
        with the answers recorded so far (by question id); the same checks as ``run``."""
        turn = _stream(user_id, ctx.context_id, resume=(pending, answers))
        return await self._llm(skill, turn, ctx, user_id, progress)

    async def _llm(
        self,
        skill: Skill,
        turn: TurnStream,
        ctx: SkillContext,
        user_id: str,
        progress: ProgressSink | None,
    ) -> Outcome:
        if skill.typed:
            return await self._llm_typed(skill, turn, ctx, user_id, progress)
        return await self._turn(self.runner, turn, None, ctx, progress)

    async def call(self, skill: Skill, payload: Any, ctx: SkillContext | None = None) -> Outcome:
        """A function skill's handler on its validated input, and its output validated (what
        ``run`` does for one); ``ctx`` may be None for a handler that takes no context."""
        assert skill.handler is not None
        args = (payload, ctx) if skill.takes_context else (payload,)
        result = skill.handler(*args)
        # A coroutine (an ``async def`` handler's) known by its type before the general test.
        if type(result) is CoroutineType or inspect.isawaitable(result):
            result = await result
        return Outcome(data=self.validate_output(skill, result))

    async def _llm_typed(
        self,
        skill: Skill,
        turn: TurnStream,
        ctx: SkillContext,
        user_id: str,
        progress: ProgressSink | None,
    ) -> Outcome:
        schema = skill.output_schema()
        runner = self.skill_runners.get(skill.id, self.runner)
        outcome = await self._turn(runner, turn, schema, ctx, progress)
        try:
            outcome.data = self._check_answer(skill, outcome)
            return outcome
        except SkillOutputError as first:
            repair = (
                f"Your answer did not validate: {first}. Answer again with only one JSON "
                "object that matches the output schema."
            )
            again = _stream(user_id, ctx.context_id, message=repair)
            second = await self._turn(runner, again, schema, ctx, progress)
            second.usage = outcome.usage + second.usage
            try:
                second.data = self._check_answer(skill, second)
            except SkillOutputError as exc:
                raise SkillOutputError(f"{exc} (after one repair attempt)") from exc
            return second

    def _check_answer(self, skill: Skill, outcome: Outcome) -> dict[str, Any]:
        if outcome.data is not None:
            return self.validate_output(skill, outcome.data)
        try:
            value = _parse_json(outcome.text)
        except ValueError as exc:
            raise SkillOutputError(f"skill '{skill.id}' answer is not JSON: {exc}") from exc
        return self.validate_output(skill, value)

    async def _turn(
        self,
        runner: TurnRunner | None,
        turn: TurnStream,
        schema: dict[str, Any] | None,
        ctx: SkillContext,
        progress: ProgressSink | None,
    ) -> Outcome:
        if runner is None:
            raise ConfigError(f"agent {self.agent.name!r} has no runner for LLM skills")
        metadata = {"skill": ctx.skill_id, "task_id": ctx.task_id, **ctx.metadata}
        if ctx.traceparent:
            metadata["traceparent"] = ctx.traceparent
        if ctx.deadline is not None:
            metadata["deadline"] = ctx.deadline
        usage: Usage | None = None
        final: Event | None = None
        async for event in turn(runner, schema, metadata, _live(ctx, progress)):
            if not event.partial and event.usage is not None:
                usage = event.usage if usage is None else usage + event.usage
            if event.final:
                final = event
            elif progress is not None:
                await progress(event)
        if final is None:
            raise RunError("the turn ended without a final answer")
        data = final.metadata.get("data") if schema is not None else None
        return Outcome(
            data=data if isinstance(data, dict) else None,
            text=final.text,
            usage=usage if usage is not None else Usage(),
        )
