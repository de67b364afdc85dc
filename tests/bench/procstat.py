"""What a process costs, read from ``/proc``: CPU seconds (utime+stime) and resident memory.

Linux only. A server's children are included, so a server that forks workers is not flattered.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cpu_seconds", "family", "rss_bytes"]

_TICKS = os.sysconf("SC_CLK_TCK")


def family(pid: int) -> list[int]:
    """``pid`` and its live descendants (bounded: a process tree of a few hundred at most)."""
    seen: list[int] = []
    todo = [pid]
    while todo and len(seen) < 512:
        current = todo.pop()
        seen.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(c) for c in task.read_text().split())
            except OSError:  # the task ended while we looked
                continue
    return seen


def _cpu_of(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICKS


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` and its live descendants."""
    return sum(_cpu_of(p) for p in family(pid))


def _rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes(pid: int) -> int:
    """Resident set size (VmRSS) of ``pid`` and its live descendants, in bytes."""
    return sum(_rss_of(p) for p in family(pid))
