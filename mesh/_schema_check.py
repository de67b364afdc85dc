"""Check a JSON value against a skill's JSON Schema (Draft 2020-12, by ``jsonschema``).

A caller only has a peer's skill schemas (from its card), not its pydantic models, so remote
arguments and results are checked against the schema itself:

    value = check({"applicant_id": "APP-501", "amount": 250000.0}, schema)   # coerced copy
    # SchemaViolation("amount: must be >= 1000", errors=[{"field": "amount", ...}])

What this module adds to ``jsonschema``:

- One coercion: an integral float is accepted (and returned) as an integer where the schema
  wants an integer, because A2A data parts carry every number as a double.
- Messages that name the field (``address.zip: must match '^\\d{6}$'``), one per problem.
- The callee's leniency where its pydantic model is more lenient than the schema it publishes:
  a ``pattern`` Python cannot compile and ``uniqueItems`` (a ``set`` field) constrain nothing,
  ``multipleOf`` allows float rounding. ``format`` is not checked, as the spec allows.
- Safety for schemas from a peer's card: ``$ref`` resolves inside the schema only (never over
  the network), an invalid schema or a value nesting too deeply is a ``SchemaViolation``.

Compiled validators are cached by schema content (a card's schema is checked once, ~0.6 ms).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from jsonschema import Draft202012Validator, FormatChecker, TypeChecker, ValidationError, validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from mesh._errors import SchemaViolation

__all__ = ["SchemaViolation", "check"]

_CACHE_SIZE = 256
# Messages quote a schema's pieces; a hostile card must not make them unbounded.
_MAX_QUOTE = 200
# What the fast check returns for a value it cannot vouch for (see "the fast check").
_SLOW: Any = object()
_Fast = Callable[[Any], Any]


def check(value: Any, schema: Mapping[str, Any], *, fixed: bool = False) -> Any:
    """``value`` (integral floats made ints where the schema wants integers) or
    ``SchemaViolation`` listing every problem found.

    The value is never changed in place: a coerced value is a copy. ``fixed``: ``schema`` is
    never changed in place (a remote tool's, made once from a card), so its compiled check is
    found by the object itself rather than by its content.
    """
    validator, has_integers, fast = _held(schema) if fixed else _compiled(schema)
    if fast is not None:
        # Most values a caller sends are valid: a check compiled to plain Python vouches for
        # them at a tenth of jsonschema's cost; anything it cannot vouch for takes the full way.
        try:
            checked = fast(value)
        except Exception:  # RecursionError, a huge int's overflow: the full way decides
            checked = _SLOW
        if checked is not _SLOW:
            return checked
    try:
        # JSON Schema says 3.0 is an integer: the verdict is the one on a copy with ints for
        # integral floats (also right under ``not``, ``if`` and ``oneOf``).
        as_ints = _ints(value)
        errors = list(validator.iter_errors(as_ints))
        if not errors and as_ints is not value and has_integers:
            # Valid: return ints only where the schema wants an integer, i.e. where an integral
            # float fails "integer" under the type check that takes only ints.
            paths = {tuple(p) for p in _integral_floats(validator.iter_errors(value))}
            for path in sorted(paths, key=len):
                value = _with_int_at(value, path)
    except Unresolvable as exc:
        raise _schema_problem(f"schema reference {_quote(exc)} cannot be resolved") from exc
    except RecursionError as exc:
        raise SchemaViolation(
            [{"field": "(value)", "message": "nests too deeply to check"}]
        ) from exc
    if errors:
        found: list[dict[str, str]] = []
        for error in errors:
            _describe_error(error, found)
        raise SchemaViolation(found)
    return value


# -- the validator --------------------------------------------------------------------------


def _is_integer(_: TypeChecker, instance: object) -> bool:
    # Only ints: an integral float's type error says where to coerce it (see ``check``).
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_array(_: TypeChecker, instance: object) -> bool:
    return isinstance(instance, list | tuple)


def _is_object(_: TypeChecker, instance: object) -> bool:
    return isinstance(instance, Mapping)


def _required(
    validator: Validator, required: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    # One error per missing field, at the field's own path (jsonschema reports the parent).
    if validator.is_type(instance, "object"):
        for name in required:
            if name not in instance:
                yield ValidationError("is required", path=[name])


def _additional_properties(
    validator: Validator, extra: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if extra is not False:
        yield from _BASE_KEYWORDS["additionalProperties"](validator, extra, instance, schema)
        return
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for key in instance:
        if key not in known and not any(_search(p, str(key)) for p in patterns):
            yield ValidationError("is not an allowed field", path=[key])


def _pattern(
    validator: Validator, pattern: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and _search(pattern, instance) is False:
        yield ValidationError("pattern")


def _multiple_of(
    validator: Validator, step: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    # pydantic's own tolerance: 0.3 is a multiple of 0.1 although 0.3 / 0.1 != 3 in floats.
    if validator.is_type(instance, "number") and step:
        ratio = instance / step
        if abs(ratio - round(ratio)) > 1e-9:
            yield ValidationError("multipleOf")


def _nothing(
    validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    return iter(())


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` matches; ``None`` for a pattern Python cannot compile (an ECMA
    ``\\p{L}`` that pydantic's Rust engine accepts): the callee checks it."""
    try:
        return re.search(pattern, text) is not None
    except (re.error, TypeError):
        return None


_BASE_KEYWORDS = Draft202012Validator.VALIDATORS
# types-jsonschema leaves extend() untyped; its result is a Validator class.
_MeshValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={
        "required": _required,
        "additionalProperties": _additional_properties,
        "pattern": _pattern,
        "multipleOf": _multiple_of,
        # pydantic turns a list with repeats into a set: the callee accepts it.
        "uniqueItems": _nothing,
    },
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "array": _is_array, "object": _is_object}
    ),
)
# $ref resolves inside the schema only: an empty registry never retrieves a URL (jsonschema's
# default one would fetch http(s) references, from wherever a peer's card points).
_NO_REMOTE_REFS: Registry[Any] = Registry()
_NO_FORMATS = FormatChecker(formats=())

