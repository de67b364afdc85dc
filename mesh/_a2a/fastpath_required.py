"""``missing_required``: whether a proto message breaks a REQUIRED field rule, decided fast.

The SDK's handler refuses params whose REQUIRED fields (``google.api.field_behavior``) are
missing with ``validate_proto_required_fields``, which walks every field of the message and of
every message in it, its metadata's ``Struct`` included, reading each field's options: ~4 % of
an LLM turn on the fast path. The rule is the same here, decided from a plan made once per
message type: only the fields that are REQUIRED, or that lead to a type with a REQUIRED field
somewhere below it, are looked at. The fast path calls the SDK's function (for its error)
only when this finds something, so the error is the SDK's own.
"""

from __future__ import annotations

from typing import Any

from google.api.field_behavior_pb2 import FieldBehavior, field_behavior
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message as ProtobufMessage

__all__ = ["missing_required"]

# Per field of a plan: its name, whether it is REQUIRED, whether it is repeated, whether the
# message type it holds has REQUIRED fields somewhere (then it is walked), and what the check
# reads of its descriptor, read once here: whether it has presence, its default value, and
# whether it is a map. (Each descriptor attribute read at every check cost ~1,000
# instructions; the check ran at ~24,000 a typed request.)
_Step = tuple[str, bool, bool, bool, bool, Any, bool]

_plans: dict[Descriptor, tuple[_Step, ...]] = {}
_closed: dict[Descriptor, bool] = {}
#: The plans by message class (``missing_required``'s lookup, without reading DESCRIPTOR).
_plans_by_class: dict[type, tuple[_Step, ...]] = {}


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
    # The class's HasField: on the instance, a name is first tried as a field.
    kind = type(msg)
    plan = _plans_by_class.get(kind)
    if plan is None:
        plan = _plans_by_class[kind] = _plan(kind.DESCRIPTOR)
    for name, required, repeated, walk, presence, default, is_map in plan:
        if walk and not repeated and not required:
            # A message field that may be absent: asked before it is read (reading an absent
            # one makes an empty message for it).
            if kind.HasField(msg, name) and missing_required(getattr(msg, name)):
                return True
            continue
        value = getattr(msg, name)
        if required:
            if repeated:
                if not value:
                    return True
            elif presence:
                if not kind.HasField(msg, name):
                    return True
            elif value == default:
                return True
        if not walk:
            continue
        if not repeated:
            if missing_required(value):  # a REQUIRED message field, present (checked above)
                return True
        elif is_map:
            for item in value.values():
                if isinstance(item, ProtobufMessage) and missing_required(item):
                    return True
        # ``[:]``: the items as a list at once (iterating a repeated field indexes it until an
        # IndexError, made and dropped).
        elif any(missing_required(item) for item in value[:]):
            return True
    return False
