"""Facts about the machine and the interpreter a run happened on, and mesh's import time."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT, clean_env

__all__ = ["describe", "import_times"]

_PACKAGES = (
    "a2a-sdk",
    "fastapi",
    "starlette",
    "uvicorn",
    "uvloop",
    "httptools",
    "pydantic",
    "protobuf",
)


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor()


def _mem_total_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe(wrk: str) -> dict[str, Any]:
    """The machine (CPU, cores, memory, load), Python, key package versions, wrk's version."""
    wrk_version = subprocess.run(
        [wrk, "--version"], capture_output=True, text=True, timeout=10, check=False
    ).stdout.split("\n", 1)[0]
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _mem_total_gb(),
        # Other work on the host skews the numbers; the load average says how much there was.
        "loadavg_at_start": list(os.getloadavg()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in _PACKAGES},
        "wrk": wrk_version.strip(),
    }


_PROBE = """
import sys, time
t = time.perf_counter()
import {module}
print(time.perf_counter() - t, int("google.genai" in sys.modules), len(sys.modules))
"""


def import_times(modules: tuple[str, ...], *, repeat: int = 3) -> dict[str, Any]:
    """Fresh-interpreter import time of each module (median of ``repeat``), and whether
    importing it pulled in ``google.genai`` (it must not: only a Gemini model may)."""
    result: dict[str, Any] = {}
    for module in modules:
        samples: list[float] = []
        genai = False
        count = 0
        for _ in range(repeat):
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE.format(module=module)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
                env=clean_env(),
                check=False,
            )
            if proc.returncode != 0:
                result[module] = {"error": proc.stderr.strip().splitlines()[-1:]}
                break
            seconds, has_genai, loaded = proc.stdout.split()
            samples.append(float(seconds))
            genai = genai or has_genai == "1"
            count = int(loaded)
        else:
            result[module] = {
                "seconds": round(statistics.median(samples), 4),
                "google_genai_imported": genai,
                "modules_loaded": count,
            }
    return result