_Entry = tuple[Validator, bool, _Fast | None]
_cache: OrderedDict[str, _Entry | SchemaViolation] = OrderedDict()
_cache_lock = threading.Lock()
# ``json.dumps`` with arguments builds an encoder per call; this one is made once.
_key_of = json.JSONEncoder(separators=(",", ":"), default=repr).encode


def _compiled(schema: Mapping[str, Any]) -> _Entry:
    """The validator for ``schema`` and whether the schema names the type "integer" (else no
    float is made an int), cached by content: callers rebuild their tools (and copy the
    schemas) every turn, and checking a schema costs ~0.6 ms against ~5 us for the key."""
    try:
        key = _key_of(schema)
    except (RecursionError, ValueError) as exc:  # ValueError: a dict that contains itself
        raise _schema_problem("the skill's schema nests too deeply to check") from exc
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
    if found is None:
        compiled = _compile(schema)
        found = (
            compiled
            if isinstance(compiled, SchemaViolation)
            else (compiled, '"integer"' in key, _fast_check(schema))
        )
        with _cache_lock:
            _cache[key] = found
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(found, SchemaViolation):
        raise found
    return found


# Compiled checks of ``fixed`` schemas, by the schema object: no key to encode per check (a
# remote call checks two). Each schema is held here, so no other object takes its id meanwhile.
_fixed: dict[int, tuple[Mapping[str, Any], _Entry]] = {}


def _held(schema: Mapping[str, Any]) -> _Entry:
    found = _fixed.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    entry = _compiled(schema)  # a schema that is no JSON Schema raises, and is not kept
    if len(_fixed) >= _CACHE_SIZE:
        _fixed.clear()
    _fixed[id(schema)] = (schema, entry)
    return entry


def _compile(schema: Mapping[str, Any]) -> Validator | SchemaViolation:
    try:
        # No formats checked: a pattern Python cannot compile is not an invalid schema here.
        Draft202012Validator.check_schema(dict(schema), format_checker=_NO_FORMATS)
        return _MeshValidator(schema, registry=_NO_REMOTE_REFS)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return _schema_problem(
            f"the skill's schema is not valid JSON Schema at {where}: {_clip(exc.message)}"
        )
    except RecursionError:
        return _schema_problem("the skill's schema nests too deeply to check")


