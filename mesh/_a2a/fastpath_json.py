"""The fast route's protobuf JSON: a ``SendMessageRequest`` read from the gate's parse, and an
answer written as the dict ``MessageToDict`` makes, in a fraction of their time.

``json_format.ParseDict`` and ``MessageToDict`` walk the descriptors in Python for every field
of every message (formatting a path string per field on the way in): ~24 us to read a chat
turn's request and ~40 us to write its answer, ~4 % of a turn. Here:

* ``send_request`` builds the request with the message constructors when it has the shape a
  client sends (``message`` with ``messageId``, ``role``, ``parts`` of ``text`` or ``data``,
  optional ``contextId``, ``metadata``, ``mediaType``; ``configuration`` with
  ``historyLength``, ``acceptedOutputModes``). Any other member, or a value of another type,
  returns None and the caller uses ``ParseDict`` (and with it, its errors);
* ``to_json`` converts a message with a plan made once per message type (the JSON name and
  converter of each field): the same rules as ``MessageToDict`` (field order of
  ``ListFields``, enum names, int64 as strings, bytes as base64, ``Struct``/``Value`` as
  JSON, ``Timestamp`` as RFC 3339), so the bytes sent are the same. A type it has no plan for
  (``Any``, wrappers, ``float`` fields, custom enum JSON names), or a value it refuses (a
  ``NaN`` number), goes to ``MessageToDict``, whose result or error is the answer;
* ``response_text`` and ``rpc_result`` write the answer's JSON text itself, in one pass, the
  bytes ``json.dumps`` writes of ``response_json``'s dict (see "writing text" below).
* a function skill's task built at once (``mesh._a2a.one_shot``) is written from the values it
  was built from (``Settled``, "writing a settled task" below), not walked back: the same text;
* ``handed_values`` gives the run the request's values from the gate's parse (kept by
  ``FastRoute`` under ``RAW_MESSAGE``) as reading them back from the built request gives them,
  but for an object's members' order, which only some readers can see (the executor decides).

tests/test_fastroute_json.py compares both with ``json_format`` on many requests and tasks.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from a2a.helpers import new_data_part
from a2a.types import (
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SendMessageResponse,
    Task,
    TaskStatus,
)
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.struct_pb2 import ListValue, Struct, Value
from google.protobuf.timestamp_pb2 import Timestamp

__all__ = [
    "RAW_MESSAGE",
    "SETTLED",
    "UNREAD",
    "WRITES_SETTLED",
    "Settled",
    "data_part",
    "dumps",
    "handed_values",
    "response_json",
    "response_text",
    "rpc_result",
    "send_request",
    "to_json",
]

_Convert = Callable[[Any], Any]
# Repeated fields are read as ``values[:]``, a list made at once: iterating the container
# itself indexes it until an IndexError, made and dropped (~2 us per loop). A message's methods
# are called from its class (``type(m).ListFields(m)``, ``_which_kind(value, "kind")``): looked
# up on the instance, a method name is first tried as a field name (~0.15 us each).
_which_kind = Value.WhichOneof

_MESSAGE_KEYS = frozenset({"messageId", "role", "parts", "contextId", "metadata"})
_CONFIG_KEYS = frozenset({"historyLength", "acceptedOutputModes"})
_ROLES = dict(Role.items())


def send_request(raw: dict[str, Any]) -> SendMessageRequest | None:
    """``raw`` (a ``SendMessageRequest``'s JSON) as ``ParseDict`` would read it, when it has the
    common shape (module docstring); None otherwise."""
    message = raw.get("message")
    if not isinstance(message, dict) or not _MESSAGE_KEYS.issuperset(message):
        return None
    if len(raw) != (2 if "configuration" in raw else 1):
        return None
    message_id = message.get("messageId", "")
    context_id = message.get("contextId", "")
    role = _ROLES.get(message.get("role", "ROLE_UNSPECIFIED"))
    raw_parts = message.get("parts", [])
    if (
        role is None
        or type(message_id) is not str
        or type(context_id) is not str
        or type(raw_parts) is not list
    ):
        return None
    # Built in place: a message (or part, or configuration) made apart and then set is
    # copied into its holder, ~20 k instructions a request.
    request = SendMessageRequest(
        message={"message_id": message_id, "context_id": context_id, "role": role}
    )
    built = request.message
    parts = built.parts
    for raw_part in raw_parts:
        if not _part(parts.add(), raw_part):
            return None
    if "metadata" in message:
        if type(message["metadata"]) is not dict:
            return None
        _struct(built.metadata, message["metadata"])
    if "configuration" in raw and not _configuration(request.configuration, raw["configuration"]):
        return None
    return request


#: Key of ``ServerCallContext.state``: the request's message as ``send_request`` built it and
#: the gate's parse it was built from (``FastRoute``), for ``handed_values``.
RAW_MESSAGE = "mesh.raw_message"
#: ``handed_values``'s answer for a value it leaves to the ``Struct`` it was built into.
UNREAD: Any = object()


def handed_values(raw: Any, *, flat: bool = False) -> Any:
    """``raw`` (a gate's parse of a JSON value that ``send_request`` built into a ``Value``) as
    ``to_json`` reads that ``Value`` back, without reading it: a number is a float (a
    ``Value`` holds a double), a string, bool or null itself, objects and arrays the same,
    except for the order of an object's members (a ``Struct``'s is its map's, which depends
    on the process's hash seed): a caller whose reader may see that order reads the
    ``Struct`` instead. ``UNREAD`` for what ``to_json`` may answer otherwise (a number that is
    not finite: its error; a type a parse does not make), and with ``flat`` for an object
    that holds an object (its members' order is the reader's to see)."""
    kind = type(raw)
    if kind is dict:
        values = {}
        for key, item in raw.items():
            if type(item) is dict and flat:
                return UNREAD
            value = handed_values(item, flat=flat)
            if value is UNREAD:
                return UNREAD
            values[key] = value
        return values
    if kind is str or kind is bool or raw is None:
        return raw
    if kind is int or kind is float:
        number = float(raw)  # the double the Value holds (an int past 1e308 was refused)
        return number if _isfinite(number) else UNREAD
    if kind is list:
        items = []
        for item in raw:
            if type(item) is dict and flat:
                return UNREAD
            value = handed_values(item, flat=flat)
            if value is UNREAD:
                return UNREAD
            items.append(value)
        return items
    return UNREAD


def _part(part: Part, raw: Any) -> bool:
    """``raw`` read into ``part``; False when it has another shape."""
    if type(raw) is not dict:
        return False
    media_type = raw.get("mediaType", "")
    if type(media_type) is not str:
        return False
    if len(raw) != (2 if "mediaType" in raw else 1):
        return False
    if "text" in raw:
        text = raw["text"]
        if type(text) is not str:
            return False
        part.text = text
    elif "data" in raw:
        _value(part.data, raw["data"])
    else:
        return False
    if media_type:
        part.media_type = media_type
    return True


def data_part(data: Any, media_type: str = "") -> Part:
    """``a2a.helpers.new_data_part(data, media_type)``: the same ``Part``, built without
    ``ParseDict``'s descriptor walk when ``data`` is made of JSON types (dict, list, str,
    number, bool, None); anything else is left to ``new_data_part`` (and its errors)."""
    part = Part(media_type=media_type)
    try:
        _value(part.data, data)
    except ValueError:
        return new_data_part(data, media_type=media_type)
    return part


def _configuration(config: SendMessageConfiguration, raw: Any) -> bool:
    """``raw`` read into ``config`` (present, as ``ParseDict`` makes it, even when empty);
    False when it has another shape."""
    if type(raw) is not dict or not _CONFIG_KEYS.issuperset(raw):
        return False
    config.SetInParent()
    if "historyLength" in raw:
        length = raw["historyLength"]
        # ParseDict's int32 range; a bool or a float goes to it for its own error
        if type(length) is not int or not -(2**31) <= length < 2**31:
            return False
        config.history_length = length
    if "acceptedOutputModes" in raw:
        modes = raw["acceptedOutputModes"]
        if type(modes) is not list or any(type(mode) is not str for mode in modes):
            return False
        config.accepted_output_modes.extend(modes)
    return True


def _struct(struct: Struct, raw: dict[str, Any]) -> None:
    """``raw`` into ``struct``, a new one (as every caller's is): its entries make it present;
    as ParseDict, Clear marks an empty one present."""
    if not raw:
        struct.Clear()
        return
    fields = struct.fields
    for key, item in raw.items():
        _value(fields[key], item)


def _value(value: Value, raw: Any) -> None:
    """``raw`` (a parsed JSON value) into ``value``, a new one, as ``ParseDict`` converts a
    ``Value``. The exact JSON types first (what a parse makes), by type; a subclass (a str or
    int enum, an OrderedDict) after, by isinstance."""
    kind = type(raw)
    if kind is str:
        value.string_value = raw
    elif kind is dict:
        _struct(value.struct_value, raw)
    elif kind is int or kind is float:
        value.number_value = raw
    elif kind is bool:
        value.bool_value = raw
    elif raw is None:
        value.null_value = 0
    elif kind is list:
        _list(value, raw)
    else:
        _value_of_subclass(value, raw)


def _list(value: Value, raw: list[Any]) -> None:
    items = value.list_value
    if not raw:
        items.Clear()  # present, as an empty Struct
        return
    values = items.values
    for item in raw:
        _value(values.add(), item)


def _value_of_subclass(value: Value, raw: Any) -> None:
    if isinstance(raw, dict):
        _struct(value.struct_value, raw)
    elif isinstance(raw, list):
        _list(value, raw)
    elif isinstance(raw, bool):
        value.bool_value = raw
    elif isinstance(raw, str):
        value.string_value = raw
    elif isinstance(raw, int | float):
        value.number_value = raw
    else:
        raise ValueError(f"not a JSON value: {type(raw).__name__}")


# --- writing --------------------------------------------------------------------------------


class _Unplanned(Exception):
    """A type or value ``to_json`` leaves to ``MessageToDict``."""


#: Plans by message type; None for a type ``MessageToDict`` converts.
_PLANS: dict[Descriptor, _Convert | None] = {}


def to_json(message: ProtoMessage) -> Any:
    """``message`` as ``MessageToDict(message)`` returns it (same keys, order and values), and
    its error for a value it cannot write."""
    try:
        return _message(message)
    except _Unplanned:
        return MessageToDict(message)


def response_json(answer: Task | Message) -> dict[str, Any]:
    """``MessageToDict(SendMessageResponse(task=answer))`` (or ``message=``), without copying
    ``answer`` into the response first."""
    key = "task" if isinstance(answer, Task) else "message"
    try:
        return {key: _message(answer)}
    except _Unplanned:
        answered: dict[str, Any] = MessageToDict(SendMessageResponse(**{key: answer}))
        return answered


def _message(message: ProtoMessage) -> Any:
    desc = message.DESCRIPTOR
    try:
        plan = _PLANS[desc]
    except KeyError:
        plan = _PLANS[desc] = _plan(desc)
    if plan is None:
        raise _Unplanned
    return plan(message)


def _plan(desc: Descriptor) -> _Convert | None:
    special = _SPECIAL.get(desc.full_name)
    if special is not None:
        return special
    if desc.file.name == "google/protobuf/wrappers.proto" or desc.full_name in _LEFT:
        return None
    fields: dict[FieldDescriptor, tuple[str, _Convert]] = {}
    for field in desc.fields:
        convert = _field(field)
        if convert is None:
            return None
        fields[field] = (field.json_name, convert)

    def regular(message: Any) -> dict[str, Any]:
        js = {}
        for field, value in type(message).ListFields(message):
            planned = fields.get(field)
            if planned is None:
                raise _Unplanned  # an extension
            js[planned[0]] = planned[1](value)
        return js

    return regular


def _field(field: FieldDescriptor) -> _Convert | None:
    """The converter of one field's value (its list or map for those), or None."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value = _single(entry.fields_by_name["value"])
        if value is None:
            return None
        return lambda mapping: {_map_key(key): value(mapping[key]) for key in mapping}
    single = _single(field)
    if single is None:
        return None
    if field.is_repeated:
        return lambda values: [single(item) for item in values[:]]
    return single


def _map_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _single(field: FieldDescriptor) -> _Convert | None:
    kind = field.cpp_type
    if kind == FieldDescriptor.CPPTYPE_MESSAGE:
        return _message
    if kind == FieldDescriptor.CPPTYPE_ENUM:
        return _enum(field)
    if kind == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            return lambda raw: base64.b64encode(raw).decode("utf-8")
        return _same
    if kind == FieldDescriptor.CPPTYPE_BOOL:
        return _same
    if kind in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
        return str
    if kind in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_UINT32):
        return _same
    if kind == FieldDescriptor.CPPTYPE_DOUBLE:
        return _double
    return None  # float: MessageToDict's shortest-float rule


def _same(value: Any) -> Any:
    return value


def _double(value: float) -> Any:
    if math.isinf(value):
        return "-Infinity" if value < 0.0 else "Infinity"
    if math.isnan(value):
        return "NaN"
    return value


def _enum(field: FieldDescriptor) -> _Convert | None:
    enum = field.enum_type
    if enum.full_name == "google.protobuf.NullValue":
        return lambda _: None
    if _custom_enum_names():
        return None
    names = {number: value.name for number, value in enum.values_by_number.items()}
    closed = enum.is_closed

    def convert(number: int) -> Any:
        name = names.get(number)
        if name is not None:
            return name
        if closed:
            raise _Unplanned  # MessageToDict's error
        return number

    return convert


def _custom_enum_names() -> bool:
    """Whether enum values may carry a JSON name of their own (``pb.enumvalue.json``)."""
    try:
        descriptor_pool.Default().FindExtensionByName("pb.enumvalue.json")
    except KeyError:
        return False
    return True


def _value_json(value: Value) -> Any:
    which = _which_kind(value, "kind")
    if which is None or which == "null_value":
        return None
    if which == "string_value":
        return value.string_value
    if which == "number_value":
        number = value.number_value
        if math.isinf(number) or math.isnan(number):
            raise _Unplanned  # MessageToDict's error
        return number
    if which == "bool_value":
        return value.bool_value
    if which == "struct_value":
        return _struct_json(value.struct_value)
    return _list_json(value.list_value)


def _struct_json(struct: Struct) -> dict[str, Any]:
    fields = struct.fields
    return {key: _value_json(fields[key]) for key in fields}


def _list_json(values: ListValue) -> list[Any]:
    return [_value_json(value) for value in values.values[:]]


def _text_json(message: Any) -> Any:
    return message.ToJsonString()


_SPECIAL: dict[str, _Convert] = {
    "google.protobuf.Value": _value_json,
    "google.protobuf.Struct": _struct_json,
    "google.protobuf.ListValue": _list_json,
    "google.protobuf.Timestamp": _text_json,
    "google.protobuf.Duration": _text_json,
    "google.protobuf.FieldMask": _text_json,
}
#: Well-known types with a JSON form of their own that this does not write.
_LEFT = frozenset({"google.protobuf.Any", "google.protobuf.Empty"})


# --- writing text ---------------------------------------------------------------------------
#
# The answer's bytes are ``json.dumps`` of ``response_json``'s dict (``dumps``, what Starlette's
# ``JSONResponse`` writes). Building that dict and then walking it again in ``json.dumps`` is
# two passes; a chat turn's answer is written here in one, as text: the same plans as above
# (same fields, order and refusals), each writing its JSON where ``to_json`` makes a value, with
# the pieces ``json.dumps`` itself uses (``encode_basestring`` for strings, ``float.__repr__``
# and ``int.__repr__`` for numbers). tests/test_fastroute_json.py compares the bytes.

_quote: Callable[[str], str] = encode_basestring
_float_text = float.__repr__
_int_text = int.__repr__
_isfinite = math.isfinite

#: Text plans by message type; None for a type left to ``MessageToDict``.
_TEXT_PLANS: dict[Descriptor, _Convert | None] = {}
#: The members' writer of each regular plan, given a message's ``ListFields``.
_FIELDS_TEXT: dict[Descriptor, Callable[[list[tuple[FieldDescriptor, Any]]], str]] = {}


def dumps(value: Any) -> bytes:
    """``value`` as Starlette's ``JSONResponse`` writes it."""
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def response_text(
    answer: Task | Message, history_from: int = 0, settled: Settled | None = None
) -> str:
    """The JSON text of ``response_json(answer)``, as ``dumps`` writes it (decoded), and its
    error for an answer it cannot write. ``history_from``: the task's history messages before
    this index are left out, as of the task made without them (``_trimmed``). ``settled``:
    what a held run's final task was built from, written from that when ``answer`` is that
    task (``Settled``)."""
    if settled is not None and settled.is_of(answer):
        text = _settled_text(settled, history_from, '{"task":', "}")
        if text is not None:
            return text
        answer = settled.task  # walked (a stand-in is not the task)
    key = '{"task":' if isinstance(answer, Task) else '{"message":'
    try:
        if history_from:
            return key + _task_text(answer, history_from) + "}"
        return key + _message_text(answer) + "}"
    except _Unplanned:
        if history_from:
            answer = _trimmed(answer, history_from)
        return json.dumps(
            response_json(answer), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )


def rpc_result(
    answer: Task | Message,
    request_id: str | int,
    history_from: int = 0,
    settled: Settled | None = None,
) -> bytes:
    """``dumps`` of the SDK route's envelope of ``response_json(answer)`` (its
    ``JSONRPC20Response(result=..., _id=request_id).data``: result, id, jsonrpc), and
    ``response_json``'s error for an answer it cannot write; ``history_from`` and ``settled``
    as for ``response_text``."""
    rid = _quote(request_id) if isinstance(request_id, str) else _int_text(request_id)
    if settled is not None and settled.is_of(answer):
        # The envelope written with the task's text: one string made, not three.
        text = _settled_text(
            settled, history_from, '{"result":{"task":', '},"id":' + rid + ',"jsonrpc":"2.0"}'
        )
        if text is not None:
            return text.encode()
    text = response_text(answer, history_from, settled)
    return f'{{"result":{text},"id":{rid},"jsonrpc":"2.0"}}'.encode()


_HISTORY = Task.DESCRIPTOR.fields_by_name["history"]


def _task_text(task: Any, history_from: int) -> str:
    """``_message_text(_trimmed(task, history_from))`` without the copy: the task's own
    fields, its history from ``history_from`` on (none left: no ``history`` member, as an
    empty repeated field is not listed)."""
    fields = []
    for field, value in type(task).ListFields(task):
        if field == _HISTORY:
            value = value[history_from:]
            if not value:
                continue
        fields.append((field, value))
    return _fields_text(Task.DESCRIPTOR, fields)


def _trimmed(task: Any, history_from: int) -> Task:
    """``task`` without its history messages before ``history_from``: a copy."""
    trimmed = Task()
    trimmed.CopyFrom(task)
    del trimmed.history[:history_from]
    return trimmed


def _message_text(message: ProtoMessage) -> str:
    desc = message.DESCRIPTOR
    try:
        plan = _TEXT_PLANS[desc]
    except KeyError:
        plan = _TEXT_PLANS[desc] = _text_plan(desc)
    if plan is None:
        raise _Unplanned
    text: str = plan(message)
    return text


def _text_plan(desc: Descriptor) -> _Convert | None:
    special = _SPECIAL_TEXT.get(desc.full_name)
    if special is not None:
        return special
    if desc.file.name == "google/protobuf/wrappers.proto" or desc.full_name in _LEFT:
        return None
    names: dict[FieldDescriptor, str] = {}
    converts: dict[FieldDescriptor, _Convert] = {}
    for field in desc.fields:
        convert = _field_text(field)
        if convert is None:
            return None
        names[field] = _quote(field.json_name) + ":"
        converts[field] = convert

    def fields_text(fields: list[tuple[FieldDescriptor, Any]]) -> str:
        try:
            members = [f"{names[f]}{converts[f](value)}" for f, value in fields]
        except KeyError:
            raise _Unplanned from None  # an extension
        return "{" + ",".join(members) + "}"

    def regular(message: Any) -> str:
        # fields_text's body, not a call to it: a call more for every message written
        try:
            members = [
                f"{names[f]}{converts[f](value)}" for f, value in type(message).ListFields(message)
            ]
        except KeyError:
            raise _Unplanned from None  # an extension
        return "{" + ",".join(members) + "}"

    _FIELDS_TEXT[desc] = fields_text
    return regular


def _fields_text(desc: Descriptor, fields: list[tuple[FieldDescriptor, Any]]) -> str:
    """The text of a message of type ``desc`` whose ``ListFields`` are ``fields``."""
    if desc not in _TEXT_PLANS:
        _TEXT_PLANS[desc] = _text_plan(desc)
    writer = _FIELDS_TEXT.get(desc)
    if writer is None:
        raise _Unplanned
    return writer(fields)


def _field_text(field: FieldDescriptor) -> _Convert | None:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value = _single_text(entry.fields_by_name["value"])
        if value is None:
            return None
        return lambda mapping: (
            "{" + ",".join([f"{_quote(_map_key(k))}:{value(mapping[k])}" for k in mapping]) + "}"
        )
    single = _single_text(field)
    if single is None:
        return None
    if field.is_repeated:
        return lambda values: "[" + ",".join([single(item) for item in values[:]]) + "]"
    return single


def _single_text(field: FieldDescriptor) -> _Convert | None:
    kind = field.cpp_type
    if kind == FieldDescriptor.CPPTYPE_MESSAGE:
        # A well-known type's writer bound now (its plan is always itself); others found by
        # their type at each call (a type may hold itself).
        special = _SPECIAL_TEXT.get(field.message_type.full_name)
        return _message_text if special is None else special
    if kind == FieldDescriptor.CPPTYPE_ENUM:
        return _enum_text(field)
    if kind == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            return lambda raw: '"' + base64.b64encode(raw).decode("utf-8") + '"'
        return _quote
    if kind == FieldDescriptor.CPPTYPE_BOOL:
        return _bool_text
    if kind in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
        return lambda number: '"' + _int_text(number) + '"'
    if kind in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_UINT32):
        return _int_text
    if kind == FieldDescriptor.CPPTYPE_DOUBLE:
        return _double_text
    return None  # float: as _single


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


