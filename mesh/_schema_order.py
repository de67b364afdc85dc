"""Key order and integers that survive an agent card.

A card carries the typed skills' JSON Schemas in a protobuf ``Struct``: a map, so the order of
``properties`` is lost, and every number becomes a double (``minLength: 1.0``). Humans reading
``mesh card``/``mesh show`` and models reading tool schemas want the order the pydantic model
declares, and the card should say ``1``. So:

* ``with_property_order(schema)``, before a schema goes into a card, adds
  ``propertyOrdering`` (the properties' names, a list: lists keep their order) to every object
  schema. Gemini's schema dialect has the same keyword with the same meaning; JSON Schema
  validators ignore it.
* ``restore(schema)``, on every schema read from a card, puts ``properties`` back in that order
  (and drops the keyword, unless the card is to be parsed again), every other key in pydantic's
  order (sorted), and whole doubles back to integers.
* ``order_like(data, schema)`` orders a JSON value (a skill's answer, itself a ``Struct`` on
  the wire) as its schema declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ORDER_KEYWORD", "order_like", "restore", "with_property_order"]

ORDER_KEYWORD = "propertyOrdering"

# Keywords whose value is data (kept as is), or a map of names to schemas.
_DATA = frozenset({"default", "const", "enum", "examples", "example"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
_MAX_DEPTH = 64


def with_property_order(schema: Mapping[str, Any], _depth: int = 0) -> dict[str, Any]:
    """A copy of ``schema`` with ``propertyOrdering`` on every object schema with properties."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        out[key] = _map_schemas(value, key, with_property_order, _depth)
    props = schema.get("properties")
    if isinstance(props, Mapping) and props:
        out[ORDER_KEYWORD] = list(props)
    return out


def restore(
    schema: Mapping[str, Any], _depth: int = 0, *, keep_hint: bool = False
) -> dict[str, Any]:
    """``schema`` as the pydantic model declared it: properties in ``propertyOrdering`` order,
    other keys sorted, whole numbers as integers (but data, such as a ``default``, of a
    ``number`` schema). ``propertyOrdering`` is dropped unless ``keep_hint`` (a card that will
    be parsed again needs it: ``card_to_dict``)."""
    out: dict[str, Any] = {}
    order = schema.get(ORDER_KEYWORD)

    def again(sub: Mapping[str, Any], depth: int) -> dict[str, Any]:
        return restore(sub, depth, keep_hint=keep_hint)

    for key in sorted(k for k in schema if k != ORDER_KEYWORD or keep_hint):
        if key == ORDER_KEYWORD:
            out[key] = schema[key]
            continue
        value = _map_schemas(schema[key], key, again, _depth)
        if key == "properties" and isinstance(value, dict):
            value = _ordered(value, order if isinstance(order, list) else [])
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            value = dict(sorted(value.items()))
        if key in _DATA and schema.get("type") != "number":
            value = _ints(value)  # a number-typed default of 1.0 stays 1.0
        out[key] = value
    return out


def order_like(data: Any, schema: Mapping[str, Any] | None) -> Any:
    """``data`` with object keys in the order ``schema`` declares them (keys the schema does not
    name keep their place after those it does). Unknown shapes are returned as they are."""
    if not schema:
        return data
    return _order(data, schema, schema.get("$defs") or {}, 0)


# -- helpers ----------------------------------------------------------------------------------


def _map_schemas(value: Any, key: str, fn: Any, depth: int) -> Any:
    """Apply ``fn`` to the sub-schemas under ``key``; leave data alone."""
    if depth > _MAX_DEPTH or key in _DATA:
        return value
    if key in _SCHEMA_MAPS and isinstance(value, Mapping):
        return {k: fn(v, depth + 1) if isinstance(v, Mapping) else v for k, v in value.items()}
    if isinstance(value, Mapping):  # items, additionalProperties, not, ...
        return fn(value, depth + 1)
    if isinstance(value, list):  # anyOf, oneOf, allOf, prefixItems; lists of strings stay
        return [fn(v, depth + 1) if isinstance(v, Mapping) else _ints(v) for v in value]
    return _ints(value)


def _ordered(props: dict[str, Any], order: list[Any]) -> dict[str, Any]:
    names = [n for n in order if isinstance(n, str) and n in props]
    rest = [n for n in props if n not in names]  # no hint: as they came (restore is idempotent)
    return {n: props[n] for n in [*names, *rest]}


def _ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    return value


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        if isinstance(target, Mapping):
            return target
    return schema


def _order(data: Any, schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return data
    schema = _resolve(schema, defs)
    if isinstance(data, dict):
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            for option in schema.get("anyOf") or schema.get("oneOf") or []:
                option = _resolve(option, defs) if isinstance(option, Mapping) else {}
                if isinstance(option.get("properties"), Mapping):
                    return _order(data, option, defs, depth + 1)
            return data
        known = [k for k in props if k in data]
        keys = [*known, *(k for k in data if k not in props)]
        return {
            k: _order(data[k], props[k], defs, depth + 1)
            if k in props and isinstance(props[k], Mapping)
            else data[k]
            for k in keys
        }
    if isinstance(data, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_order(v, items, defs, depth + 1) for v in data]
    return data