def _schema_problem(message: str) -> SchemaViolation:
    return SchemaViolation([{"field": "(schema)", "message": message}])


# -- the fast check ---------------------------------------------------------------------------
# A schema made of the keywords below (what pydantic emits for flat and nested models, enums,
# Optional fields, lists) compiles to a chain of plain functions. Each returns the value (with
# integral floats made ints where only an integer fits, as ``check`` does) or ``_SLOW`` when it
# cannot vouch for it: a problem, or a case whose coercion rule only jsonschema's errors tell
# (an integral float inside ``anyOf``). It only ever accepts what jsonschema accepts; messages
# and every other schema stay jsonschema's.

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "format", "$comment", "deprecated"}
    | {"readOnly", "writeOnly", "$defs"}
)
_FAST_KEYWORDS = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "anyOf",
    "$ref",
}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict or isinstance(v, Mapping),  # no ABC call for a dict
    "array": lambda v: isinstance(v, list | tuple),
}


class _Unsupported(Exception):
    """The schema uses something the fast check does not do: jsonschema checks every value."""


def _fast_check(schema: Mapping[str, Any]) -> _Fast | None:
    """The fast check of a valid ``schema``, or ``None`` when it has keywords it does not do."""
    try:
        return _FastCompiler(schema).compile(schema)
    except (_Unsupported, RecursionError, re.error, TypeError, ValueError):
        return None


def _accept(value: Any) -> Any:
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(value: Any, allowed: Any) -> bool:
    # Only by type and value: jsonschema's equality (1 == 1.0, not True == 1) decides the rest.
    return type(value) in (str, int, bool, type(None)) and any(
        type(value) is type(option) and value == option for option in allowed
    )


