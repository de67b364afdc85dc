"""Check a JSON value against a JSON Schema: the subset pydantic emits, nothing more.

A caller only has a peer's skill schemas (from its card), not its pydantic models, so remote
arguments and results are checked against the schema itself:

    value = check({"applicant_id": "APP-501", "amount": 250000.0}, schema)   # coerced copy
    # SchemaViolation("amount: must be >= 1000", errors=[{"field": "amount", ...}])

Supported: ``type`` (incl. lists), ``properties``/``required``/``additionalProperties``,
``items``/``prefixItems``/``minItems``/``maxItems``, ``enum``/``const``, ``anyOf``/``oneOf``/
``allOf``, ``$ref`` into ``$defs``, ``minimum``/``maximum``/``exclusive*``/``multipleOf``,
``minLength``/``maxLength``/``pattern``. Unknown keywords (``format``, ``title``...) are ignored,
as the spec allows. One coercion: an integral float is accepted (and returned) as an integer,
because A2A data parts carry every number as a double.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["SchemaViolation", "check"]

_MAX_DEPTH = 64


class SchemaViolation(ValueError):
    """The value does not match. ``errors``: ``[{"field": "a.b.0", "message": ...}]``."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))


def check(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` (integral floats made ints where the schema wants integers) or
    ``SchemaViolation`` listing every problem found."""
    errors: list[dict[str, str]] = []
    result = _check(value, schema, schema.get("$defs", {}), "", errors, 0)
    if errors:
        raise SchemaViolation(errors)
    return result


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "object":
        return isinstance(value, Mapping)
    return True  # an unknown type name constrains nothing we understand


def _describe(value: Any) -> str:
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


def _check(
    value: Any,
    schema: Mapping[str, Any] | bool,
    defs: Mapping[str, Any],
    path: str,
    errors: list[dict[str, str]],
    depth: int,
) -> Any:
    def fail(message: str) -> Any:
        errors.append({"field": path or "(value)", "message": message})
        return value

    if schema is True or schema == {}:
        return value
    if schema is False:
        return fail("no value is allowed here")
    assert isinstance(schema, Mapping)
    if depth > _MAX_DEPTH:
        return fail("schema nesting too deep")
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1]) if ref.startswith("#/$defs/") else None
        if target is None:
            return fail(f"schema reference {ref!r} cannot be resolved")
        value = _check(value, target, defs, path, errors, depth + 1)
    for sub in schema.get("allOf", ()):
        value = _check(value, sub, defs, path, errors, depth + 1)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if options:
            for option in options:
                trial: list[dict[str, str]] = []
                converted = _check(value, option, defs, path, trial, depth + 1)
                if not trial:
                    value = converted
                    break
            else:
                # Optional[X] is anyOf [X, null]: for a non-null value, X's own errors say more.
                real = [
                    o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")
                ]
                if value is not None and len(real) == 1:
                    return _check(value, real[0], defs, path, errors, depth + 1)
                return fail(f"matches none of the allowed forms ({key})")
    if "const" in schema and value != schema["const"]:
        return fail(f"must be {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        return fail(f"must be one of {list(schema['enum'])!r}")
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        matching = [k for k in allowed if _type_ok(value, k)]
        if not matching:
            return fail(f"must be {' or '.join(allowed)}, got {_describe(value)}")
        if "integer" in matching and "number" not in matching and isinstance(value, float):
            value = int(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        _numeric(value, schema, fail)
    elif isinstance(value, str):
        _string(value, schema, fail)
    elif isinstance(value, list | tuple):
        value = _array(list(value), schema, defs, path, errors, depth, fail)
    elif isinstance(value, Mapping):
        value = _object(value, schema, defs, path, errors, depth)
    return value


def _numeric(value: float, schema: Mapping[str, Any], fail: Any) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        fail(f"must be >= {_num(schema['minimum'])}")
    if "maximum" in schema and value > schema["maximum"]:
        fail(f"must be <= {_num(schema['maximum'])}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        fail(f"must be > {_num(schema['exclusiveMinimum'])}")
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        fail(f"must be < {_num(schema['exclusiveMaximum'])}")
    step = schema.get("multipleOf")
    if step and abs(value / step - round(value / step)) > 1e-9:
        fail(f"must be a multiple of {_num(step)}")


def _string(value: str, schema: Mapping[str, Any], fail: Any) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        fail(f"must have at least {_num(schema['minLength'])} characters")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        fail(f"must have at most {_num(schema['maxLength'])} characters")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            matched = re.search(pattern, value) is not None
        except re.error:
            matched = True  # a pattern Python cannot compile constrains nothing we can check
        if not matched:
            fail(f"must match {pattern!r}")


def _array(
    value: list[Any],
    schema: Mapping[str, Any],
    defs: Mapping[str, Any],
    path: str,
    errors: list[dict[str, str]],
    depth: int,
    fail: Any,
) -> list[Any]:
    if "minItems" in schema and len(value) < schema["minItems"]:
        fail(f"must have at least {_num(schema['minItems'])} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        fail(f"must have at most {_num(schema['maxItems'])} items")
    prefix = list(schema.get("prefixItems", ()))
    items = schema.get("items")
    out = []
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        child = f"{path}.{i}" if path else str(i)
        out.append(item if sub is None else _check(item, sub, defs, child, errors, depth + 1))
    return out


def _object(
    value: Mapping[str, Any],
    schema: Mapping[str, Any],
    defs: Mapping[str, Any],
    path: str,
    errors: list[dict[str, str]],
    depth: int,
) -> dict[str, Any]:
    props: Mapping[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    out: dict[str, Any] = {}
    for name in schema.get("required", ()):
        if name not in value:
            field = f"{path}.{name}" if path else name
            errors.append({"field": field, "message": "is required"})
    for key, item in value.items():
        field = f"{path}.{key}" if path else str(key)
        if key in props:
            out[key] = _check(item, props[key], defs, field, errors, depth + 1)
        elif extra is False:
            errors.append({"field": field, "message": "is not an allowed field"})
        elif isinstance(extra, Mapping):
            out[key] = _check(item, extra, defs, field, errors, depth + 1)
        else:
            out[key] = item
    return out


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
