"""The keys a node writes into task and message metadata, in A2A's JSON naming (camelCase).

A2A's JSON form names every field in camelCase (``contextId``, ``lastChunk``); what mesh adds
to ``metadata`` follows it, so a client sees one naming on the whole task::

    {"skill": "score", "caller": "loan-officer", "callerTask": "T-1",
     "usage": {"inputTokens": 812, "outputTokens": 64, "cachedTokens": 0,
               "thinkingTokens": 0, "totalTokens": 876},
     "childrenUsage": {"inputTokens": 120, ...}}

Nodes before this naming wrote ``caller_task``, ``children_usage`` and ``input_tokens``; their
tasks stay on disk after an upgrade in place, and a peer not upgraded yet still sends them. So
every reader goes through ``read`` and ``usage_counts``, which take either spelling (and give
the camelCase one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mesh._types import Usage

__all__ = [
    "ARTIFACT_ID",
    "CALLER_TASK",
    "CHILDREN_USAGE",
    "LAST_CHUNK",
    "TOOL_CALLS",
    "USAGE",
    "read",
    "total_tokens",
    "usage_counts",
    "usage_json",
]

#: The task above this one in a chain (message metadata of a delegation, kept on the task).
CALLER_TASK = "callerTask"
#: Token usage of the task's own model turns (``usage_json``).
USAGE = "usage"
#: Token usage its delegations reported (theirs plus their children's), added up by kind.
CHILDREN_USAGE = "childrenUsage"
#: A WORKING status message's metadata: the message says which tools the turn calls.
TOOL_CALLS = "toolCalls"
#: A relayed artifact chunk's tag (``mesh._a2a.relay``): the child's artifact and last chunk.
ARTIFACT_ID = "artifactId"
LAST_CHUNK = "lastChunk"

# The snake_case spelling of nodes before (read only).
_LEGACY = {
    CALLER_TASK: "caller_task",
    CHILDREN_USAGE: "children_usage",
    TOOL_CALLS: "tool_calls",
    ARTIFACT_ID: "artifact_id",
    LAST_CHUNK: "last_chunk",
}
_SNAKE = re.compile(r"_([a-z])")


def _camel(name: str) -> str:
    if "_" not in name:  # camelCase already (every node's since): no regex call per key
        return name
    return _SNAKE.sub(lambda m: m.group(1).upper(), name)


def read(metadata: Mapping[str, Any], key: str) -> Any:
    """``metadata[key]``, or its snake_case spelling from an older node; None without either."""
    value = metadata.get(key)
    if value is None and key in _LEGACY:
        value = metadata.get(_LEGACY[key])
    return value


def usage_json(usage: Usage) -> dict[str, int]:
    """``usage`` as written into task metadata (``{"inputTokens": ..., ...}``): its fields in
    their order, as ``as_dict`` gives them (a frozen model of ints, extra fields forbidden),
    each name turned camelCase once, not per task."""
    return {camel: getattr(usage, name) for name, camel in _USAGE_KEYS}


def usage_counts(value: Any) -> dict[str, int]:
    """Token counts by kind, in camelCase, from a usage mapping of either spelling (anything
    that is not one gives ``{}``)."""
    # Exact types first (a parsed answer's): the ABC's and the union's checks cost far more,
    # and every delegation reads two of these.
    if type(value) is not dict and not isinstance(value, Mapping):
        return {}
    counts: dict[str, int] = {}
    for name, count in value.items():
        kind = type(count)
        if kind is int or kind is float or (kind is not bool and isinstance(count, int | float)):
            key = name if type(name) is str and "_" not in name else _camel(str(name))
            counts[key] = counts.get(key, 0) + int(count)
    return counts


def total_tokens(counts: Mapping[str, int]) -> int:
    """The total of ``usage_counts``: ``totalTokens`` when reported, else input plus output."""
    return counts.get("totalTokens") or counts.get("inputTokens", 0) + counts.get("outputTokens", 0)


#: ``Usage``'s fields and their camelCase names (``usage_json``).
_USAGE_KEYS = tuple((name, _camel(name)) for name in Usage.model_fields)
