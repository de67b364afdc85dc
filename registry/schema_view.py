"""JSON Schema -> rows an operator can read: (field, type, required, description).

Handles what pydantic emits: ``$ref``/``$defs``, ``anyOf`` (optionals), arrays, enums, nested
objects (flattened as ``parent.child``) and the common constraints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FieldRow", "schema_rows", "type_label"]

_MAX_DEPTH = 4
_CONSTRAINTS = (
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "min length {}"),
    ("maxLength", "max length {}"),
    ("pattern", "pattern {}"),
    ("minItems", "min {} items"),
    ("maxItems", "max {} items"),
)


@dataclass(frozen=True)
class FieldRow:
    name: str
    type: str
    required: bool
    description: str


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.removeprefix("#/$defs/"))
        if isinstance(target, dict):
            return target
    return schema


def _num(value: Any) -> str:
    # Cards travel through protobuf Struct, which turns every number into a float.
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def type_label(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """A short human type: ``string``, ``array of Item``, ``integer | null``, ``one of: a, b``."""
    defs = defs or {}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    if "enum" in schema:
        return "one of: " + ", ".join(
            _num(v) if not isinstance(v, str) else v for v in schema["enum"]
        )
    if "const" in schema:
        return f"= {schema['const']}"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(type_label(s, defs) for s in schema[key] if isinstance(s, dict))
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " | ".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        label = f"array of {type_label(schema['items'], defs)}"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        label = f"map of {type_label(schema['additionalProperties'], defs)}"
    else:
        label = str(kind)
    if schema.get("format"):
        label += f" ({schema['format']})"
    extra = [fmt.format(_num(schema[k])) for k, fmt in _CONSTRAINTS if k in schema]
    return label + (", " + ", ".join(extra) if extra else "")


def schema_rows(schema: dict[str, Any] | None) -> list[FieldRow]:
    """The fields of an object schema, nested objects flattened (``address.city``)."""
    if not schema:
        return []
    defs = schema.get("$defs", {}) if isinstance(schema.get("$defs"), dict) else {}
    rows: list[FieldRow] = []
    _collect(_resolve(schema, defs), defs, "", rows, 0)
    return rows


def _collect(
    schema: dict[str, Any], defs: dict[str, Any], prefix: str, rows: list[FieldRow], depth: int
) -> None:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return
    required = set(schema.get("required", []))
    # Cards carry schemas through protobuf Struct, which does not keep key order: show the
    # required fields first so the table reads the same however the keys arrive.
    for name, prop in sorted(props.items(), key=lambda kv: kv[0] not in required):
        if not isinstance(prop, dict):
            continue
        target = _resolve(prop, defs)
        description = str(prop.get("description") or target.get("description") or "")
        default = prop.get("default")
        if default is not None and not isinstance(default, (dict, list)):
            description = (description + f" (default {_num(default)})").strip()
        rows.append(FieldRow(prefix + name, type_label(prop, defs), name in required, description))
        if depth < _MAX_DEPTH and isinstance(target.get("properties"), dict):
            _collect(target, defs, f"{prefix}{name}.", rows, depth + 1)
