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
  second and adds the milliseconds, the same text as ``logging.Formatter``'s;
* the line put together by ``%`` over the record's whole ``__dict__`` through the format's style
  object: ``LineFormatter`` writes ``FORMAT``'s four fields itself;
* the handler's lock taken a second time to flush (``StreamHandler.flush``, inside ``emit``,
  which ``handle`` already calls under that lock): ``LineHandler`` flushes the stream itself.

Together ~48,500 instructions a line (~57,000 before the last two), the same bytes out. These are the process's settings, so
only ``mesh serve`` makes them (it owns the process's logging); a ``Node`` run inside someone
else's application logs with whatever that application configured. A line format that shows
``%(funcName)s``, ``%(lineno)d``, ``%(thread)d`` or ``%(process)d`` would need them back, and
so would a ``stack_info=True`` record (its stack comes with the caller lookup): mesh logs none.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["FORMAT", "LineFormatter", "LineHandler", "configure"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


#: What ``logging.Formatter.format`` calls on itself for a line: set on the instance (a test or
#: a tool patching it), the line goes through ``logging.Formatter`` so it is called.
_FORMATTER_HOOKS = frozenset({"formatMessage", "usesTime", "formatTime"})


class LineFormatter(logging.Formatter):
    """``logging.Formatter`` whose default ``asctime`` (``2026-12-01 23:11:22,345``) reuses the
    date and time of the record's second: ``strftime`` runs once a second, not once a line.
    In ``FORMAT`` (no date format, no defaults of its own) a line is also put together from
    its four fields directly, not by ``%`` over the record's whole ``__dict__`` through the
    style object (the same text: each field is a ``%s`` of the same value)."""

    # (the second, its date and time): one object, so a reader never sees half of a pair.
    _second: tuple[int, str] = (-1, "")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        style, cls = self._style, type(self)
        plain = (
            type(style) is logging.PercentStyle
            and style._fmt == FORMAT
            and not style._defaults  # type: ignore[attr-defined]
            and cls.formatMessage is logging.Formatter.formatMessage
            and cls.usesTime is logging.Formatter.usesTime
        )
        # The style it may write itself (None: another format), and that style's format: both
        # compared with what the formatter has at each line, as is its date format, which
        # logging.Formatter reads at each line too (they are attributes anyone may set).
        self._plain_style = style if plain else None
        self._plain_fmt = style._fmt

    def format(self, record: logging.LogRecord) -> str:
        style = self._style
        if (
            style is not self._plain_style
            or style._fmt is not self._plain_fmt
            or self.datefmt is not None
            or record.exc_info
            or record.exc_text
            or record.stack_info
            or self.__dict__.keys() & _FORMATTER_HOOKS  # a hook set on this formatter itself
        ):
            return super().format(record)
        # logging.Formatter.format's steps for a record without a traceback or stack.
        message = record.message = record.getMessage()
        asctime = record.asctime = self.formatTime(record)
        # %s as the format converts each field (str() of a level name that is not a str).
        return "%s %s %s: %s" % (asctime, record.levelname, record.name, message)  # noqa: UP031

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


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """``logging.StreamHandler`` whose ``emit`` flushes the stream itself: ``handle`` holds
    the handler's lock around ``emit`` already, and ``StreamHandler.flush`` takes it again.
    A ``flush`` of a subclass's own, or set on the handler, is called as StreamHandler does
    (it is the per-line hook: an fsync, say)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record)
            stream = self.stream
            stream.write(msg + self.terminator)
            if type(self).flush is not logging.StreamHandler.flush or "flush" in self.__dict__:
                self.flush()
            elif stream and hasattr(stream, "flush"):  # as StreamHandler.flush asks
                stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def configure(level: int | str) -> None:
    """Log to stderr at ``level`` in ``FORMAT``, without what no line of it shows."""
    logging._srcfile = None  # the documented switch (see above)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = LineHandler(sys.stderr)
    handler.setFormatter(LineFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