def _double_text(value: float) -> str:
    if _isfinite(value):
        return _float_text(value)
    return f'"{_double(value)}"'


def _enum_text(field: FieldDescriptor) -> _Convert | None:
    convert = _enum(field)
    if convert is None:
        return None
    if field.enum_type.full_name == "google.protobuf.NullValue":
        return lambda _: "null"
    texts = {
        number: _quote(value.name) for number, value in field.enum_type.values_by_number.items()
    }

    def text(number: int) -> str:
        known = texts.get(number)
        if known is not None:
            return known
        return _int_text(convert(number))  # an open enum's number; a closed one's refusal

    return text


def _value_text(value: Value, held: bool = False) -> str:
    """``value``'s JSON text; ``held``: it is a ``Struct``'s entry (``_held_struct_text``)."""
    which = _which_kind(value, "kind")
    if which == "string_value":
        return _quote(value.string_value)
    if which == "number_value":
        number = value.number_value
        if not _isfinite(number):
            raise _Unplanned  # MessageToDict's error
        return _float_text(number)
    if which == "struct_value":
        struct = value.struct_value
        return _held_struct_text(struct) if held else _struct_text(struct)
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "list_value":
        return _list_text(value.list_value)
    return "null"


def _struct_text(struct: Struct) -> str:
    fields = struct.fields
    return (
        "{" + ",".join([f"{_quote(key)}:{_value_text(fields[key], True)}" for key in fields]) + "}"
    )


