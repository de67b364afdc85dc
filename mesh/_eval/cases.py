"""The case file of ``mesh eval``: pydantic models and ``load_cases``.

A file (YAML or JSON) holds defaults and a list of cases; each case sends one or more user
turns to an agent (by name through the registry, or by URL) and states what must hold: the
final answer (``expect``), the trajectory across hops (``trajectory``), and bounds
(``bounds``). docs/eval.md has the whole format. A mistake in the file is a ``ConfigError``
naming the case and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mesh._errors import ConfigError

__all__ = [
    "Bounds",
    "Call",
    "Case",
    "CaseFile",
    "Expect",
    "Trajectory",
    "Turn",
    "load_cases",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expect(_Strict):
    """What the answer must be. Text matchers read the answer's text (a typed answer: its
    JSON); ``fields`` reads a typed answer's JSON by dotted path."""

    contains: list[str] = Field(default_factory=list)
    not_contains: list[str] = Field(default_factory=list)
    regex: str | None = None
    equals: str | None = None
    fields: dict[str, Any] = Field(default_factory=dict)
    #: The task's final state (``completed``, ``failed``, ``rejected``...).
    state: str | None = None
    #: Judged by a model (needs a Gemini key; skipped with a note otherwise).
    rubric: str | None = None
    #: Compare text case-insensitively.
    ignore_case: bool = False

    @model_validator(mode="after")
    def _regex_compiles(self) -> Expect:
        import re

        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r} does not compile: {exc}") from exc
        return self


class Call(_Strict):
    """One call of the trajectory: a ``tool`` a turn called (at ``agent``, the caller), or a
    remote ``skill`` served (at ``agent``, the callee). ``args``: a subset the arguments (a
    skill's request data) must contain."""

    agent: str | None = None
    tool: str | None = None
    skill: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_name(self) -> Call:
        if (self.tool is None) == (self.skill is None):
            raise ValueError("name exactly one of 'tool' or 'skill'")
        return self

    def describe(self) -> str:
        kind, name = ("tool", self.tool) if self.tool is not None else ("skill", self.skill)
        at = f" at {self.agent}" if self.agent else ""
        args = f" with {json.dumps(self.args, sort_keys=True)}" if self.args else ""
        return f"{kind} {name}{at}{args}"


class Trajectory(_Strict):
    """The calls the mesh must make (``calls``, in ``order``) and must not make."""

    calls: list[Call] = Field(default_factory=list)
    order: Literal["any", "in_order"] = "any"
    must_not_call: list[Call] = Field(default_factory=list)


class Bounds(_Strict):
    """Limits over the whole case: wall time, tokens over every hop, delegations."""

    latency_s: float | None = Field(default=None, gt=0)
    total_tokens: int | None = Field(default=None, ge=0)
    max_delegations: int | None = Field(default=None, ge=0)
    min_delegations: int | None = Field(default=None, ge=0)


class Turn(_Strict):
    """One user message: text, or JSON ``data`` for a typed ``skill``."""

    text: str | None = None
    data: dict[str, Any] | None = None
    skill: str | None = None
    #: Checked against this turn's answer (the case's ``expect`` checks the last one).
    expect: Expect | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        return {"text": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_body(self) -> Turn:
        if (self.text is None) == (self.data is None):
            raise ValueError("give a turn as text, or as 'data' (a typed skill's request)")
        return self


class Case(_Strict):
    """One case: turns to an agent, and what must hold."""

    name: str = Field(min_length=1)
    agent: str | None = None
    url: str | None = None
    turns: list[Turn] = Field(min_length=1)
    #: Given in order when the mesh asks for input (a mapping: a JSON answer, one data part).
    answers: list[str | dict[str, Any]] = Field(default_factory=list)
    #: Agents stopped for this case (a local ``mesh up``), started again after it.
    without: list[str] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)
    trajectory: Trajectory = Field(default_factory=Trajectory)
    bounds: Bounds = Field(default_factory=Bounds)
    #: Seconds each turn may take.
    timeout_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _one_target(self) -> Case:
        if self.agent is None and self.url is None:
            raise ValueError("name the 'agent' (or a 'url'), here or in the file's defaults")
        return self

    @property
    def target(self) -> str:
        return self.url or self.agent or ""

    @property
    def rubrics(self) -> list[str]:
        """Every rubric to judge: the turns' and the case's."""
        expects = [t.expect for t in self.turns if t.expect is not None] + [self.expect]
        return [e.rubric for e in expects if e.rubric is not None]


class CaseFile(_Strict):
    """A file of cases: ``agent`` / ``url`` / ``timeout_s`` default for each case."""

    agent: str | None = None
    url: str | None = None
    timeout_s: float | None = None
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("cases"), list):
            return value
        defaults = {k: value[k] for k in ("agent", "url", "timeout_s") if value.get(k) is not None}
        cases = [
            {**defaults, **case} if isinstance(case, dict) and "url" not in case else case
            for case in value["cases"]
        ]
        return {**value, "cases": cases}

    @model_validator(mode="after")
    def _unique_names(self) -> CaseFile:
        seen: set[str] = set()
        for case in self.cases:
            if case.name in seen:
                raise ValueError(f"two cases are named {case.name!r}: names must be unique")
            seen.add(case.name)
        return self


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    """``case 'x', field turns.0.text`` for an error at ``loc`` of the file."""
    if len(loc) >= 2 and loc[0] == "cases" and isinstance(loc[1], int):
        cases = data.get("cases") if isinstance(data, dict) else None
        case = cases[loc[1]] if isinstance(cases, list) and loc[1] < len(cases) else None
        name = case.get("name") if isinstance(case, dict) else None
        label = f"case {name!r}" if name else f"case #{loc[1] + 1}"
        field = ".".join(str(p) for p in loc[2:])
        return f"{label}, field {field}" if field else label
    return "field " + ".".join(str(p) for p in loc) if loc else "the file"


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not JSON: {exc}") from exc
    try:
        import yaml
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"{path}: YAML cases need pyyaml: pip install 'mesh[eval]' (or write them as JSON)"
        ) from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from exc


def load_cases(path: str | Path) -> CaseFile:
    """The cases of ``path`` (``.json``: JSON; anything else: YAML). ``ConfigError`` naming the
    case and field of the first mistakes."""
    path = Path(path)
    try:
        data = _read(path)
    except OSError as exc:
        raise ConfigError(f"cannot read cases {path}: {exc.strerror or exc}") from exc
    try:
        return CaseFile.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{_where(data, tuple(e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()[:5]
        ]
        raise ConfigError(f"{path}: " + "; ".join(problems)) from exc
