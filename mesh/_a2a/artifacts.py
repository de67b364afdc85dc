"""Artifacts on the wire: a task's answer (streamed in chunks), its attachments, and the media
types a skill takes.

**The answer** of a task is one artifact named after the skill. A typed result is its data
part (``application/json``) and the same JSON as a text part (``text/plain``), so a client that
reads text only (ADK's ``AgentTool``) gets the answer too. While someone follows the task, the
text a model writes arrives as chunks of that artifact (``AnswerStream``), the convention ADK
uses on both sides::

    artifactUpdate {artifactId: A, parts: [{text: "The ra"}],  append: false, lastChunk: false}
    artifactUpdate {artifactId: A, parts: [{text: "te is"}],   append: true,  lastChunk: false}
    artifactUpdate {artifactId: A, parts: [{text: "The rate is 1.08."}], append: false, lastChunk: true}

The last chunk replaces the artifact whole, so the stored task holds the answer as one part and
a client that missed chunks (a subscription opened mid-turn) still ends with all of it.

**Attachments** (``ctx.attach``, ``mesh._artifacts``) are one artifact each, published whole.

**Media types** (``media_type``, ``accepted``): a part's type is its ``mediaType``, else what its
kind implies (text ``text/plain``, data ``application/json``, a file
``application/octet-stream``); a skill's ``input_modes`` may name ``type/*``. Any ``text/*``
is text, any ``*+json`` JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pydantic_core
from a2a.helpers import new_data_part, new_text_part
from a2a.types import Part

from mesh._a2a.fastpath_json import data_part
from mesh._artifacts import Artifact, File

if TYPE_CHECKING:
    from a2a.server.tasks import TaskUpdater

__all__ = [
    "AnswerParts",
    "AnswerStream",
    "answer_parts",
    "artifact_parts",
    "files_of",
    "media_type",
    "refused_types",
]

_JSON = "application/json"
_TEXT = "text/plain"
_OCTETS = "application/octet-stream"


class AnswerParts(list[Part]):
    """A typed answer's two parts (``answer_parts``) and what they were made of, for a writer
    of the answer's JSON that does not walk them back (``fastpath_json.Settled``): ``data``,
    the result's dict when it is flat (str keys; str, int, float, bool or None values: what
    ``data_part`` builds without ``ParseDict``), else None; ``text``, its JSON text."""

    data: dict[str, Any] | None = None
    text: str = ""


def answer_parts(data: dict[str, Any] | None, text: str, *, typed: bool) -> list[Part]:
    """The parts of an answer: a typed result's data part and its JSON text (one dump of the
    dict the output model's validation made; no second validation), or chat's text."""
    if not typed:
        return [new_text_part(text, media_type=_TEXT)]
    value = data or {}
    rendered = pydantic_core.to_json(value).decode()
    parts = AnswerParts(
        (data_part(value, media_type=_JSON), new_text_part(rendered, media_type=_TEXT))
    )
    parts.data = value if _flat(value) else None
    parts.text = rendered
    return parts


#: The value types of a flat answer (exact types: a subclass may convert otherwise).
_FLAT = frozenset({str, int, float, bool, type(None)})


def _flat(value: Any) -> bool:
    return type(value) is dict and all(
        type(key) is str and type(item) in _FLAT for key, item in value.items()
    )


def _part(value: Any) -> Part:
    if isinstance(value, str):
        return new_text_part(value, media_type=_TEXT)
    if isinstance(value, File):
        part = Part(media_type=value.media_type, filename=value.name)
        if value.data is not None:
            part.raw = bytes(value.data)
        else:
            part.url = value.url or ""
        return part
    return new_data_part(value, media_type=_JSON)


def artifact_parts(artifact: Artifact) -> list[Part]:
    """An attachment's parts as protobuf."""
    return [_part(p) for p in artifact.parts]


def media_type(part: Part) -> str:
    """What a part is, as a media type (its own, else what its kind implies)."""
    if part.media_type:
        return part.media_type.split(";", 1)[0].strip().lower()
    kind = part.WhichOneof("content")
    return _TEXT if kind == "text" else _JSON if kind == "data" else _OCTETS


def _accepted(mode: str, modes: Iterable[str]) -> bool:
    for accepted in modes:
        if accepted in (mode, "*/*"):
            return True
        if accepted.endswith("/*") and mode.startswith(accepted[:-1]):
            return True
        # Text in another flavour (markdown, csv) is still text to a skill that reads text;
        # JSON under a vendor type (application/vnd.x+json) still JSON to one that reads JSON.
        if accepted == _TEXT and mode.startswith("text/"):
            return True
        if accepted == _JSON and mode.endswith("+json"):
            return True
    return False


def refused_types(types: Iterable[str], modes: Iterable[str]) -> list[str]:
    """The media types among ``types`` (parts' ``media_type``) that ``modes`` do not accept
    (none: all taken)."""
    wanted = list(modes)
    return sorted({m for m in types if not _accepted(m, wanted)})


def files_of(parts: Iterable[Part], modes: Iterable[str]) -> list[File]:
    """The file parts (bytes or URL) among ``parts`` of a type ``modes`` accept."""
    wanted = list(modes)
    found = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind not in ("raw", "url") or not _accepted(media_type(part), wanted):
            continue
        data = bytes(part.raw) if kind == "raw" else None
        found.append(
            File(
                data=data,
                url=part.url if kind == "url" else None,
                media_type=media_type(part),
                name=part.filename,
            )
        )
    return found


class AnswerStream:
    """The answer artifact of one run: model text as chunks while someone follows the task
    (``live()``), then the whole answer as the last chunk (see the module docstring)."""

    def __init__(self, updater: TaskUpdater, name: str, live: Callable[[], bool]) -> None:
        self.updater = updater
        self.name = name
        self.live = live
        # One id per task: a run resumed after a wait replaces what the first run streamed.
        self.artifact_id = f"answer-{updater.task_id}"
        self._started = False

    async def chunk(self, text: str) -> None:
        """One more piece of the answer's text (nothing when nobody follows)."""
        if not text or not self.live():
            return
        await self.updater.add_artifact(
            [new_text_part(text)],
            artifact_id=self.artifact_id,
            name=self.name,
            append=self._started,
            last_chunk=False,
        )
        self._started = True

    async def close(self, parts: list[Part]) -> None:
        """The whole answer: the last chunk, replacing what was streamed."""
        await self.updater.add_artifact(
            parts, artifact_id=self.artifact_id, name=self.name, append=False, last_chunk=True
        )