#: Texts of ``Struct``s held in a ``Struct``'s entry, by their bytes (``_held_struct_text``).
_HELD: dict[bytes, str] = {}
#: Most texts kept (then all are dropped), and the largest ``Struct`` kept, in bytes.
_MAX_HELD = 128
_MAX_HELD_BYTES = 512


def _held_struct_text(struct: Struct) -> str:
    """``_struct_text(struct)`` of a ``Struct`` held in another's entry, such as a task's
    metadata holds its usage counts (the same zeros in every function skill's task) and its
    children's: looked up by its bytes, a C call, instead of walked (a wrapper object per
    value, ~35,000 instructions for five counts). The same bytes are the same text: a map's
    entries are serialized in the order they are iterated, which is the order written."""
    data = struct.SerializeToString()
    text = _HELD.get(data)
    if text is None:
        text = _struct_text(struct)  # or its refusal (a NaN), not kept
        if len(data) <= _MAX_HELD_BYTES:
            if len(_HELD) >= _MAX_HELD:
                _HELD.clear()
            _HELD[data] = text
    return text


def _list_text(values: ListValue) -> str:
    return "[" + ",".join([_value_text(value) for value in values.values[:]]) + "]"


def _text_text(message: Any) -> str:
    return _quote(message.ToJsonString())


