"""The log lines of a served node: ``time LEVEL logger: message`` on stderr, made cheaply.

A node logs one INFO line per task and one per delegation, so a line's cost is on every request
and twice on a delegation hop: ~82,000 instructions with ``logging.basicConfig``'s defaults
(docs/performance.md, "Where the hop's time goes on this host"). Of them, and not in the line:

* the caller's file, function and line (``logging`` walks the stack and scans the calling
  function's line table for each record): off with ``logging._srcfile = None``, the switch the
  logging HOWTO ("Optimization") documents for this;
* the thread, process and multiprocessing process names: off with ``logging.logThreads``,
  ``logProcesses``, ``logMultiprocessing``;
* the date and time re-made by ``strftime`` for every line: ``LineFormatter`` makes it once a
  second and adds the milliseconds, the same text as ``logging.Formatter``'s.

Together ~57,000 instructions a line, the same bytes out. These are the process's settings, so
only ``mesh serve`` makes them (it owns the process's logging); a ``Node`` run inside someone
else's application logs with whatever that application configured. A line format that shows
``%(funcName)s``, ``%(lineno)d``, ``%(thread)d`` or ``%(process)d`` would need them back, and
so would a ``stack_info=True`` record (its stack comes with the caller lookup): mesh logs none.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["FORMAT", "LineFormatter", "configure"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LineFormatter(logging.Formatter):
    """``logging.Formatter`` whose default ``asctime`` (``2026-12-01 23:11:22,345``) reuses the
    date and time of the record's second: ``strftime`` runs once a second, not once a line."""

    # (the second, its date and time): one object, so a reader never sees half of a pair.
    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        found = self._second
        if found[0] != second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            found = self._second = (second, text)
        msec = self.default_msec_format  # as logging.Formatter: None leaves the ms out
        return msec % (found[1], record.msecs) if msec else found[1]


def configure(level: int | str) -> None:
    """Log to stderr at ``level`` in ``FORMAT``, without what no line of it shows."""
    logging._srcfile = None  # the documented switch (see above)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
