"""Tools: what a model may call during a turn.

    @tool
    async def lookup_applicant(applicant_id: str) -> dict:
        "Return the applicant's profile: name, monthly income, existing obligations."

A ``Tool`` has a ``name``, a ``description``, a JSON Schema of its ``parameters`` and an async
``call(args, ctx)``. A plain function becomes a ``FunctionTool``: its parameter schema comes from
the type hints (through pydantic, which also validates the model's arguments before the call), its
description from the docstring. A parameter annotated ``ToolContext`` is injected, not shown to
the model. A ``Toolset`` expands to several tools at the start of each turn (a remote agent gives
one tool per skill).

The model sees a tool's outcome as ``{"result": value}`` or, when it raised,
``{"error": {"type", "message", ...}}``; see ``invoke_tool``. A tool that needs its caller
to decide returns ``Ask(question, schema=Model)``: the turn waits for the answer, which becomes
that call's ``{"result": answer}`` (see ``Ask``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mesh._artifacts import Artifact, PartValue, attach_to
from mesh._asks import ASK_KINDS, AskKind, Question
from mesh._errors import ConfigError, ToolError
from mesh._schema_order import with_property_order

__all__ = [
    "Ask",
    "FunctionTool",
    "StateView",
    "Tool",
    "ToolContext",
    "Toolset",
    "as_tool",
    "current_context",
    "invoke_tool",
    "jsonable",
    "tool",
]


@dataclass(frozen=True)
class Ask:
    """What a tool returns to ask the turn's caller (a person, or the agent that called this
    one) before the model goes on::

        @tool
        def request_payout_approval(amount: float) -> Ask | dict:
            "Ask a human to approve payouts above 50,000."
            if amount > 50_000:
                return Ask(f"Pay out {amount:,.0f}?", schema=Approval)
            return {"approved": True}

    The other calls of the same model response finish; then the turn waits (in a node: the
    A2A task ends its run ``TASK_STATE_INPUT_REQUIRED``, or ``TASK_STATE_AUTH_REQUIRED`` with
    ``kind="auth"``) and the answer, checked against ``schema``'s JSON Schema, becomes this
    call's response: the model reads ``{"result": {"decision": "approve", ...}}``. Without a
    schema the answer is text. The tool itself does not run again.
    """

    question: str
    schema: type[BaseModel] | None = None
    kind: AskKind = "input"

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ConfigError("Ask(question): the question must be a non-empty string")
        if self.schema is not None and not (
            isinstance(self.schema, type) and issubclass(self.schema, BaseModel)
        ):
            raise ConfigError(
                f"Ask(schema=...) takes a pydantic BaseModel subclass, got {self.schema!r}"
            )
        if self.kind not in ASK_KINDS:
            raise ConfigError(f"Ask: kind must be one of {', '.join(ASK_KINDS)}, not {self.kind!r}")

    def to_question(self, question_id: str) -> Question:
        """The question as the task shows it (schema with its declared property order)."""
        schema = with_property_order(self.schema.model_json_schema()) if self.schema else None
        return Question(id=question_id, text=self.question, kind=self.kind, schema=schema)


class StateView(Mapping[str, Any]):
    """A read-only view of session state with a pending delta laid over it (delta wins)."""

    def __init__(self, base: Mapping[str, Any], delta: Mapping[str, Any]) -> None:
        self._base = base
        self._delta = delta

    def __getitem__(self, key: str) -> Any:
        if key in self._delta:
            return self._delta[key]
        return self._base[key]

    def get(self, key: str, default: Any = None) -> Any:
        # Mapping.get is __getitem__ in a try: a key in neither (a delegation's first call
        # to a peer looks up its context id) raised a KeyError and caught it.
        delta = self._delta
        if key in delta:
            return delta[key]
        base = self._base
        if type(base) is dict:
            return base.get(key, default)
        try:
            return base[key]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[str]:
        yield from self._delta
        yield from (k for k in self._base if k not in self._delta)

    def __len__(self) -> int:
        return len(self._base.keys() | self._delta.keys())

    def __repr__(self) -> str:
        return f"StateView({dict(self)!r})"


@dataclass
class ToolContext:
    """What a tool may know and change about the turn it runs in.

    ``state`` reads the session state (plus this tool's own pending writes); writes go to
    ``state_delta``, which the runner persists atomically with the tool-response event.
    ``metadata`` carries per-run facts: ``traceparent``, ``deadline`` (epoch seconds), the
    caller's A2A context, ``usage_sink``...
    """

    agent_name: str = ""
    user_id: str = ""
    session_id: str = ""
    invocation_id: str = ""
    session_state: Mapping[str, Any] = field(default_factory=dict, repr=False)
    state_delta: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: What the turn's tools attached so far (``attach``), shared by the turn's calls.
    attachments: list[Artifact] = field(default_factory=list, repr=False)

    @property
    def state(self) -> Mapping[str, Any]:
        return StateView(self.session_state, self.state_delta)

    def attach(self, *parts: PartValue, name: str = "", description: str = "") -> Artifact:
        """Attach ``parts`` to the turn's answer as one more named artifact (a file the tool
        made, data the answer carries)::

            ctx.attach(File(png, media_type="image/png", name="chart.png"))
            ctx.attach({"rate": 1.08}, name="rate")

        In a node the task publishes it with its answer; ``Runner.run`` returns it in
        ``RunResult.artifacts``. The model does not see it: return what it should read."""
        return attach_to(self.attachments, parts, name, description)


_current: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "mesh_tool_context", default=None
)


def current_context() -> ToolContext | None:
    """The context of the turn being run, or None outside a turn.

    The runner sets it around each model call and each tool call, so a model (the scripted one
    reads ``state``) or a helper deep inside a tool can reach the turn's facts without plumbing.
    """
    return _current.get()


def set_current_context(ctx: ToolContext | None) -> contextvars.Token[ToolContext | None]:
    """Runner hook: make ``ctx`` the current context (reset with ``reset_current_context``)."""
    return _current.set(ctx)


def reset_current_context(token: contextvars.Token[ToolContext | None]) -> None:
    _current.reset(token)


@runtime_checkable
class Tool(Protocol):
    """A callable the model can ask for. ``parameters`` is a JSON Schema of an object."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """Run with the model's arguments; raise ``ToolError`` for a clean failure."""
        ...