#: The last second a timestamp was written in, and its date text: answers written within one
#: second share it (``Timestamp.ToJsonString`` builds a ``datetime`` for each).
_second: tuple[int, str] = (0, "1970-01-01T00:00:00")


def _timestamp_text(stamp: Any) -> str:
    """``_text_text(stamp)``: the second's text remembered, the fraction as it writes it."""
    seconds, nanos = stamp.seconds, stamp.nanos
    if not 0 <= nanos < 1_000_000_000:
        return _text_text(stamp)  # its error
    return _stamp_text(seconds, nanos)


def _stamp_text(seconds: int, nanos: int) -> str:
    """A ``Timestamp``'s text given its fields (``nanos`` in range)."""
    global _second
    if seconds != _second[0]:
        whole = Timestamp(seconds=seconds).ToJsonString()  # "...Z", or its error
        _second = (seconds, whole[:-1])
    date = _second[1]
    if nanos == 0:
        return f'"{date}Z"'
    if nanos % 1_000_000 == 0:
        return f'"{date}.{nanos // 1_000_000:03d}Z"'
    if nanos % 1000 == 0:
        return f'"{date}.{nanos // 1000:06d}Z"'
    return f'"{date}.{nanos:09d}Z"'


_SPECIAL_TEXT: dict[str, _Convert] = {
    "google.protobuf.Value": _value_text,
    "google.protobuf.Struct": _struct_text,
    "google.protobuf.ListValue": _list_text,
    "google.protobuf.Timestamp": _timestamp_text,
    "google.protobuf.Duration": _text_text,
    "google.protobuf.FieldMask": _text_text,
}


