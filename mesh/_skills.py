"""Skills: what an agent offers other agents over A2A.

A *typed* skill has a pydantic input model and output model. It is handled either by a Python
function (deterministic specialists) or, with no handler, by the agent's LLM runner (the input
is rendered into the turn and the answer is constrained to the output schema). A *text* skill
has neither model: free text in, free text out. Every LLM agent gets the text skill ``chat``.

    class ScoreRequest(BaseModel):
        applicant_id: str
        amount: float

    @skill(tags=["credit"])
    async def score(req: ScoreRequest, ctx: SkillContext) -> ScoreReport:
        "Score an applicant for a loan amount."
        ...

    summarize = llm_skill("summarize", input=Doc, output=Summary, description="...")

A function skill declared ``@skill(asks=True)`` may ``await ctx.ask(...)`` its caller for input
(see ``SkillContext.ask`` and ``mesh._asks``); the card says which skills may wait. A skill may
attach files and data to its task (``ctx.attach``, see ``mesh._artifacts``), take files of the
media types it declares (``accepts=``, read as ``ctx.files``), and answer with a direct message
instead of a task (``reply="message"``).
"""

from __future__ import annotations

import inspect
import re
import time
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from mesh._artifacts import ATTACHMENTS, Artifact, File, PartValue, attach_to
from mesh._asks import ASK_KINDS, AskKind, Question, Recorded, Suspend, validation_errors
from mesh._errors import ConfigError, ReplayDiverged
from mesh._schema_order import with_property_order

__all__ = ["TEXT_SKILL_ID", "Skill", "SkillContext", "llm_skill", "skill"]

TEXT_SKILL_ID = "chat"
_ID = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_JSON = "application/json"
_TEXT = "text/plain"
#: How a skill answers: a task (the default), or one direct message (``reply="message"``).
Reply = Literal["task", "message"]


@dataclass
class SkillContext:
    """What a skill handler may know about the request it serves."""

    skill_id: str
    task_id: str = ""
    context_id: str = ""
    # Absolute deadline (time.time() seconds) the caller gave, or None.
    deadline: float | None = None
    traceparent: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Whether the skill was declared ``asks=True`` (only those may ``ask``).
    may_ask: bool = False
    #: The answers earlier runs of this task got, in the order the skill asked (the node fills
    #: it when it resumes a waiting task).
    replay: list[Recorded] = field(default_factory=list)
    #: Where ``progress`` goes (the node sets it; None: nowhere).
    reporter: Callable[[str], Awaitable[None]] | None = field(default=None, repr=False)
    #: The file parts of the message, of the media types the skill accepts (``accepts=``).
    files: list[File] = field(default_factory=list)
    _asked: int = field(default=0, init=False, repr=False)

    def attach(self, *parts: PartValue, name: str = "", description: str = "") -> Artifact:
        """Publish ``parts`` as one more named artifact of the task, next to the answer::

            ctx.attach(File(pdf, media_type="application/pdf", name="offer.pdf"))
            ctx.attach({"rate": 1.08}, "EUR/USD 1.08", name="rate")

        A part is text, JSON data (dict, list, pydantic model) or a ``File``; ``name``
        defaults to the first file's name. The artifacts go out when the run ends (with the
        answer, or as the task starts waiting for input); a skill that fails publishes none.
        A direct-message skill (``reply="message"``) has its attachments' parts appended to
        the message."""
        sink = self.metadata.setdefault(ATTACHMENTS, [])
        return attach_to(sink, parts, name, description)

    def remaining(self) -> float | None:
        """Seconds left before the deadline (may be negative), None without a deadline."""
        return None if self.deadline is None else self.deadline - time.time()

    async def progress(self, text: str) -> None:
        """Tell whoever follows the task live how the work goes: a WORKING status update
        saying ``text``, shown by ``mesh call --stream`` and ``mesh chat`` (indented under the
        agent that called this one, when it came through a delegation)::

            await ctx.progress(f"scored {n} of {total} applicants")

        Free when nobody follows: a blocking call (every delegation of a caller that is not
        streamed) sees only the result, so nothing is sent or stored."""
        if self.reporter is not None:
            await self.reporter(text)

    async def ask(
        self,
        question: str,
        *,
        schema: type[BaseModel] | None = None,
        kind: AskKind = "input",
    ) -> Any:
        """Ask the caller: the task waits (``TASK_STATE_INPUT_REQUIRED``, or
        ``TASK_STATE_AUTH_REQUIRED`` with ``kind="auth"``) until a message naming it answers.

        Returns the answer: an instance of ``schema`` (validated; an invalid answer keeps the
        task waiting and tells the caller which field), or the answer's text without one.

        It works by replay: the first time, the run stops here; when the answer comes, the
        skill runs again from the top with the same input, and each ``ask`` returns the answer
        it got before. So a skill must ask the same questions in the same order on every run
        (never depending on time or outside data: ``ReplayDiverged`` otherwise), and work
        done before an ``ask`` runs again (put side effects after the asks, or make them
        idempotent)::

            ok = await ctx.ask("Approve APP-738 for 600,000?", schema=Approval)
        """
        if not self.may_ask:
            raise ConfigError(
                f"skill '{self.skill_id}' called ctx.ask but is not declared to ask: "
                "use @skill(asks=True)"
            )
        if kind not in ASK_KINDS:
            raise ConfigError(f"ctx.ask: kind must be one of {', '.join(ASK_KINDS)}, not {kind!r}")
        seq = self._asked
        self._asked += 1
        asked = Question(
            id=f"q-{seq}",
            text=question,
            kind=kind,
            schema=with_property_order(schema.model_json_schema()) if schema else None,
        )
        if seq >= len(self.replay):
            raise Suspend(asked, seq)
        before = self.replay[seq]
        if before.text != question or before.schema_hash != asked.schema_hash:
            raise ReplayDiverged(
                f"skill '{self.skill_id}' asked {question!r} at step {seq} where it asked "
                f"{before.text!r} before: asks must not depend on time or outside data"
            )
        if schema is None:
            return str(before.answer)
        try:
            return schema.model_validate(before.answer)
        except ValidationError as exc:
            # The schema's check passed where the model is stricter: ask again, saying why.
            raise Suspend(replace(asked, invalid=validation_errors(exc)), seq) from None