@runtime_checkable
class Toolset(Protocol):
    """Several tools decided at run time (e.g. one per skill of a remote agent).

    Called once per turn; caching (say, of a fetched agent card) is the toolset's business.
    """

    async def tools(self, ctx: ToolContext) -> Sequence[Tool]: ...


def jsonable(value: Any) -> Any:
    """``value`` as JSON-able data: pydantic models and dataclasses dumped, odd types as str."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return pydantic_core.to_jsonable_python(value, fallback=str)


def _is_context(annotation: Any) -> bool:
    return annotation is ToolContext or (
        typing.get_origin(annotation) is typing.Annotated
        and typing.get_args(annotation)[0] is ToolContext
    )


# Keys whose value is a map of name -> schema (a property called "title" must survive).
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Inline ``$ref``s and drop pydantic's generated titles: a self-contained, compact schema.

    Providers differ in how much JSON Schema they accept; refs and titles are the usual trouble.
    Recursive models keep their ``$defs`` (they cannot be inlined).
    """
    defs: dict[str, Any] = schema.get("$defs", {})
    recursive = False

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        nonlocal recursive
        if isinstance(node, list):
            return [walk(x, seen) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen or name not in defs:
                recursive = True
                return node
            target = walk(defs[name], (*seen, name))
            extra = {k: walk(v, seen) for k, v in node.items() if k != "$ref"}
            return {**target, **extra}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" or key == "$defs":
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: walk(v, seen) for k, v in value.items()}
            else:
                out[key] = walk(value, seen)
        return out

    cleaned: dict[str, Any] = walk(schema, ())
    if recursive and defs:
        cleaned["$defs"] = defs
    return cleaned