# --- writing a settled task from its values ---------------------------------------------------
#
# A function skill's task on the fast path is built at once from a few plain values
# (``mesh._a2a.one_shot``: its ids, its final state and time, its answer artifact made of the
# result's dict and that dict's JSON text, its metadata's dict). Walking the built task back
# to write the answer's JSON costs a wrapper object per message and per value read; written
# from those values instead, it is the same text. Only the order of a ``Struct``'s members is
# not in the values: protobuf's map keeps the order of its hash table, which depends on the
# keys, the order they were set in and how many times the map was copied since (each copy
# re-inserts them). Within one process that is the same for the same keys built the same
# way, so the order is read from the first task built of each key set and kept (the
# ``_ORDERS``): a flat answer's keys, a metadata's shape (``one_shot._shape``: its keys, its
# strings, its zero token counts, whose text is kept with it).

#: Key of ``ServerCallContext.state``: the ``Settled`` of the call's task, when it has one.
SETTLED = "mesh.settled"
#: Key of ``ServerCallContext.state``: True when the caller writes the answer from the call's
#: ``Settled`` (``FastRoute``): ``FastPath.send`` answers with its stand-in when it has one.
WRITES_SETTLED = "mesh.writes_settled"


@dataclass(frozen=True)
class Settled:
    """A held run's final task and the values it was built from (``one_shot``), in the one
    shape ``_settled_text`` writes: a terminal status without a message, at ``at_ns``; one
    artifact, a typed answer (``artifacts.AnswerParts`` of a flat dict); the metadata of one
    status update, of a known ``shape``.

    The task is ``parsed``, or (None) parsed from ``row`` when first read (``task``): the
    fast route's answer and the stored row are written from the values and the bytes, so a
    task nobody reads is never made (a parse: ~24,000 instructions a request). Until then
    ``stand_in`` stands for it where only its id and state are read (the store's save, the
    answer handed back to the route: ``is_of``)."""

    parsed: Task | None
    task_id: str
    context_id: str
    state: int
    at_ns: int
    artifact_id: str
    name: str
    data: dict[str, Any]
    text: str
    metadata: dict[str, Any]
    shape: tuple[Any, ...]
    #: ``task``'s bytes when it was parsed from them (``one_shot._task_wire``): its row.
    row: bytes | None = None
    #: Its history as held (``one_shot``'s list of it): an ``AgentText`` is written from its
    #: values, any other entry read from ``task``. Empty: every entry read from ``task``.
    history: Sequence[Any] = ()
    #: A new empty task, while ``parsed`` is None: what is handed on instead of the task
    #: (``is_of``) to whoever reads its id and state from here (the store's save, the watch
    #: around it) or writes the answer from here (``FastRoute``).
    stand_in: Task | None = None

    @property
    def task(self) -> Task:
        """The task: ``parsed``, or ``row`` parsed now (once)."""
        task = self.parsed
        if task is None:
            assert self.row is not None
            task = Task.FromString(self.row)
            object.__setattr__(self, "parsed", task)
        return task

    def is_of(self, answer: object) -> bool:
        """Whether ``answer`` is this task (or its stand-in), without parsing it."""
        return answer is self.stand_in or (answer is self.parsed and answer is not None)