Handler = Callable[..., Awaitable[Any]] | Callable[..., Any]


@dataclass(frozen=True)
class Skill:
    id: str
    name: str
    description: str
    input_model: type[BaseModel] | None = None
    output_model: type[BaseModel] | None = None
    # None: the LLM runner handles it.
    handler: Handler | None = None
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    # Extra instruction appended to the agent's for an LLM-handled typed skill.
    instruction: str | None = None
    # Whether the handler wants a SkillContext as its second argument.
    takes_context: bool = False
    # Whether the handler may ``ctx.ask`` (the task may wait for input): declared on the card.
    asks: bool = False
    # Whether a call may outlive one request (minutes): callers send without waiting and
    # follow the task by subscription (declared on the card as ``long_running``).
    long_running: bool = False
    # How the skill answers: a task, or one direct message (no task kept).
    reply: Reply = "task"
    # Media types of file parts the skill takes besides its input (they reach ``ctx.files``).
    accepts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ConfigError(
                f"skill id {self.id!r} is invalid: use lowercase letters, digits, '-' or '_', "
                "starting with a letter"
            )
        if self.asks and self.handler is not None and not self.takes_context:
            raise ConfigError(
                f"skill {self.id!r} is declared asks=True: it must be a function taking "
                "(input, ctx: SkillContext), which asks through ctx.ask"
            )
        if self.reply not in ("task", "message"):
            raise ConfigError(
                f"skill {self.id!r}: reply is 'task' or 'message', not {self.reply!r}"
            )
        if self.reply == "message" and (self.handler is None or self.asks or self.long_running):
            raise ConfigError(
                f"skill {self.id!r}: reply='message' is for a function skill that answers at "
                "once and keeps no state (not asks=True, not long_running, not an LLM skill)"
            )
        for mode in self.accepts:
            if not isinstance(mode, str) or "/" not in mode:
                raise ConfigError(
                    f"skill {self.id!r}: accepts takes media types such as 'image/png' or "
                    f"'image/*', got {mode!r}"
                )
        if (self.input_model is None) != (self.output_model is None):
            raise ConfigError(
                f"skill {self.id!r}: give both an input and an output model, or neither"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler as the decorated function (a test calls ``score(ScoreRequest(...))``
        like before ``@skill``). No validation: the node validates what comes over the wire."""
        if self.handler is None:
            raise ConfigError(
                f"skill {self.id!r} is answered by the agent's model: run it through a Runner "
                "or a node"
            )
        return self.handler(*args, **kwargs)

    @property
    def typed(self) -> bool:
        return self.input_model is not None

    @property
    def llm(self) -> bool:
        return self.handler is None

    @property
    def input_modes(self) -> list[str]:
        """The media types of the parts the skill takes (the card's ``inputModes``): a typed
        skill JSON (a data part, or a text part holding the object), ``chat`` text, plus the
        file types it ``accepts``."""
        base = [_JSON, _TEXT] if self.typed else [_TEXT]
        return [*base, *(m for m in self.accepts if m not in base)]

    @property
    def output_modes(self) -> list[str]:
        """The media types of its answer (a typed result is a data part and its JSON text)."""
        return [_JSON, _TEXT] if self.typed else [_TEXT]

    def input_schema(self) -> dict[str, Any] | None:
        return self.input_model.model_json_schema() if self.input_model else None

    def output_schema(self) -> dict[str, Any] | None:
        return self.output_model.model_json_schema() if self.output_model else None


def _model_of(annotation: Any, what: str, fn_name: str) -> type[BaseModel]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    raise ConfigError(
        f"skill {fn_name!r}: the {what} must be annotated with a pydantic BaseModel subclass, "
        f"got {annotation!r}"
    )


def skill(
    fn: Handler | None = None,
    *,
    id: str | None = None,
    name: str | None = None,
    description: str | None = None,
    tags: typing.Sequence[str] = (),
    examples: typing.Sequence[str] = (),
    asks: bool = False,
    long_running: bool = False,
    reply: Reply = "task",
    accepts: typing.Sequence[str] = (),
) -> Any:
    """Make a typed skill of a function ``(input: In[, ctx: SkillContext]) -> Out``.

    The input and output models come from the annotations, the description from the docstring.
    The id is the function's name as written (``fx_rate`` -> ``fx_rate``) unless ``id=`` says
    otherwise; ``name`` (shown in cards) defaults to ``"Fx rate"``. Usable bare (``@skill``) or
    with options (``@skill(id="score", tags=[...])``). ``asks=True``: the skill may
    ``await ctx.ask(...)`` (see ``SkillContext.ask``). ``long_running=True``: a call may take
    minutes; the card says so and mesh callers follow it without holding a request open
    (docs/delegation.md). ``reply="message"``: the answer is one direct A2A ``Message`` (its
    data part and JSON text), no task kept: for an instantaneous, stateless skill.
    ``accepts=["image/png", ...]``: file parts of those media types come with the input (in
    ``ctx.files``); a part of any other type is refused (-32005). docs/guide.md has the
    reference.
    """

    def build(f: Handler) -> Skill:
        hints = typing.get_type_hints(f)
        params = list(inspect.signature(f).parameters.values())
        if not params:
            raise ConfigError(f"skill {f.__name__!r} must take its input model as first argument")
        input_model = _model_of(hints.get(params[0].name), "first parameter", f.__name__)
        output_model = _model_of(hints.get("return"), "return value", f.__name__)
        # The name as written: what a caller types after reading the code (`--skill fx_rate`).
        skill_id = id or f.__name__
        doc = inspect.getdoc(f) or ""
        return Skill(
            id=skill_id,
            name=name or skill_id.replace("-", " ").replace("_", " ").capitalize(),
            description=description or doc or skill_id,
            input_model=input_model,
            output_model=output_model,
            handler=f,
            tags=tuple(tags),
            examples=tuple(examples),
            takes_context=len(params) > 1,
            asks=asks,
            long_running=long_running,
            reply=reply,
            accepts=tuple(accepts),
        )

    return build(fn) if fn is not None else build


def llm_skill(
    id: str,
    *,
    input: type[BaseModel],
    output: type[BaseModel],
    description: str,
    name: str | None = None,
    instruction: str | None = None,
    tags: typing.Sequence[str] = (),
    examples: typing.Sequence[str] = (),
    asks: bool = False,
) -> Skill:
    """A typed skill answered by the agent's model, its output validated against ``output``.

    ``asks=True`` says on the card that its task may wait for input: a tool of the agent
    returns ``mesh.Ask``, or a remote skill it calls asks (the question is relayed). Callers'
    ``remote()`` then give it ``wait_deadline_s`` instead of ``deadline_s``. Undeclared, such
    a task still waits, but its callers bound it by their working deadline."""
    return Skill(
        id=id,
        name=name or id.replace("-", " ").capitalize(),
        description=description,
        input_model=input,
        output_model=output,
        handler=None,
        tags=tuple(tags),
        examples=tuple(examples),
        instruction=instruction,
        asks=asks,
    )
