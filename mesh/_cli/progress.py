"""How ``mesh call --stream`` and ``mesh chat`` show progress relayed from other agents.

A node whose task is streamed relays the progress of the tasks it delegates to (see
``mesh._a2a.relay``), tagged with the hops it came through. Each relayed event is one line,
indented two spaces per hop and naming the agent where it happened::

    [working] calling ask_stream_middle                       (mesh call --stream)
      stream-middle: [working] calling stream_bottom_report
        stream-bottom: [working] step 1 of 3

      … calling ask_stream_middle                             (mesh chat)
        … stream-middle: calling stream_bottom_report
          … stream-bottom: step 1 of 3

Relayed partial text (a model's answer as it is written, three hops down) is not shown: it
reaches the caller as the delegation's result, and a line per chunk would flood the terminal.

What a task attached besides its answer (``ctx.attach``) is one line each (``attached_lines``)::

    attached: chart.png (image/png, 72 bytes)
    attached: range (data {"max": 4.0, "min": 1.5})
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mesh._a2a.results import TaskResult, TaskUpdate

__all__ = ["attached_lines", "chat_progress_line", "relayed_line", "turn_answer"]

# The longest line shown for one relayed event (an artifact's JSON can be large).
_MAX_CHARS = 160


def relayed_line(update: TaskUpdate, *, state: bool = True, mark: str = "") -> str | None:
    """The line for a relayed event, None for any other (and for relayed partial text).
    ``state``: say the source's state (``[working]``), as ``mesh call --stream`` does;
    ``mark`` goes before the agent's name (``mesh chat``'s ``… ``)."""
    hops = update.hops
    relay = update.relay
    if not hops or relay is None or relay.get("partial"):
        return None
    source = str(hops[-1].get("agent") or "?")
    if relay.get("kind") == "artifact":
        shown = update.text or (json.dumps(update.data) if update.data is not None else "")
        what = f"artifact: {shown}"
    else:
        what = update.text
        if state:
            name = str(relay.get("state") or "")
            what = f"[{name.removeprefix('TASK_STATE_').lower().replace('_', '-')}] {what}"
    what = " ".join(what.split())
    if len(what) > _MAX_CHARS:
        what = what[: _MAX_CHARS - 1] + "…"
    return f"{'  ' * len(hops)}{mark}{source}: {what}"


def chat_progress_line(update: TaskUpdate) -> str | None:
    """The progress line ``mesh chat`` (and the registry's chat page) shows for a streamed
    event: a call the agent makes (its own ``calling …`` status) or another agent's progress
    relayed up, indented per hop; None for any other event (partial text is the caller's to
    show as it comes, the answer is ``turn_answer``'s)."""
    if update.relay is not None:  # another agent's progress, a hop or more down
        line = relayed_line(update, state=False, mark="… ")
        return None if line is None else f"  {line}"
    if update.kind == "status" and update.text.startswith("calling "):
        return f"  … {update.text}"
    return None


def turn_answer(result: TaskResult, streamed: str = "") -> str:
    """What a chat shows for the task a turn ended with (not a waiting one): its data as JSON,
    its text unless ``streamed`` showed it already (then ""), or why it ended, in brackets."""
    if result.ok:
        if result.data is not None:
            return json.dumps(result.data)
        return result.text if result.text.strip() != streamed.strip() else ""
    error = result.error or {}
    return f"({result.state}: {error.get('message', result.text)})"


def attached_lines(result: TaskResult) -> list[str]:
    """One line per artifact of ``result`` besides its answer (the artifact named after the
    skill): its name, and its files (media type, size or URL), data and text, cut to a line."""
    from mesh._artifacts import File

    skill = result.metadata.get("skill")
    lines = []
    for artifact in result.artifacts:
        if skill and artifact.name == skill:
            continue
        said = []
        for part in artifact.parts:
            if isinstance(part, File):
                size = f"{len(part.data)} bytes" if part.data is not None else part.url
                said.append(f"{part.media_type}, {size}")
            elif isinstance(part, str):
                said.append(f"text {json.dumps(part)}")
            else:
                said.append(f"data {json.dumps(part, sort_keys=True)}")
        line = f"attached: {artifact.name} ({'; '.join(said)})"
        lines.append(line if len(line) <= _MAX_CHARS else line[: _MAX_CHARS - 1] + "…")
    return lines