@dataclass(frozen=True)
class AgentText:
    """An agent message of one text part held as its fields (``one_shot._AgentText``): what
    ``new_agent_message([new_text_part(text)])`` makes of them."""

    message_id: str
    task_id: str
    context_id: str
    text: str


#: A settled answer's template (``_settled_plan``) by its layout: its state, the answer's keys
#: in the dict's order, the metadata's shape, and which of its ids are set.
_SETTLED_PLANS: dict[tuple[Any, ...], tuple[str, list[str], list[str]]] = {}
#: Most layouts kept (a node's skills make a few); past it, the task is walked.
_MAX_ORDERS = 256
#: Most keys, and characters of keys, of a flat answer whose order is kept: an answer whose
#: keys come from its caller (a ``dict[str, float]`` echoed back) must not pin 256 request
#: bodies' worth of keys (a kept order holds its keys twice: as they are and quoted).
_MAX_KEYS = 64
_MAX_KEY_CHARS = 4096
_STATE_FIELD = TaskStatus.DESCRIPTOR.fields_by_name["state"]
#: The status state's writer (None: enums carry JSON names of their own; 0: not made yet).
_state_text: _Convert | int | None = 0


def _settled_text(settled: Settled, history_from: int, before: str, after: str) -> str | None:
    """``before + _task_text(settled.task, history_from) + after`` written from ``settled``'s
    values (``before`` and ``after``: the answer's envelope); None when a key set is new and
    cannot be kept, or a value is one the walk refuses. The text around the values is a
    template kept by their layout (``_settled_plan``): filling it in is one ``%``, not a
    concatenation and a join per member and two more for the envelope (``rpc_result`` of a
    typed answer ~51,000 -> ~40,000 instructions)."""
    global _state_text
    if _state_text == 0:
        _state_text = _enum_text(_STATE_FIELD)
    if not callable(_state_text) or not settled.state:
        return None
    data = settled.data
    layout = (
        settled.state,
        tuple(data),
        settled.shape,
        bool(settled.task_id),
        bool(settled.context_id),
        bool(settled.artifact_id),
        bool(settled.name),
    )
    plan = _SETTLED_PLANS.get(layout)
    if plan is None:
        plan = _settled_plan(settled, layout)
        if plan is None:
            return None
    template, data_keys, metadata_keys = plan
    values = [before]
    if settled.task_id:
        values.append(_quote(settled.task_id))
    if settled.context_id:
        values.append(_quote(settled.context_id))
    seconds, nanos = divmod(settled.at_ns, 1_000_000_000)
    values.append(_stamp_text(seconds, nanos))
    if settled.artifact_id:
        values.append(_quote(settled.artifact_id))
    if settled.name:
        values.append(_quote(settled.name))
    for key in data_keys:
        value = data[key]
        kind = type(value)
        if kind is str:
            values.append(_quote(value))
        elif kind is bool:
            values.append("true" if value else "false")
        elif value is None:
            values.append("null")
        else:
            try:
                number = float(value)
            except OverflowError:
                return None
            if not _isfinite(number):
                return None  # the walk's refusal
            values.append(_float_text(number))
    values.append(_quote(settled.text))
    # None of the history asked for (historyLength 0, mesh's own calls): nothing read.
    values.append(
        "" if 0 < len(settled.history) <= history_from else _history_text(settled, history_from)
    )
    metadata = settled.metadata
    for key in metadata_keys:
        values.append(_quote(metadata[key]))
    values.append(after)
    return template % tuple(values)


