"""``mesh serve``'s log lines (mesh._cli.log_lines): the same text as ``logging.Formatter``'s,
made without what the line does not show."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from mesh._cli.log_lines import FORMAT, LineFormatter
from tests.support import ROOT, clean_env


def _record(created: float, msg: str = "task %s completed") -> logging.LogRecord:
    record = logging.LogRecord("mesh.task", logging.INFO, __file__, 1, msg, ("ab12",), None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    return record


@pytest.mark.parametrize(
    "times",
    [
        # Within one second, across a second, a minute, a day and a year; the last millisecond.
        [1796167153.001, 1796167153.5, 1796167153.999, 1796167154.0, 1796167154.25],
        [1796169599.9995, 1796169600.0001, 1798761599.999, 1798761600.0],
        # Back in time (a clock set back): the cached second is not reused for another.
        [1796167160.5, 1796167153.5, 1796167160.5],
    ],
)
def test_each_line_is_the_standard_formatters_text(times: list[float]) -> None:
    ours, standard = LineFormatter(FORMAT), logging.Formatter(FORMAT)
    for created in times:
        assert ours.format(_record(created)) == standard.format(_record(created))


def test_the_date_and_time_are_made_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    strftime = time.strftime

    def counted(fmt: str, t: time.struct_time) -> str:
        made.append(fmt)
        return strftime(fmt, t)

    monkeypatch.setattr(time, "strftime", counted)
    formatter = LineFormatter(FORMAT)
    for ms in range(0, 1000, 10):
        formatter.format(_record(1796167153 + ms / 1000))
    formatter.format(_record(1796167154.5))
    assert len(made) == 2
    # A date format of its own is the standard formatter's path, every line.
    dated = LineFormatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    assert dated.format(_record(1796167153.5)) == logging.Formatter(
        "%(asctime)s %(message)s", datefmt="%H:%M:%S"
    ).format(_record(1796167153.5))


def test_a_served_process_logs_the_line_without_the_callers_place() -> None:
    # In a fresh interpreter: configure() sets the process's logging switches.
    code = (
        "import logging, sys\n"
        "from mesh._cli import log_lines\n"
        "log_lines.configure('INFO')\n"
        "seen = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record): seen.append(record)\n"
        "logging.getLogger().addHandler(Keep())\n"
        "logging.getLogger('mesh.task').info('task %s completed', 'ab12')\n"
        "r = seen[0]\n"
        "print(r.funcName, r.lineno, r.thread, r.process, r.processName, sep='|')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # logging's own "no caller" values: the stack was not walked.
    assert proc.stdout.strip() == "(unknown function)|0|None|None|None"
    (line,) = proc.stderr.splitlines()
    assert line.endswith(" INFO mesh.task: task ab12 completed")
    assert time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")


def _rich_records() -> list[logging.LogRecord]:
    """Records of each kind a line may carry: args, a dict of args, a traceback, a stack."""
    plain = _record(1796167153.25)
    named = logging.LogRecord(
        "mesh._remote",
        logging.WARNING,
        __file__,
        1,
        "%(who)s: %(n)d",
        ({"who": "x", "n": 3},),
        None,
    )
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord(
            "mesh.task", logging.ERROR, __file__, 1, "failed %s", ("t",), sys.exc_info()
        )
    stacked = logging.LogRecord(
        "mesh", logging.INFO, __file__, 1, "here", None, None, sinfo="Stack (most recent call last)"
    )
    for record in (named, failed, stacked):  # made now: at plain's time, so two calls agree
        record.created, record.msecs = plain.created, plain.msecs
    return [plain, named, failed, stacked]


def test_every_kind_of_record_is_the_standard_formatters_text() -> None:
    ours, standard = LineFormatter(FORMAT), logging.Formatter(FORMAT)
    for mine, theirs in zip(_rich_records(), _rich_records(), strict=True):
        assert ours.format(mine) == standard.format(theirs)
        # What Formatter.format leaves on the record, other handlers may read.
        assert mine.message == theirs.message
        assert mine.asctime == theirs.asctime
        assert mine.exc_text == theirs.exc_text


def test_the_serve_format_is_written_without_the_style_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = LineFormatter(FORMAT)
    expected = logging.Formatter(FORMAT).format(_record(1796167153.25))

    def refused(record: logging.LogRecord) -> str:
        raise AssertionError("the style object formatted the line")

    monkeypatch.setattr(ours._style, "format", refused)
    assert ours.format(_record(1796167153.25)) == expected
    # Another format (or a traceback) still goes through it.
    other = LineFormatter("%(levelname)s %(message)s")
    monkeypatch.setattr(other._style, "format", refused)
    with pytest.raises(AssertionError, match="style object"):
        other.format(_record(1796167153.25))


class _Lock:
    """A handler's lock that counts how often it is taken."""

    def __init__(self) -> None:
        self.taken = 0

    def acquire(self) -> None:
        self.taken += 1

    def release(self) -> None:
        pass

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Stream:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def write(self, text: str) -> None:
        self.calls.append(("write", text))

    def flush(self) -> None:
        self.calls.append(("flush", ""))