def _parameter_hints(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    """Resolved parameter annotations. The return annotation is not needed, and with
    ``from __future__ import annotations`` it may name a class local to a function."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:
        pass
    target = inspect.unwrap(fn)
    annotations = {k: v for k, v in getattr(target, "__annotations__", {}).items() if k != "return"}
    shim = type("_Params", (), {"__annotations__": annotations})
    try:
        return typing.get_type_hints(
            shim,
            globalns=getattr(target, "__globals__", {}),
            localns=inspect.getclosurevars(target).nonlocals,
            include_extras=True,
        )
    except Exception as exc:
        raise ConfigError(f"tool {name!r}: cannot resolve its parameter types: {exc}") from exc


def _describe_error(exc: ValidationError) -> tuple[str, list[dict[str, Any]]]:
    errors = [
        {"field": ".".join(str(p) for p in e["loc"]) or "(arguments)", "message": e["msg"]}
        for e in exc.errors(include_url=False)
    ]
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return f"invalid arguments: {summary}", errors


class FunctionTool:
    """A Python function (sync or async) as a tool.

    Sync functions run in a worker thread so they cannot stall the event loop. The instance is
    still callable like the function it wraps.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"tool {fn!r} is not callable")
        self.fn = fn
        self.name: str = name or getattr(fn, "__name__", "") or type(fn).__name__
        if not self.name.isidentifier():
            raise ConfigError(
                f"tool name {self.name!r} is invalid: use letters, digits and '_' "
                "(pass @tool(name=...) for a lambda or partial)"
            )
        self.description: str = description or inspect.getdoc(fn) or ""
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        self._context_param: str | None = None
        self._fields: dict[str, str] = {}  # model field -> parameter name
        self._args_model = self._build_model(fn)
        self.parameters: dict[str, Any] = _clean_schema(self._args_model.model_json_schema())
        self.parameters.setdefault("properties", {})
        functools.update_wrapper(self, fn)

    def _build_model(self, fn: Callable[..., Any]) -> type[BaseModel]:
        hints = _parameter_hints(fn, self.name)
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue  # *args/**kwargs cannot be described to a model
            annotation = hints.get(param.name, Any)
            if _is_context(annotation):
                self._context_param = param.name
                continue
            default = ... if param.default is param.empty else param.default
            # Internal names are prefixed and the real name is the alias: a parameter may be
            # called `schema`, `json` or `model_name` without clashing with BaseModel.
            self._fields[f"p_{param.name}"] = param.name
            fields[f"p_{param.name}"] = (annotation, Field(default, alias=param.name))
        try:
            return pydantic.create_model(
                f"{self.name}_args",
                __config__=ConfigDict(arbitrary_types_allowed=False),
                **fields,
            )
        except Exception as exc:
            raise ConfigError(
                f"tool {self.name!r}: its parameters cannot be described as JSON Schema "
                f"(use JSON-like types or pydantic models): {exc}"
            ) from exc

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The model's arguments checked and converted; ``ToolError`` naming each bad field."""
        try:
            parsed = self._args_model.model_validate(dict(args))
        except ValidationError as exc:
            message, errors = _describe_error(exc)
            raise ToolError(message, kind="invalid_arguments", details=errors) from exc
        # Attribute access keeps nested pydantic models as models (model_dump would flatten).
        return {param: getattr(parsed, field) for field, param in self._fields.items()}

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        kwargs = self.validate(args)
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
        if self._is_async:
            return await self.fn(**kwargs)
        # copy_context: the worker thread sees the current ToolContext too.
        context = contextvars.copy_context()
        return await asyncio.to_thread(context.run, functools.partial(self.fn, **kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Make a ``FunctionTool`` of a function: bare ``@tool`` or ``@tool(name=..., description=...)``."""
    if fn is not None:
        return FunctionTool(fn, name=name, description=description)

    def decorate(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description)

    return decorate


def as_tool(obj: Any) -> Tool:
    """A ``Tool`` as is, a plain function as a ``FunctionTool``; anything else is a ``ConfigError``."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, Toolset):
        raise ConfigError(f"{obj!r} is a Toolset: expand it with `await toolset.tools(ctx)`")
    if callable(obj):
        return FunctionTool(obj)
    raise ConfigError(f"{obj!r} is not a tool: give a function, a Tool or a Toolset")


async def invoke_tool(t: Tool, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any] | Ask:
    """Call ``t`` and shape its outcome for the model: ``{"result": ...}`` or ``{"error": ...}``;
    an ``Ask`` the tool returned comes back as is (the call waits for its answer).

    A failing tool never ends the turn: the model reads the error and decides what to do.
    Cancellation (and other BaseExceptions) still propagate.
    """
    token = set_current_context(ctx)
    try:
        value = await t.call(args, ctx)
    except ToolError as exc:
        return exc.to_result()
    except Exception as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc) or repr(exc)}}
    finally:
        reset_current_context(token)
    if isinstance(value, Ask):
        return value
    try:
        return {"result": jsonable(value)}
    except Exception as exc:  # a result pydantic cannot dump at all
        return {"error": {"type": "invalid_result", "message": f"cannot serialise result: {exc}"}}