def _history_text(settled: Settled, history_from: int) -> str:
    """The answer's ``"history"`` member (after a comma; "" for none): the task's history from
    ``history_from`` on, each held agent text message written from its values (a template
    filled in) rather than walked (the task's history read, a wrapper per message and part,
    each ``ListFields``); any other message, or one the template does not write, walked."""
    held = settled.history
    if not held:
        messages = settled.task.history[history_from:]
        if not messages:
            return ""
        return ',"history":[' + ",".join([_message_text(m) for m in messages]) + "]"
    texts: list[str] = []
    task_history = None
    for i in range(len(held))[history_from:]:
        entry = held[i]
        text = _agent_text(entry) if isinstance(entry, AgentText) else None
        if text is None:
            if task_history is None:
                task_history = settled.task.history
            text = _message_text(task_history[i])
        texts.append(text)
    if not texts:
        return ""
    return ',"history":[' + ",".join(texts) + "]"


def _agent_text(message: AgentText) -> str | None:
    """``_message_text`` of the message ``message`` holds, from its values; None for one the
    template does not write (an empty id: the walk leaves its member out)."""
    global _agent_template
    if not (message.message_id and message.task_id and message.context_id):
        return None
    if _agent_template is None:
        _agent_template = _agent_text_template()
    if not _agent_template:
        return None
    return _agent_template % (
        _quote(message.message_id),
        _quote(message.context_id),
        _quote(message.task_id),
        _quote(message.text),
    )