class _FastCompiler:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.defs = root.get("$defs")
        self.resolving: set[str] = set()
        self.resolved: dict[str, _Fast] = {}

    def compile(self, schema: Any) -> _Fast:
        if schema is True:
            return _accept
        if not isinstance(schema, Mapping) or not set(schema) <= _FAST_KEYWORDS:
            raise _Unsupported
        # "type": "object" with an object step (a model's schema): that step refuses what is
        # not an object itself, one call fewer per check (and often no chain at all).
        own_type = schema.get("type") == "object"
        objects = self._object(schema, own_type)
        own_type = own_type and bool(objects)
        steps = [
            s
            for s in (self._ref(schema), None if own_type else self._type(schema))
            if s is not None
        ]
        steps += self._number(schema) + self._string(schema) + self._array(schema)
        steps += objects + self._values(schema) + self._any_of(schema)
        if not steps:
            return _accept
        if len(steps) == 1:
            return steps[0]

        def chain(value: Any) -> Any:
            for step in steps:
                value = step(value)
                if value is _SLOW:
                    return _SLOW
            return value

        return chain

    def _ref(self, schema: Mapping[str, Any]) -> _Fast | None:
        ref = schema.get("$ref")
        if ref is None:
            return None
        prefix = "#/$defs/"
        if (
            not isinstance(ref, str)
            or not ref.startswith(prefix)
            or not isinstance(self.defs, Mapping)
        ):
            raise _Unsupported
        name = ref[len(prefix) :]
        if name in self.resolved:
            return self.resolved[name]
        if name in self.resolving or "/" in name or "~" in name or name not in self.defs:
            raise _Unsupported  # recursive models, escaped names: jsonschema
        self.resolving.add(name)
        self.resolved[name] = found = self.compile(self.defs[name])
        self.resolving.discard(name)
        return found

    def _type(self, schema: Mapping[str, Any]) -> _Fast | None:
        if "type" not in schema:
            return None
        names = _types(schema["type"])
        tests = [_TYPES[name] for name in names]
        # An integral float where only an integer fits is that integer (``check``'s coercion).
        coerce = "integer" in names and "number" not in names
        if len(tests) == 1 and not coerce:
            # One type, nothing to coerce (most of a model's fields): one test, no loop.
            test = tests[0]
            return lambda value: value if test(value) else _SLOW

        def typed(value: Any) -> Any:
            for test in tests:
                if test(value):
                    return value
            if coerce and isinstance(value, float) and value.is_integer():
                return int(value)
            return _SLOW

        return typed

    def _number(self, schema: Mapping[str, Any]) -> list[_Fast]:
        bounds: list[Callable[[Any], bool]] = []
        if "minimum" in schema:
            low = schema["minimum"]
            bounds.append(lambda v: v >= low)
        if "maximum" in schema:
            high = schema["maximum"]
            bounds.append(lambda v: v <= high)
        if "exclusiveMinimum" in schema:
            above = schema["exclusiveMinimum"]
            bounds.append(lambda v: v > above)
        if "exclusiveMaximum" in schema:
            below = schema["exclusiveMaximum"]
            bounds.append(lambda v: v < below)
        if schema.get("multipleOf"):
            step = schema["multipleOf"]
            bounds.append(lambda v: abs(v / step - round(v / step)) <= 1e-9)
        if not bounds:
            return []

        def number(value: Any) -> Any:
            if _is_number(value) and not all(bound(value) for bound in bounds):
                return _SLOW
            return value

        return [number]

    def _string(self, schema: Mapping[str, Any]) -> list[_Fast]:
        shortest, longest = schema.get("minLength", 0), schema.get("maxLength")
        pattern: re.Pattern[str] | None = None
        if "pattern" in schema:
            try:
                pattern = re.compile(schema["pattern"])
            except (re.error, TypeError):
                pattern = None  # constrains nothing, as in ``_pattern``
        if not shortest and longest is None and pattern is None:
            return []

        def string(value: Any) -> Any:
            if isinstance(value, str):
                if len(value) < shortest or (longest is not None and len(value) > longest):
                    return _SLOW
                if pattern is not None and pattern.search(value) is None:
                    return _SLOW
            return value

        return [string]

    def _array(self, schema: Mapping[str, Any]) -> list[_Fast]:
        fewest, most = schema.get("minItems", 0), schema.get("maxItems")
        each = self.compile(schema["items"]) if "items" in schema else None
        if not fewest and most is None and each is None:
            return []

        def array(value: Any) -> Any:
            if not isinstance(value, list | tuple):
                return value
            if len(value) < fewest or (most is not None and len(value) > most):
                return _SLOW
            if each is None:
                return value
            items = [each(item) for item in value]
            if any(item is _SLOW for item in items):
                return _SLOW
            same = all(a is b for a, b in zip(items, value, strict=True))
            return value if same else items

        return [array]

    def _object(self, schema: Mapping[str, Any], typed: bool = False) -> list[_Fast]:
        """The object step; ``typed``: it also refuses a value that is not an object (the
        schema's ``"type": "object"``, then no type step of its own)."""
        properties = {k: self.compile(v) for k, v in schema.get("properties", {}).items()}
        required = list(schema.get("required", ()))
        extra = schema.get("additionalProperties", True)
        others = None if extra is True or extra is False else self.compile(extra)
        if not properties and not required and extra is True:
            return []

        def obj(value: Any) -> Any:
            if type(value) is not dict and not isinstance(value, Mapping):
                return _SLOW if typed else value
            for name in required:
                if name not in value:
                    return _SLOW
            changed: dict[Any, Any] | None = None
            for key, item in value.items():
                check_item = properties.get(key, others)
                if check_item is None:
                    if extra is False:
                        return _SLOW
                    continue
                found = check_item(item)
                if found is _SLOW:
                    return _SLOW
                if found is not item:
                    changed = changed if changed is not None else {}
                    changed[key] = found
            return value if changed is None else {**value, **changed}

        return [obj]

    def _values(self, schema: Mapping[str, Any]) -> list[_Fast]:
        steps: list[_Fast] = []
        if "enum" in schema:
            allowed = list(schema["enum"])
            steps.append(lambda v: v if _same(v, allowed) else _SLOW)
        if "const" in schema:
            only = [schema["const"]]
            steps.append(lambda v: v if _same(v, only) else _SLOW)
        return steps

    def _any_of(self, schema: Mapping[str, Any]) -> list[_Fast]:
        if "anyOf" not in schema:
            return []
        options = [self.compile(option) for option in schema["anyOf"]]

        def any_of(value: Any) -> Any:
            # Accepted as it is by one option; a value one option would coerce takes the full
            # way, which coerces only where no option takes the original.
            for option in options:
                if option(value) is value:
                    return value
            return _SLOW

        return [any_of]


