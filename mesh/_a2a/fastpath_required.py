"""``missing_required``: whether a proto message breaks a REQUIRED field rule, decided fast.

The SDK's handler refuses params whose REQUIRED fields (``google.api.field_behavior``) are
missing with ``validate_proto_required_fields``, which walks every field of the message and of
every message in it, its metadata's ``Struct`` included, reading each field's options: ~4 % of
an LLM turn on the fast path. The rule is the same here, decided from a plan made once per
message type: only the fields that are REQUIRED, or that lead to a type with a REQUIRED field
somewhere below it, are looked at, the plan written out as one function per message class
(``_compile``). The fast path calls the SDK's function (for its error)
only when this finds something, so the error is the SDK's own.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import Any

from google.api.field_behavior_pb2 import FieldBehavior, field_behavior
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as ProtobufMessage
from google.protobuf.message_factory import GetMessageClass

__all__ = ["missing_required"]

# Per field of a plan: its name, whether it is REQUIRED, whether it is repeated, whether the
# message type it holds has REQUIRED fields somewhere (then it is walked), and what the check
# reads of its descriptor, read once here: whether it has presence, its default value, and
# whether it is a map. (Each descriptor attribute read at every check cost ~1,000
# instructions; the check ran at ~24,000 a typed request.)
_Step = tuple[str, bool, bool, bool, bool, Any, bool]

_plans: dict[Descriptor, tuple[_Step, ...]] = {}
_closed: dict[Descriptor, bool] = {}


def _required(field: FieldDescriptor) -> bool:
    behaviors = field.GetOptions().Extensions[field_behavior]
    return bool(FieldBehavior.REQUIRED in behaviors)


def _repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 6.31 has ``is_repeated``; 7 dropped ``label`` (the SDK reads it the same way).
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(getattr(field, "label", None) == FieldDescriptor.LABEL_REPEATED)


def _has_required(desc: Descriptor) -> bool:
    """Whether ``desc`` or a message type reachable from it has a REQUIRED field."""
    known = _closed.get(desc)
    if known is not None:
        return known
    seen: set[Descriptor] = set()
    todo = [desc]
    found = False
    while todo and not found:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for field in current.fields:
            if _required(field):
                found = True
                break
            if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
                todo.append(field.message_type)
    _closed[desc] = found
    return found


def _plan(desc: Descriptor) -> tuple[_Step, ...]:
    plan = _plans.get(desc)
    if plan is None:
        steps: list[_Step] = []
        for field in desc.fields:
            walk = (
                field.type == FieldDescriptor.TYPE_MESSAGE
                and field.message_type is not None
                and _has_required(field.message_type)
            )
            required = _required(field)
            if required or walk:
                repeated = _repeated(field)
                is_map = walk and repeated and bool(field.message_type.GetOptions().map_entry)
                presence = field.has_presence
                steps.append(
                    (field.name, required, repeated, walk, presence, field.default_value, is_map)
                )
        plan = tuple(steps)
        _plans[desc] = plan
    return plan


def missing_required(msg: ProtobufMessage) -> bool:
    """Whether ``validate_proto_required_fields(msg)`` (a2a-sdk) would find an error: a
    REQUIRED field unset (a repeated one empty, a scalar at its default), in ``msg`` or in a
    message it holds."""
    kind = type(msg)
    check = _checks_by_class.get(kind)
    if check is None:
        check = _checks_by_class[kind] = _compile(kind)
    return check(msg)


#: Each message class's check: its plan written out as one function (``_compile``).
_checks_by_class: dict[type, Callable[[Any], bool]] = {}
#: How deep a message held in a message is checked inline, not by a call (a type may hold
#: itself).
_INLINE_DEPTH = 4


def _compile(kind: type) -> Callable[[Any], bool]:
    """``kind``'s plan as the source of one function, its message fields held once checked
    in the same function: the plan's steps read in a loop, a tuple unpacked and a call per
    message, cost ~3.5 us for a ``SendMessageRequest``; written out, ~1 us."""
    names: dict[str, Any] = {"missing_required": missing_required, "_Message": ProtobufMessage}
    lines = ["def check(m0):"]
    _emit(kind, "m0", 1, lines, names, 0)
    lines.append("    return False")
    exec("\n".join(lines), names)  # the source is written here, from descriptors
    check: Callable[[Any], bool] = names["check"]
    return check


def _name(names: dict[str, Any], value: Any) -> str:
    """A global of the function being written, holding ``value``."""
    name = f"c{len(names)}"
    names[name] = value
    return name


def _read(var: str, field: str) -> str:
    # A field named like a Python keyword is read by getattr.
    return f"getattr({var}, {field!r})" if keyword.iskeyword(field) else f"{var}.{field}"


def _emit(
    kind: type, var: str, indent: int, lines: list[str], names: dict[str, Any], depth: int
) -> None:
    """The checks of ``kind``'s plan on the message in ``var``: each returns True on a field
    the rule refuses, in the plan's order (``_plan``'s loop, as ``missing_required`` walked
    it before it was written out)."""
    pad = "    " * indent
    desc = kind.DESCRIPTOR  # type: ignore[attr-defined]
    # The class's HasField: on the instance, a name is first tried as a field.
    has = _name(names, kind.HasField)  # type: ignore[attr-defined]
    for field, required, repeated, walk, presence, default, is_map in _plan(desc):
        value = f"v{len(lines)}"
        inner: type | None = None
        if walk and not repeated and depth < _INLINE_DEPTH:
            inner = GetMessageClass(desc.fields_by_name[field].message_type)
        if walk and not repeated and not required:
            # A message field that may be absent: asked before it is read (reading an absent
            # one makes an empty message for it).
            lines.append(f"{pad}if {has}({var}, {field!r}):")
            lines.append(f"{pad}    {value} = {_read(var, field)}")
            if inner is not None:
                _emit(inner, value, indent + 1, lines, names, depth + 1)
            else:
                lines.append(f"{pad}    if missing_required({value}): return True")
            continue
        if required and presence and not repeated:
            lines.append(f"{pad}if not {has}({var}, {field!r}): return True")
            if not walk:
                continue
        lines.append(f"{pad}{value} = {_read(var, field)}")
        if required and repeated:
            lines.append(f"{pad}if not {value}: return True")
        elif required and not presence:
            lines.append(f"{pad}if {value} == {_name(names, default)}: return True")
        if not walk:
            continue
        if inner is not None:  # a REQUIRED message field, present (checked above)
            _emit(inner, value, indent, lines, names, depth + 1)
        elif not repeated:
            lines.append(f"{pad}if missing_required({value}): return True")
        elif is_map:
            lines.append(f"{pad}for item in {value}.values():")
            lines.append(f"{pad}    if isinstance(item, _Message) and missing_required(item):")
            lines.append(f"{pad}        return True")
        else:
            # ``[:]``: the items as a list at once (iterating a repeated field indexes it
            # until an IndexError, made and dropped).
            lines.append(f"{pad}for item in {value}[:]:")
            lines.append(f"{pad}    if missing_required(item): return True")
