"""``ScriptedModel``: a deterministic offline model that follows a small declarative ``Script``.

It is what an agent runs on when no Gemini key is configured (the demo loan desk works offline),
and what tests use instead of a live model. A script is a list of ``Rule``s; the first rule whose
``when`` regex matches the user's latest message decides the turn:

    Script(rules=[Rule(
        when=r"(?i)approve (?P<applicant_id>APP-\\d+) for (?P<amount>[\\d,]+)",
        steps=[  # each step = the tool calls of ONE model response (they run concurrently)
            [Call("lookup_applicant", {"applicant_id": "{applicant_id}"})],
            [Call("score", {"applicant_id": "{applicant_id}", "amount": "{amount|number}"}),
             Call("verify_income", {"applicant_id": "{applicant_id}"})]],
        answer="Score {score.score} ({score.tier}); income verified: {verify_income.verified}",
        on_error="I could not complete the assessment: {error}",
    )], fallback="I can answer questions like 'approve APP-612 for 400,000'.")

The model keeps no state of its own: the step to play is the number of tool-result rounds since
the latest user message in the request, so any number of sessions can share one instance. What
a conversation should remember (the applicant under discussion, the amount) lives in the
session's state: a rule's ``remember`` names are written there and recalled by later turns
whose message leaves them out ("what if the amount were 200,000 instead?").

Rules see at most ``Script.max_match_chars`` characters of the message, so matching costs
microseconds whatever a user sends. It runs on the event loop on purpose: ``re`` holds the GIL
while it matches, so a worker thread would stall the loop just the same; the bound, and patterns
without nested unbounded repeats, are what keep a turn cheap. The template language and the rule
fields are documented in docs/runtime.md.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mesh._errors import ConfigError
from mesh._models.base import Model, ModelRequest, ModelResponse, ToolDeclaration
from mesh._tools import current_context
from mesh._types import Content, FunctionCall, Part, Usage

__all__ = [
    "DEFAULT_ON_ERROR",
    "DEFAULT_SCRIPT",
    "Call",
    "Rule",
    "Script",
    "ScriptedModel",
    "example_from_schema",
]

DEFAULT_ON_ERROR = "I could not complete that: {error}"
#: Instructions and tool declarations whose word counts a model keeps (``_counted``).
_MAX_COUNTED = 256


@dataclass(frozen=True)
class Call:
    """One tool call of a step. String values in ``args`` are templates."""

    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    """When ``when`` matches (``re.search``) the user's message: play ``steps``, then answer.

    ``answer`` is a text template; ``answer_data`` a JSON template used when the request asks for
    structured output. ``on_error`` answers as soon as a tool returned an error (None: carry on);
    a mapping picks the template by the error's type (``{"not_found": ..., "*": ...}``).

    Named values, besides ``when``'s named groups: ``find`` maps a name to a regex searched on its
    own (its first group, or the whole match, is the value), so values can come in any order
    without one pattern spanning the message. ``remember`` names are written to session state
    when the rule plays, and a later message that leaves one out gets the remembered value.
    ``requires`` names must have a value (from the message or remembered), else the next rule is
    tried.
    """

    when: str
    steps: Sequence[Sequence[Call] | Call] = ()
    answer: str = ""
    answer_data: Mapping[str, Any] | None = None
    on_error: str | Mapping[str, str] | None = DEFAULT_ON_ERROR
    find: Mapping[str, str] = field(default_factory=dict)
    remember: Sequence[str] = ()
    requires: Sequence[str] = ()
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)
    #: ``find`` compiled.
    finders: tuple[tuple[str, re.Pattern[str]], ...] = field(init=False, repr=False, compare=False)
    #: ``steps`` normalised: one tuple of calls per model response.
    calls: tuple[tuple[Call, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", _compile(self.when, f"when={self.when!r}"))
        object.__setattr__(
            self,
            "finders",
            tuple(
                (name, _compile(regex, f"find[{name!r}]={regex!r}"))
                for name, regex in self.find.items()
            ),
        )
        for what, names in (("remember", self.remember), ("requires", self.requires)):
            if isinstance(names, str):
                raise ConfigError(
                    f"script rule when={self.when!r}: {what} is a list of names, "
                    f"e.g. {what}=[{names!r}]"
                )
            for name in names:
                if not _NAME.match(name):
                    raise ConfigError(
                        f"script rule when={self.when!r}: {what} name {name!r} is not a "
                        "valid name (letters, digits, '_', starting with a letter)"
                    )
        steps: list[tuple[Call, ...]] = []
        for step in self.steps:
            calls = (step,) if isinstance(step, Call) else tuple(step)
            for call in calls:
                if not isinstance(call, Call):
                    raise ConfigError(
                        f"script rule when={self.when!r}: a step holds Call(...) objects, "
                        f"got {call!r}"
                    )
            steps.append(calls)
        object.__setattr__(self, "calls", tuple(steps))


@dataclass(frozen=True)
class Script:
    """The rules, tried in order, and the ``fallback`` answer when none matches.

    Rules match the first ``max_match_chars`` characters of the user's latest message (templates
    still see all of it as ``{input}``).
    """

    rules: Sequence[Rule] = ()
    fallback: str = "{input}"
    max_match_chars: int = 2000

    def __post_init__(self) -> None:
        if self.max_match_chars < 1:
            raise ConfigError(f"Script(max_match_chars={self.max_match_chars}) must be >= 1")


#: What an agent without a script does offline: echo the message back.
DEFAULT_SCRIPT = Script(rules=(), fallback="{input}")

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _compile(regex: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ConfigError(f"script rule {what} is not a valid regex: {exc}") from exc


@dataclass(frozen=True)
class _Match:
    """A rule that applies to a message, with its named values."""

    rule: Rule
    values: dict[str, Any]
    #: What the rule writes to session state (the remembered names whose value changed).
    remembered: dict[str, Any]


# -- templates --------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][\w.-]*)(?:\|(\w+))?\}")
_WHOLE = re.compile(r"^\{([A-Za-z_][\w.-]*)(?:\|(\w+))?\}$")
_MISSING = object()
_NOT_NUMBER = re.compile(r"[^\d.eE+-]")


@dataclass
class _Scope:
    """What templates can name."""

    input: str = ""
    groups: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    results: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    def lookup(self, path: str) -> Any:
        root, *rest = path.split(".")
        value: Any
        if root in self.groups:
            value = self.groups[root]
        elif root == "input":
            value = self.input
            if rest:
                try:  # a typed request arrives as JSON text: {input.field} reads into it
                    value = json.loads(self.input)
                except ValueError:
                    return _MISSING
        elif root == "state":
            # The turn's state is a read-only view: the whole of it is handed out as a dict.
            value = self.state if rest else dict(self.state)
        elif root == "error":
            value = self.error if self.error is not None else _MISSING
        elif root in self.results:
            value = self.results[root]
        else:
            return _MISSING
        for key in rest:
            if isinstance(value, Mapping) and key in value:
                value = value[key]
            elif isinstance(value, list | tuple) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            else:
                return _MISSING
        return value


def _on_error(on_error: str | Mapping[str, str], error_type: str) -> str:
    if isinstance(on_error, str):
        return on_error
    return on_error.get(error_type) or on_error.get("*") or DEFAULT_ON_ERROR


def _number(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    cleaned = _NOT_NUMBER.sub("", value)  # "400,000" / "$1 200.50" -> digits
    try:
        number = float(cleaned)
    except ValueError:
        return value
    return int(number) if number.is_integer() and "." not in cleaned else number


_FILTERS: dict[str, Any] = {
    "number": _number,
    "int": lambda v: int(_number(v)) if isinstance(_number(v), int | float) else v,
    "lower": lambda v: str(v).lower(),
    "upper": lambda v: str(v).upper(),
    "json": lambda v: json.dumps(v),
}


def _apply(value: Any, filter_name: str | None) -> Any:
    if filter_name is None or value is _MISSING:
        return value
    fn = _FILTERS.get(filter_name)
    if fn is None:
        raise ConfigError(f"unknown template filter |{filter_name}; use one of {sorted(_FILTERS)}")
    return fn(value)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if type(value) is int:  # json.dumps's text of an int, without the encoder
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def _render_text(template: str, scope: _Scope) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        value = _apply(scope.lookup(match.group(1)), match.group(2))
        # An unknown name stays as written: visible in the answer, and literal braces survive.
        return token if value is _MISSING else _as_text(value)

    return _PLACEHOLDER.sub(replace, template)


def _render(template: Any, scope: _Scope) -> Any:
    """Render a template value: strings interpolated, a string that is one whole placeholder
    replaced by the value itself (keeping its type), dicts and lists recursively."""
    if isinstance(template, str):
        whole = _WHOLE.match(template)
        if whole:
            value = _apply(scope.lookup(whole.group(1)), whole.group(2))
            return template if value is _MISSING else value
        return _render_text(template, scope)
    if isinstance(template, Mapping):
        return {k: _render(v, scope) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [_render(v, scope) for v in template]
    return template


# -- structured output without answer_data -----------------------------------------------------


def example_from_schema(schema: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> Any:
    """A minimal value valid against ``schema`` (required fields only, smallest values)."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        return example_from_schema(defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {}), defs)
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return example_from_schema(options[0], defs)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties", {})
        return {
            name: example_from_schema(props[name], defs)
            for name in schema.get("required", [])
            if name in props
        }
    if kind == "array":
        item = example_from_schema(schema.get("items", {}), defs)
        return [item] * int(schema.get("minItems", 0))
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "x" * int(schema.get("minLength", 0))


