"""What ``mesh eval`` writes: the terminal table, the JSON report and JUnit XML.

print(format_results(results))
write_json(results, path)
write_junit(results, path)      # one <testcase> per case; CI systems show its <failure>
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mesh._cli.table import format_table
from mesh._eval.run import CaseResult, RunResult

__all__ = ["format_results", "report_json", "write_json", "write_junit"]

_WHY_WIDTH = 70


def _first_failure(result: CaseResult) -> str:
    for run in result.runs:
        if run.failures:
            why = run.failures[0]
            return why if len(why) <= _WHY_WIDTH else why[: _WHY_WIDTH - 3] + "..."
    return ""


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def format_results(results: Sequence[CaseResult]) -> str:
    """The table (one row per case), every failure and note in full below it, and a total."""
    rows = []
    for r in results:
        runs = r.runs
        rate = f"{sum(x.passed for x in runs)}/{len(runs)}"
        rows.append(
            (
                r.case.name,
                "pass" if r.passed else "FAIL",
                rate,
                f"{_median([x.latency_s for x in runs]):.2f}s",
                max((x.tokens for x in runs), default=0),
                max((x.delegations for x in runs), default=0),
                _first_failure(r),
            )
        )
    lines = [
        format_table(("CASE", "RESULT", "RUNS", "LATENCY", "TOKENS", "DELEGATIONS", "WHY"), rows)
    ]
    for r in results:
        seen: set[str] = set()
        for number, run in enumerate(r.runs, start=1):
            label = f"{r.case.name}" + (f" (run {number})" if len(r.runs) > 1 else "")
            for failure in run.failures:
                if failure not in seen:
                    seen.add(failure)
                    lines.append(f"FAIL {label}: {failure}")
            for note in run.notes:
                if note not in seen:
                    seen.add(note)
                    lines.append(f"note {label}: {note}")
    passed = sum(r.passed for r in results)
    lines.append(f"{passed} of {len(results)} cases passed")
    return "\n".join(lines)


def _run_json(run: RunResult) -> dict[str, Any]:
    trace = run.trace
    return {
        "passed": run.passed,
        "failures": run.failures,
        "notes": run.notes,
        "latency_s": round(run.latency_s, 3),
        "tokens": run.tokens,
        "delegations": run.delegations,
        "answer": None
        if run.answer is None
        else {"state": run.answer.state, "text": run.answer.text, "data": run.answer.data},
        "trace_id": trace.trace_id if trace else None,
        "trajectory": [
            {"kind": s.kind, "agent": s.agent, "name": s.name, "args": s.args, "ok": s.ok}
            for s in (trace.steps if trace else [])
        ],
        "tasks": [
            {
                "depth": depth,
                "agent": t.agent,
                "task_id": t.task_id,
                "skill": t.skill,
                "state": t.state,
                "caller": t.caller,
            }
            for depth, t in (trace.tree() if trace else [])
        ],
    }


def report_json(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The JSON report: every case, every run, its trajectory and its task tree."""
    return {
        "passed": sum(r.passed for r in results),
        "failed": sum(not r.passed for r in results),
        "cases": [
            {
                "name": r.case.name,
                "passed": r.passed,
                "pass_rate": r.pass_rate,
                "runs": [_run_json(run) for run in r.runs],
            }
            for r in results
        ],
    }


def write_json(results: Sequence[CaseResult], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report_json(results), indent=2, default=str) + "\n")


def write_junit(
    results: Sequence[CaseResult], path: str | Path, *, suite: str = "mesh eval"
) -> None:
    """JUnit XML: one ``testsuite``, one ``testcase`` per case (its time: the median run), a
    ``failure`` listing each failed run's failures, notes in ``system-out``."""
    root = ET.Element(
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(sum(not r.passed for r in results)),
        errors="0",
        time=f"{sum(run.latency_s for r in results for run in r.runs):.3f}",
    )
    for r in results:
        case = ET.SubElement(
            root,
            "testcase",
            classname=suite.replace(" ", "_"),
            name=r.case.name,
            time=f"{_median([x.latency_s for x in r.runs]):.3f}",
        )
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="pass_rate", value=f"{r.pass_rate:.3f}")
        if not r.passed:
            lines = [f"run {n}: {f}" for n, run in enumerate(r.runs, start=1) for f in run.failures]
            failure = ET.SubElement(
                case,
                "failure",
                message=lines[0] if lines else f"pass rate {r.pass_rate:.2f}",
                type="EvalFailure",
            )
            failure.text = "\n".join(lines)
        notes = [n for run in r.runs for n in run.notes]
        if notes:
            ET.SubElement(case, "system-out").text = "\n".join(dict.fromkeys(notes))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
