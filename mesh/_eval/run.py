"""``Evaluator``: runs the cases of ``mesh eval`` against a live mesh.

Each run of a case gets one trace id: every turn carries a ``traceparent`` of that trace (a new
span each), so the tasks the mesh ran for the case, on every node, are the tasks of the trace
(``mesh._eval.trace``). A run sends the turns (the first turn's context carries the next ones:
follow-ups rely on it), answers the mesh's questions from the case's ``answers``, then reads
the trace and checks the answer, the trajectory and the bounds. Cases with ``without`` run
last: the agents they stop are started again after each, and a caller's breaker opened by the
fault should not colour the other cases.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mesh._errors import MeshError
from mesh._eval.cases import Case, Expect, Turn
from mesh._eval.judge import NO_KEY
from mesh._eval.matchers import Answer, check_answer, check_bounds, check_trajectory
from mesh._eval.trace import Trace, fetch_trace
from mesh._tracing import TraceParent

if TYPE_CHECKING:
    import httpx

    from mesh._a2a.results import TaskResult
    from mesh._discovery.client import DiscoveryClient

__all__ = ["CaseResult", "Evaluator", "Faults", "Judge", "RunResult"]


class Faults(Protocol):
    """Makes agents unavailable for a fault case, and available again."""

    async def stop(self, agent: str) -> None: ...

    async def restore(self, agent: str) -> None: ...


class Judge(Protocol):
    """Judges an answer against a rubric: (passed, reason); passed None: not judged (the
    reason says why). A ``MeshError`` (the judge's model failed) fails the rubric."""

    async def judge(self, rubric: str, question: str, answer: str) -> tuple[bool | None, str]: ...


@dataclass
class RunResult:
    """One run of a case."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    latency_s: float = 0.0
    answer: Answer | None = None
    trace: Trace | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def tokens(self) -> int:
        return self.trace.total_tokens if self.trace is not None else 0

    @property
    def delegations(self) -> int:
        return self.trace.delegations if self.trace is not None else 0


@dataclass
class CaseResult:
    """Every run of one case."""

    case: Case
    runs: list[RunResult]
    #: The share of runs that must pass.
    min_pass_rate: float = 1.0

    @property
    def pass_rate(self) -> float:
        return sum(r.passed for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def passed(self) -> bool:
        return bool(self.runs) and self.pass_rate >= self.min_pass_rate


def _answer(result: TaskResult) -> Answer:
    text = result.text
    if result.error and not text:
        text = str(result.error.get("message") or "")
    return Answer(state=result.state, text=text, data=result.data)


class Evaluator:
    """Runs cases. ``http`` carries the mesh token; ``discovery`` finds agents by name and the
    nodes a trace is read from; ``faults`` serves ``without`` (None: such cases fail saying
    what to do); ``judge`` reads rubrics (``mesh._eval.judge.create_judge``; None: skipped,
    noting there is no key); ``nodes``: more URLs a trace is read from (nodes no registry
    lists)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        discovery: DiscoveryClient | None = None,
        faults: Faults | None = None,
        judge: Judge | None = None,
        nodes: Sequence[str] = (),
    ) -> None:
        self.http = http
        self.discovery = discovery
        self.faults = faults
        self.judge = judge
        self.nodes = list(nodes)

    async def run(
        self,
        cases: Sequence[Case],
        *,
        repeat: int = 1,
        min_pass_rate: float = 1.0,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> list[CaseResult]:
        """Every case ``repeat`` times (fault cases last); results in the file's order."""
        ordered = sorted(cases, key=lambda c: bool(c.without))
        results = {c.name: CaseResult(c, [], min_pass_rate) for c in cases}
        total, done = len(cases) * repeat, 0
        for case in ordered:
            for _ in range(repeat):
                if progress is not None:
                    progress(done, total, case.name)
                results[case.name].runs.append(await self.run_case(case))
                done += 1
        if progress is not None:
            progress(done, total, "")
        return [results[c.name] for c in cases]

    async def run_case(self, case: Case) -> RunResult:
        """One run of ``case``: its faults set up and undone around it."""
        run = RunResult()
        if case.without and self.faults is None:
            run.failures.append(
                f"without {case.without}: stopping agents needs a local `mesh up` "
                "(run from its folder, or pass --meshfile)"
            )
            return run
        stopped: list[str] = []
        try:
            for agent in case.without:
                assert self.faults is not None
                await self.faults.stop(agent)
                stopped.append(agent)
            await self._turns(case, run)
        except MeshError as exc:
            run.failures.append(f"error: {exc}")
        finally:
            for agent in stopped:
                assert self.faults is not None
                try:
                    await self.faults.restore(agent)
                except MeshError as exc:
                    run.notes.append(f"could not start {agent} again: {exc}")
        return run

    async def _target(self, case: Case) -> str:
        if case.url is not None:
            return case.url
        if self.discovery is None:
            raise MeshError(f"case {case.name!r} names agent {case.agent!r}: give a registry")
        found = await self.discovery.require(agent=str(case.agent))
        return found[0].url

    async def _nodes(self, case: Case, target: str, run: RunResult) -> list[str]:
        urls = [target, *self.nodes]
        if self.discovery is not None:
            try:
                found = await self.discovery.find()
            except MeshError as exc:
                run.notes.append(f"the registry was not asked for the trace's nodes: {exc}")
                return urls
            # The agents a fault case stopped ran nothing: the registry may list them a moment.
            urls.extend(i.url for i in found if i.agent not in case.without)
        return urls

    async def _turns(self, case: Case, run: RunResult) -> None:
        from mesh._a2a.client import A2APeer

        target = await self._target(case)
        peer = A2APeer(self.http, target)
        trace = TraceParent.new()
        context_id: str | None = None
        answers = list(case.answers)
        started = time.perf_counter()
        try:
            for number, turn in enumerate(case.turns, start=1):
                result = await self._send(peer, case, turn, trace, context_id)
                # Bounded: each round uses up one answer.
                while result.waiting and answers:
                    result = await peer.send(
                        answers.pop(0),
                        task_id=result.task_id,
                        context_id=result.context_id,
                        metadata={"traceparent": str(trace.child())},
                        timeout=case.timeout_s,
                    )
                if result.waiting:
                    question = result.questions[0].text if result.questions else "?"
                    run.failures.append(
                        f"turn {number}: the mesh asked {question!r} and the case has no "
                        "answer left (add one to 'answers')"
                    )
                context_id = result.context_id or context_id
                run.answer = _answer(result)
                last = number == len(case.turns)
                expect = turn.expect
                if expect is not None:
                    run.failures.extend(
                        f"turn {number}: {f}" for f in check_answer(expect, run.answer)
                    )
                    await self._rubric(expect, turn, run, f"turn {number}: ")
                if last:
                    run.failures.extend(check_answer(case.expect, run.answer))
                    await self._rubric(case.expect, turn, run)
        finally:
            await peer.aclose()
        run.latency_s = time.perf_counter() - started
        run.trace = await fetch_trace(
            self.http, await self._nodes(case, target, run), trace.trace_id
        )
        for url, why in run.trace.unreachable.items():
            run.notes.append(f"trace not read at {url}: {why}")
        if run.trace.truncated:
            run.notes.append(
                "a node cut its trace rows (limit or size): the trajectory may miss calls"
            )
        run.failures.extend(check_trajectory(case.trajectory, run.trace.steps))
        run.failures.extend(
            check_bounds(
                case.bounds,
                latency_s=run.latency_s,
                tokens=run.trace.total_tokens,
                delegations=run.trace.delegations,
            )
        )

    async def _send(
        self,
        peer: Any,
        case: Case,
        turn: Turn,
        trace: TraceParent,
        context_id: str | None,
    ) -> TaskResult:
        payload: dict[str, Any] | str = turn.data if turn.data is not None else str(turn.text)
        result: TaskResult = await peer.send(
            payload,
            skill=turn.skill,
            context_id=context_id,
            metadata={"traceparent": str(trace.child())},
            timeout=case.timeout_s,
        )
        return result

    async def _rubric(self, expect: Expect, turn: Turn, run: RunResult, label: str = "") -> None:
        """Judge ``expect.rubric`` against ``turn``'s answer: a failure with the judge's
        reason, a note when skipped, a failure when the judge itself failed (the case cannot
        be said to pass, and the rest of it is still checked)."""
        if expect.rubric is None or run.answer is None:
            return
        if self.judge is None:
            run.notes.append(f"{label}rubric not judged: {NO_KEY}")
            return
        question = turn.text if turn.text is not None else json.dumps(turn.data)
        try:
            passed, reason = await self.judge.judge(expect.rubric, question, run.answer.shown)
        except MeshError as exc:
            run.failures.append(f"{label}rubric not judged, the judge failed: {exc}")
            return
        if passed is None:
            run.notes.append(f"{label}rubric not judged: {reason}")
        elif not passed:
            run.failures.append(f"{label}rubric: {reason}")