# -- the model --------------------------------------------------------------------------------


def _words(text: str) -> int:
    return len(text.split())


def _content_words(content: Content) -> int:
    n = 0
    for part in content.parts:
        if part.text:
            n += _words(part.text)
        if part.function_call:
            n += 1 + _words(json.dumps(part.function_call.args))
        if part.function_response:
            n += 1 + _words(json.dumps(part.function_response.response))
    return n


class ScriptedModel(Model):
    """A ``Model`` that plays a ``Script``. Deterministic; reports word counts as token usage."""

    def __init__(self, script: Script | None = None, *, name: str = "scripted") -> None:
        self.script = script or DEFAULT_SCRIPT
        self.name = name
        # Word counts of instructions and tool declarations (``_counted``), bounded.
        self._words: dict[str | int, tuple[str | ToolDeclaration, int]] = {}
        # Word counts of contents (``_content_counted``), bounded; weak: a session's contents
        # are not kept alive by the model.
        self._content_words: dict[int, tuple[weakref.ref[Content], int]] = {}

    async def generate(self, request: ModelRequest) -> ModelResponse:
        return self._whole(request)

    def _whole(self, request: ModelRequest) -> ModelResponse:
        """The complete response (``generate``'s, and the end of ``stream``'s)."""
        content, remembered = self._respond(request)
        return ModelResponse(
            content=content,
            usage=self._usage(request, content),
            finish_reason="STOP",
            model_version=self.name,
            state_delta=remembered,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelResponse]:
        """Text arrives in a few chunks; like real providers, chunks carry running usage totals
        (which consumers must ignore), and the final response holds the whole content."""
        final = self._whole(request)
        text = final.content.text
        if text and not final.content.function_calls:
            pieces = re.findall(r"\S+\s*", text)
            size = max(1, -(-len(pieces) // 3))
            sent = ""
            for i in range(0, len(pieces), size):
                chunk = "".join(pieces[i : i + size])
                sent += chunk
                yield ModelResponse(
                    content=Content.model(chunk),
                    usage=Usage(
                        input_tokens=final.usage.input_tokens if final.usage else 0,
                        output_tokens=_words(sent),
                    ),
                    partial=True,
                )
        yield final

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "rules": len(self.script.rules)}

    # -- the decision ---------------------------------------------------------------------

    def _respond(self, request: ModelRequest) -> tuple[Content, dict[str, Any]]:
        """The response to ``request``, and what it writes to session state."""
        contents = request.contents
        start = next(
            (
                i
                for i in range(len(contents) - 1, -1, -1)
                if contents[i].role == "user" and any(p.text for p in contents[i].parts)
            ),
            -1,
        )
        message = contents[start].text if start >= 0 else ""
        after = contents[start + 1 :]
        round_index = sum(1 for c in after if c.function_responses)
        results: dict[str, Any] = {}
        error: str | None = None
        error_type = ""
        for c in after:
            for r in c.function_responses:
                if "error" in r.response:
                    err = r.response["error"]
                    text = err.get("message", err) if isinstance(err, Mapping) else err
                    if error is None:
                        error = f"{r.name}: {text}"
                        kind = err.get("type") if isinstance(err, Mapping) else None
                        error_type = str(kind or "")
                    results[r.name] = r.response
                else:
                    results[r.name] = r.response.get("result")
        ctx = current_context()
        # Read, never kept: nothing changes it while the response is made (no await here).
        state: Mapping[str, Any] = ctx.state if ctx is not None else {}
        scope = _Scope(input=message, state=state, results=results, error=error)
        found = self._match(message, state)
        if found is None:
            return self._answer(request, self.script.fallback, None, scope), {}
        rule = found.rule
        scope.groups = found.values
        if error is not None and rule.on_error is not None:
            template = _on_error(rule.on_error, error_type)
            return self._answer(request, template, None, scope), found.remembered
        steps = rule.calls
        if round_index < len(steps):
            calls_before = sum(1 for c in contents if c.function_calls)
            content = Content(
                role="model",
                parts=tuple(
                    Part(
                        function_call=FunctionCall(
                            id=f"call_{calls_before}_{i}",
                            name=call.tool,
                            args=dict(_render(dict(call.args), scope)),
                        )
                    )
                    for i, call in enumerate(steps[round_index])
                ),
            )
            return content, found.remembered
        return self._answer(request, rule.answer, rule.answer_data, scope), found.remembered

    def _match(self, message: str, state: Mapping[str, Any]) -> _Match | None:
        """The first rule that applies to ``message`` (read up to ``max_match_chars``)."""
        text = message[: self.script.max_match_chars]
        for rule in self.script.rules:
            match = rule.pattern.search(text)
            if match is None:
                continue
            values: dict[str, Any] = dict(match.groupdict())
            for name, finder in rule.finders:
                if values.get(name) is not None:
                    continue
                hit = finder.search(text)
                values[name] = (hit.group(1) if finder.groups else hit.group(0)) if hit else None
            remembered: dict[str, Any] = {}
            for name in rule.remember:
                if values.get(name) is None:
                    values[name] = state.get(name)
                elif state.get(name) != values[name]:
                    remembered[name] = values[name]
            if all(values.get(name) not in (None, "") for name in rule.requires):
                return _Match(rule, values, remembered)
        return None

    @staticmethod
    def _answer(
        request: ModelRequest, text: str, data: Mapping[str, Any] | None, scope: _Scope
    ) -> Content:
        if request.response_schema is not None:
            value = (
                _render(dict(data), scope)
                if data is not None
                else example_from_schema(request.response_schema)
            )
            return Content.model(json.dumps(value))
        return Content.model(_render_text(text, scope))

    def _usage(self, request: ModelRequest, content: Content) -> Usage:
        prompt = self._counted(request.system_instruction or "")
        prompt += sum(self._content_counted(c) for c in request.contents)
        prompt += sum(self._counted(t) for t in request.tools)
        output = self._content_counted(content)
        return Usage(input_tokens=prompt, output_tokens=output, total_tokens=prompt + output)

    def _content_counted(self, content: Content) -> int:
        """The words of a content, counted once while it lives: the history is in every
        request of a turn, and counting a call or a tool's response means encoding it as
        JSON (a real model's client does not: its usage comes with the response)."""
        known = self._content_words.get(id(content))
        if known is not None and known[0]() is content:
            return known[1]
        words = _content_words(content)
        if len(self._content_words) >= _MAX_COUNTED:
            self._content_words.clear()
        self._content_words[id(content)] = (weakref.ref(content), words)
        return words

    def _counted(self, item: str | ToolDeclaration) -> int:
        """The words of an instruction or a tool declaration, counted once: they are in every
        request of every turn, and counting a tool's schema means encoding it as JSON (a real
        model's client does neither: its usage comes with the response)."""
        key = item if isinstance(item, str) else id(item)
        known = self._words.get(key)
        # A declaration is known by its id while the cache holds it (no other object gets it).
        if known is not None and (isinstance(item, str) or known[0] is item):
            return known[1]
        if isinstance(item, str):
            words = _words(item)
        else:
            words = _words(f"{item.name} {item.description} {json.dumps(item.parameters)}")
        if len(self._words) >= _MAX_COUNTED:
            self._words.clear()
        self._words[key] = (item, words)
        return words