def _agent_text_template() -> str:
    """The walk's text of an agent text message with a ``%s`` for its message id, context id,
    task id and text, in that order: the walk's own text of such a message of marker values,
    each marker's quoted text replaced. "" when the walk writes them in another order."""
    markers = [_quote(marker) for marker in ("\x00m", "\x00c", "\x00t", "\x00x")]
    text = _message_text(
        Message(
            message_id="\x00m",
            context_id="\x00c",
            task_id="\x00t",
            role=Role.ROLE_AGENT,
            parts=[Part(text="\x00x")],
        )
    )
    at = [text.find(marker) for marker in markers]
    if min(at) < 0 or at != sorted(at) or any(text.count(marker) != 1 for marker in markers):
        return ""
    text = text.replace("%", "%%")
    for marker in markers:
        text = text.replace(marker, "%s")
    return text


#: ``_agent_text_template()``, made at the first use ("": the walk writes each message).
_agent_template: str | None = None


def _settled_plan(
    settled: Settled, layout: tuple[Any, ...]
) -> tuple[str, list[str], list[str]] | None:
    """The template of a settled answer of ``layout`` (its state, answer keys, metadata shape
    and which ids it has): the task's text with a ``%s`` for each value, in the order
    ``_settled_text`` fills them; the answer's keys and the metadata's string keys in the
    built task's order (a ``Struct``'s member order is its hash table's). None when no more
    layouts are kept, or the answer's keys are too many to keep."""
    keys = layout[1]
    if (
        len(_SETTLED_PLANS) >= _MAX_ORDERS
        or len(keys) > _MAX_KEYS
        or sum(map(len, keys)) > _MAX_KEY_CHARS
    ):
        return None
    assert callable(_state_text)
    task = settled.task
    data_keys = list(task.artifacts[0].parts[0].data.struct_value.fields)
    fields = task.metadata.fields
    metadata = settled.metadata
    metadata_keys = [key for key in fields if type(metadata[key]) is str]

    def literal(text: str) -> str:
        return text.replace("%", "%%")

    members = []
    if settled.task_id:
        members.append('"id":%s')
    if settled.context_id:
        members.append('"contextId":%s')
    members.append(f'"status":{{"state":{literal(_state_text(settled.state))},"timestamp":%s}}')
    artifact = ['"artifactId":%s'] if settled.artifact_id else []
    if settled.name:
        artifact.append('"name":%s')
    data_text = ",".join([literal(_quote(key)) + ":%s" for key in data_keys])
    artifact.append(
        f'"parts":[{{"data":{{{data_text}}},"mediaType":"application/json"}},'
        '{"text":%s,"mediaType":"text/plain"}]'
    )
    members.append('"artifacts":[{' + ",".join(artifact) + "}]%s")
    metadata_text = ",".join(
        [
            literal(_quote(key))
            + ":"
            + ("%s" if type(metadata[key]) is str else literal(_value_text(fields[key], True)))
            for key in fields
        ]
    )
    members.append('"metadata":{' + metadata_text + "}")
    plan = ("%s{" + ",".join(members) + "}%s", data_keys, metadata_keys)
    _SETTLED_PLANS[layout] = plan
    return plan
