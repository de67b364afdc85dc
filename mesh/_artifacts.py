"""What an agent hands back besides its answer: files, data, named artifacts.

A skill or a tool *attaches* what it made; the node publishes each attachment as one named
A2A artifact of the task, next to the answer's own artifact::

    @skill
    async def render(req: ChartRequest, ctx: SkillContext) -> ChartSummary:
        "Draw the chart and sum it up."
        png = draw(req)
        ctx.attach(File(png, media_type="image/png", name="chart.png"))
        return ChartSummary(points=len(req.points))

    @tool
    def fetch_rates(day: str, ctx: ToolContext) -> dict:
        "Today's rates."
        rates = {"EUR/USD": 1.08}
        ctx.attach(rates, name="rates")            # a data part: a chat answer carrying data
        return rates

A part is text (``str``), JSON data (a dict, a list or a pydantic model: a data part
``application/json``) or a ``File`` (bytes with a media type and a file name, or a URL). A
caller reads them back as ``TaskResult.artifacts``.
"""

from __future__ import annotations

import base64
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from mesh._errors import ConfigError

__all__ = ["ATTACHMENTS", "Artifact", "File", "PartValue", "attach_to"]

#: Key of a turn's metadata (``SkillContext.metadata``, ``ToolContext.metadata``): the list
#: the run's attachments go to.
ATTACHMENTS = "attachments"


@dataclass(frozen=True)
class File:
    """A file part: ``data`` (bytes, sent base64 in JSON) or ``url`` (the caller fetches it),
    with its ``media_type`` and a file ``name``::

        File(pdf_bytes, media_type="application/pdf", name="offer.pdf")
        File(url="https://files.example/offer.pdf", media_type="application/pdf")
    """

    data: bytes | None = None
    url: str | None = None
    media_type: str = "application/octet-stream"
    name: str = ""

    def __post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise ConfigError("File: give either data (bytes) or url, not both or neither")
        if self.data is not None and not isinstance(self.data, bytes | bytearray):
            raise ConfigError(f"File(data=...) takes bytes, got {type(self.data).__name__}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"File(url=...) takes an http(s) URL, got {self.url[:80]!r}")
        if "/" not in self.media_type:
            raise ConfigError(
                f"File: media_type must be a MIME type such as 'image/png', got {self.media_type!r}"
            )

    @property
    def base64(self) -> str:
        """The bytes as the JSON wire carries them ('' for a URL)."""
        return base64.b64encode(self.data).decode() if self.data is not None else ""


#: What one part of an artifact may be.
PartValue = str | dict[str, Any] | list[Any] | BaseModel | File


@dataclass(frozen=True)
class Artifact:
    """One named output of a task: its ``parts`` in order (text, JSON data, ``File``)."""

    name: str
    parts: tuple[Any, ...]
    description: str = ""

    @property
    def files(self) -> list[File]:
        return [p for p in self.parts if isinstance(p, File)]

    @property
    def text(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def data(self) -> Any:
        """The first JSON part (None without one)."""
        return next((p for p in self.parts if not isinstance(p, str | File)), None)


def _check_part(part: Any) -> Any:
    if isinstance(part, BaseModel):
        return part.model_dump(mode="json")
    if isinstance(part, str | dict | list | File):
        return part
    raise ConfigError(
        f"attach: a part is text (str), JSON data (dict, list, pydantic model) or File, "
        f"got {type(part).__name__}"
    )


def attach_to(
    sink: MutableSequence[Artifact] | None,
    parts: Sequence[Any],
    name: str,
    description: str,
) -> Artifact:
    """Append the artifact of ``parts`` to ``sink`` (a run's attachments) and return it. An
    artifact without a name takes its first file's, else ``attachment-N``."""
    if not parts:
        raise ConfigError("attach: give at least one part (text, JSON data or File)")
    checked = tuple(_check_part(p) for p in parts)
    if sink is None:
        raise ConfigError("attach: this context belongs to no run that publishes artifacts")
    if not name:
        files = [p for p in checked if isinstance(p, File) and p.name]
        name = files[0].name if files else f"attachment-{len(sink) + 1}"
    artifact = Artifact(name=name, parts=checked, description=description)
    sink.append(artifact)
    return artifact
