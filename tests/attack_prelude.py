"""The helpers a two-tree attack driver opens with, as source text.

A driver (tests/test_attack_s34.py to s37's ``_*_DRIVER``) is Python source run by
``python -c`` in each of two trees, this checkout and a ``git archive`` of an older commit,
with PYTHONPATH that tree and the working directory a temporary one: it imports ``mesh`` and
``tests.support`` from the tree it runs in, and an older tree has no module of this one. So the
helpers travel as text: ``prelude(...) + r'''...'''`` is the driver.

What a prelude defines (each driver keeps only what is its own):

* ``IDS``, ``TIMES``, ``TRACES``: ids (uuids, 32 hex digits, and the driver's ``ids``), ISO
  times, W3C traceparents; ``scrub(text)`` replaces them in that order: traces first (a trace
  id is 32 hex digits an id would take), then times, then ids. A driver that replaced fewer
  (``traces=False``, ``times=False``) still does: a narrower scrub stays narrower, so it cannot
  hide a difference it would have shown.
* ``parsed(text)``: its JSON, else the text; ``canon(text)``: ``parsed(scrub(text))``, the
  drivers' usual, which a driver redefines where its own differs (``Logs`` calls whichever
  ``canon`` the driver's module holds when a record comes).
* ``RUNS`` / ``counted_runs``, ``sorted_texts``, ``sorted_json``: what several drivers' own
  ``canon`` made of long letter runs and JSON held in texts.
* ``Logs``: a handler keeping mesh's records as ``[level, logger, canon(message)]``;
  ``quiet=True`` (or ``quieted(source)``) leaves out ``mesh.sqlite``'s.
"""

from __future__ import annotations

#: Ids of 16 hex digits (span ids, request ids in log lines) that some drivers replace too.
SPAN_IDS = r"[0-9a-f]{16}"
#: A question's id (``q-`` and 8 hex digits, mesh/_asks.py) that some drivers replace too.
ASK_IDS = r"q-[0-9a-f]{8}"

_IDS = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}"

_HEAD = r'''
import json, logging, re

IDS = re.compile(r"%s")
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
TRACES = re.compile(r"00-([0-9a-f]{32})-[0-9a-f]{16}-0[01]")
RUNS = re.compile(r"([a-z])\1{63,}")


def scrub(text):
    return %s


def parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def canon(text):
    return parsed(scrub(text))


def counted_runs(text):
    """A run of 64 or more of one letter as the letter and its count."""
    return RUNS.sub(lambda m: f"{m[1]}*{len(m[0])}", text)


def sorted_json(text):
    """The text's JSON written with its objects' keys sorted, else the text."""
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text


def sorted_texts(value):
    """A text part holding a JSON object, its keys sorted: members that came from a request's
    Struct are in the process's order (its map's), in either tree."""
    if isinstance(value, dict):
        return {k: sorted_texts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [sorted_texts(v) for v in value]
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.dumps(json.loads(value), sort_keys=True)
        except ValueError:
            pass
    return value


class Logs(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        if record.name.startswith("mesh"):
            message = record.getMessage()
            self.lines.append([record.levelname, record.name, canon(message)])
            self.heard(message)

    def heard(self, message):
        """A driver's hook: each kept record's message, after its line is kept."""
'''

_MESH_RECORDS = 'if record.name.startswith("mesh"):'
# Not the database's slow-batch report (a batch over 2 ms on the loop): the host's load decides it.
_QUIET_RECORDS = 'if record.name.startswith("mesh") and record.name != "mesh.sqlite":'


def quieted(source: str) -> str:
    """``source`` (a driver with this prelude) whose ``Logs`` leaves out ``mesh.sqlite``'s
    records."""
    if source.count(_MESH_RECORDS) != 1:
        raise ValueError("not a driver with one Logs filter")
    return source.replace(_MESH_RECORDS, _QUIET_RECORDS)


def prelude(*ids: str, traces: bool = True, times: bool = True, quiet: bool = False) -> str:
    """The helpers' source: ``IDS`` the uuids and 32-hex ids and ``ids`` (patterns, tried in
    that order); ``scrub`` replaces traceparents unless ``traces`` is false, times unless
    ``times`` is false, then ids; ``quiet``: ``Logs`` leaves out ``mesh.sqlite``'s records."""
    scrubbed = "text"
    if traces:
        scrubbed = f'TRACES.sub("<trace>", {scrubbed})'
    if times:
        scrubbed = f'TIMES.sub("<time>", {scrubbed})'
    scrubbed = f'IDS.sub("<id>", {scrubbed})'
    source = _HEAD % ("|".join((_IDS, *ids)), scrubbed)
    return quieted(source) if quiet else source