# -- coercion ---------------------------------------------------------------------------------


def _ints(value: Any) -> Any:
    """``value`` with every integral float an int (a copy; ``value`` itself if it has none)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        items = {k: _ints(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if isinstance(value, list | tuple):
        seq = [_ints(v) for v in value]
        return value if all(a is b for a, b in zip(seq, value, strict=True)) else seq
    return value


def _integral_floats(errors: Iterable[ValidationError]) -> Iterator[Sequence[str | int]]:
    """Paths of integral floats that failed "integer" (also inside ``anyOf``/``oneOf``
    branches, where ``Optional[int]`` puts them)."""
    for error in errors:
        if (
            error.validator == "type"
            and isinstance(error.instance, float)
            and error.instance.is_integer()
            and "integer" in _types(error.validator_value)
        ):
            yield error.absolute_path
        yield from _integral_floats(error.context or ())


def _with_int_at(value: Any, path: Sequence[str | int]) -> Any:
    """A copy of ``value`` with the float at ``path`` made an int (copies along the path only)."""
    if not path:
        return int(value)
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, Mapping) else list(value)
    copy[head] = _with_int_at(copy[head], rest)
    return copy


# -- messages ---------------------------------------------------------------------------------


def _describe_error(error: ValidationError, found: list[dict[str, str]]) -> None:
    options: Any = error.validator_value
    if error.validator in ("anyOf", "oneOf") and error.context and error.instance is not None:
        # Optional[X] is anyOf [X, null]: for a non-null value, X's own errors say more.
        real = [
            i
            for i, option in enumerate(options)
            if not (isinstance(option, Mapping) and option.get("type") == "null")
        ]
        if len(real) == 1:
            for sub in error.context:
                if sub.relative_schema_path and sub.relative_schema_path[0] == real[0]:
                    _describe_error(sub, found)
            return
    found.append({"field": _field(error.absolute_path), "message": _message(error)})


def _message(error: ValidationError) -> str:
    keyword, expected = error.validator, error.validator_value
    expected = cast(Any, expected)
    simple = {
        "minimum": "must be >= {}",
        "maximum": "must be <= {}",
        "exclusiveMinimum": "must be > {}",
        "exclusiveMaximum": "must be < {}",
        "multipleOf": "must be a multiple of {}",
        "minLength": "must have at least {} characters",
        "maxLength": "must have at most {} characters",
        "minItems": "must have at least {} items",
        "maxItems": "must have at most {} items",
        "minProperties": "must have at least {} fields",
        "maxProperties": "must have at most {} fields",
    }
    if isinstance(keyword, str) and keyword in simple:
        return simple[keyword].format(_num(expected))
    if keyword == "type":
        return f"must be {' or '.join(_types(expected))}, got {_kind(error.instance)}"
    if keyword in ("required", "additionalProperties"):  # ours: "is required", "is not an ..."
        return error.message
    if keyword == "pattern":
        return f"must match {_quote(expected)}"
    if keyword == "const":
        return f"must be {_quote(expected)}"
    if keyword == "enum":
        return f"must be one of {_quote(list(expected))}"
    if keyword in ("anyOf", "oneOf"):
        if keyword == "oneOf" and not error.context:
            return "matches more than one of the allowed forms (oneOf)"
        return f"matches none of the allowed forms ({keyword})"
    if keyword is None:  # the schema ``false``
        return "no value is allowed here"
    return _clip(error.message)


def _types(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _field(path: Iterable[str | int]) -> str:
    return ".".join(str(p) for p in path) or "(value)"


def _num(value: Any) -> str:
    # Cards travel through protobuf Struct, which turns every number of a schema into a float.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _quote(value: Any) -> str:
    if isinstance(value, Unresolvable):
        # referencing names a local reference by its pointer: "/$defs/X" for "#/$defs/X".
        value = "#" + value.ref if value.ref.startswith("/") else value.ref
    return _clip(repr(value))


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 3] + "..."