def test_the_handler_writes_and_flushes_as_a_stream_handler_under_one_lock() -> None:
    from mesh._cli.log_lines import LineHandler

    seen: dict[str, tuple[list[tuple[str, str]], int]] = {}
    for handler in (LineHandler(_Stream()), logging.StreamHandler(_Stream())):
        handler.setFormatter(LineFormatter(FORMAT))
        lock = handler.lock = _Lock()  # type: ignore[assignment]
        for record in _rich_records():
            handler.handle(record)
        seen[type(handler).__name__] = (handler.stream.calls, lock.taken)
    ours, standard = seen["LineHandler"], seen["StreamHandler"]
    assert ours[0] == standard[0]  # the same writes and flushes, in the same order
    assert ours[1] == len(_rich_records())  # once a record (the stream handler: twice)
    assert standard[1] == 2 * len(_rich_records())


def test_a_stream_without_flush_is_written_as_a_stream_handler_writes_it() -> None:
    from mesh._cli.log_lines import LineHandler

    class WriteOnly:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> None:
            self.text += text

    ours, standard = LineHandler(WriteOnly()), logging.StreamHandler(WriteOnly())
    for handler in (ours, standard):
        handler.setFormatter(LineFormatter(FORMAT))
        handler.handle(_record(1796167153.25))
    assert ours.stream.text == standard.stream.text != ""


def test_what_is_set_on_the_formatter_after_it_is_made_is_used() -> None:
    # logging.Formatter reads its date format and style at each line: so does this one.
    def pair() -> tuple[logging.Formatter, logging.Formatter]:
        return LineFormatter(FORMAT), logging.Formatter(FORMAT)

    mine, theirs = pair()
    for formatter in (mine, theirs):
        formatter.datefmt = "%H:%M"
    assert mine.format(_record(1796167153.25)) == theirs.format(_record(1796167153.25))
    mine, theirs = pair()
    for formatter in (mine, theirs):
        formatter._style = logging.PercentStyle("%(levelname)s %(message)s")
    assert mine.format(_record(1796167153.25)) == theirs.format(_record(1796167153.25))
    mine, theirs = pair()
    for formatter in (mine, theirs):
        formatter._style._fmt = "%(name)s %(message)s"
    assert mine.format(_record(1796167153.25)) == theirs.format(_record(1796167153.25))


def test_a_subclass_that_formats_the_message_itself_is_asked() -> None:
    class Shouting(LineFormatter):
        def formatMessage(self, record: logging.LogRecord) -> str:
            return super().formatMessage(record).upper()

    line = Shouting(FORMAT).format(_record(1796167153.25))
    assert line == logging.Formatter(FORMAT).format(_record(1796167153.25)).upper()
