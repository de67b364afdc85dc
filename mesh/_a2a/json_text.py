"""A typed skill's input sent as text: the JSON object a text-only client writes in a text part.

Clients that send text only (Google ADK's ``RemoteA2aAgent`` and ``AgentTool``, a chat UI, curl)
reach a typed skill with its input as JSON in a text part instead of a data part. What counts:

* the request's text is ONE part: a text part, or ADK's convention for JSON, an ``inline_data``
  blob of type ``text/plain`` (a ``raw`` part on the wire) wrapped in
  ``<a2a_datapart_json>...</a2a_datapart_json>`` (the wrapping is also taken in a text part);
  the part's content, stripped (and out of a Markdown code fence), is a JSON object;
* ADK's context is left out: when parts carry ADK's part metadata ``is_user_input: true``, the
  request is the LAST such part (ADK sends the user's turns since the agent last answered; the
  last one is the request), and a text part starting ``For context:`` (what ADK adds about
  other agents' turns, reached by transfer) is never the request.

``json_object(parts)`` returns what a message holds: nothing of the kind (None), the object, or
why the text is not one (a typed skill's rejection says so). Cheap for chat text: a part that
does not start with ``{`` (or the wrapping) is never parsed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from a2a.types import Part
from google.protobuf.json_format import MessageToDict

__all__ = ["ADK_JSON_END", "ADK_JSON_START", "JsonText", "json_object"]

ADK_JSON_START = "<a2a_datapart_json>"
ADK_JSON_END = "</a2a_datapart_json>"
#: ADK's part metadata marking what its user typed (its other text parts are context).
_USER_INPUT = "is_user_input"
_CONTEXT_PREFIX = "For context:"
_TEXT_MEDIA = ("", "text/plain")


@dataclass(frozen=True)
class JsonText:
    """The request's text: the JSON object it holds (``value``) or why it holds none
    (``problem``, for the rejection of a typed skill)."""

    value: dict[str, Any] | None = None
    problem: str = ""


def json_object(parts: Sequence[Part]) -> JsonText | None:
    """The JSON object the text of ``parts`` holds (see the module docstring); None when the
    text does not even look like one (chat text, or no text)."""
    texts = _request_texts(parts)
    if not texts:
        return None
    looks = [t for t in texts if _looks_like_object(t)]
    if not looks:
        return None
    if len(texts) > 1:
        return JsonText(
            problem=f"the message has {len(texts)} text parts: send the JSON object as the "
            "only one (or as a data part)"
        )
    return _parse(looks[0])


def _request_texts(parts: Sequence[Part]) -> list[str]:
    """The texts that may be the request: every text (or ADK-wrapped) part but ADK's context."""
    found: list[tuple[str, bool]] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            text = part.text
        elif kind == "raw" and part.media_type in _TEXT_MEDIA:
            if not part.raw.startswith(ADK_JSON_START.encode()):
                continue
            try:
                text = part.raw.decode()
            except UnicodeDecodeError:
                continue
        else:
            continue
        if text.lstrip().startswith(_CONTEXT_PREFIX):
            continue
        found.append((text, _user_input(part)))
    flagged = [text for text, user in found if user]
    if flagged:
        return flagged[-1:]
    return [text for text, _ in found]


def _user_input(part: Part) -> bool:
    if not part.HasField("metadata") or _USER_INPUT not in part.metadata:
        return False
    return MessageToDict(part.metadata).get(_USER_INPUT) is True


def _unwrap(text: str) -> str:
    body = text.strip()
    if body.startswith(ADK_JSON_START) and body.endswith(ADK_JSON_END):
        return body[len(ADK_JSON_START) : -len(ADK_JSON_END)].strip()
    if body.startswith("```") and body.endswith("```"):
        body = body[3:-3].strip()
        return body.removeprefix("json").strip()
    return body


def _looks_like_object(text: str) -> bool:
    return _unwrap(text).startswith("{")


def _parse(text: str) -> JsonText:
    try:
        value = json.loads(_unwrap(text))
    except ValueError as exc:
        return JsonText(problem=f"the text is not a JSON object ({exc})")
    if not isinstance(value, dict):
        return JsonText(problem="the text is not a JSON object")
    # ADK on a2a-sdk 0.3 wraps a whole DataPart, not just its data.
    inner = value.get("data")
    if value.get("kind") == "data" and isinstance(inner, dict) and set(value) <= _DATA_PART_KEYS:
        return JsonText(value=inner)
    return JsonText(value=value)


_DATA_PART_KEYS = {"kind", "data", "metadata"}
