"""The checks of ``mesh eval`` (mesh._eval.matchers) and its case file (mesh._eval.cases): unit
tests, no process."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mesh._errors import ConfigError
from mesh._eval.cases import Bounds, Call, Case, Expect, Trajectory, load_cases
from mesh._eval.matchers import (
    Answer,
    args_match,
    check_answer,
    check_bounds,
    check_trajectory,
)
from mesh._eval.report import format_results, write_junit
from mesh._eval.run import CaseResult, Evaluator, RunResult
from mesh._eval.trace import Step

TEXT = Answer("completed", "Recommendation for Meera Iyer (APP-738): APPROVE.")
TYPED = Answer("completed", "", {"decision": "refer", "reasons": [{"code": "dti"}], "score": 642})


def test_text_matchers() -> None:
    assert check_answer(Expect(contains=["APPROVE"], regex=r"\(APP-\d+\)"), TEXT) == []
    assert check_answer(Expect(equals=" " + TEXT.text + "\n"), TEXT) == []
    assert check_answer(Expect(contains=["approve"], ignore_case=True), TEXT) == []
    (miss,) = check_answer(Expect(contains=["DECLINE"]), TEXT)
    assert "expected it to contain 'DECLINE'" in miss
    assert "APPROVE" in miss
    (found,) = check_answer(Expect(not_contains=["APPROVE"]), TEXT)
    assert "expected no 'APPROVE'" in found
    (regex,) = check_answer(Expect(regex=r"DECLINE$"), TEXT)
    assert "/DECLINE$/" in regex
    assert len(check_answer(Expect(equals="APPROVE"), TEXT)) == 1
    (state,) = check_answer(Expect(state="rejected"), TEXT)
    assert state == "state: expected rejected, got completed"


def test_json_field_matchers() -> None:
    ok = Expect(fields={"decision": "refer", "reasons.0.code": "dti", "score": 642.0})
    assert check_answer(ok, TYPED) == []
    assert check_answer(Expect(fields={"decision": "approve"}), TYPED) == [
        "field decision: expected 'approve', got 'refer'"
    ]
    assert check_answer(Expect(fields={"reasons.3.code": "x"}), TYPED) == [
        "field reasons.3.code: expected 'x'; the answer has no reasons.3.code"
    ]
    assert "the answer has no JSON" in check_answer(Expect(fields={"a": 1}), TEXT)[0]
    # A typed answer's text matchers read its JSON.
    assert check_answer(Expect(contains=['"decision": "refer"']), TYPED) == []


def test_args_match_is_a_subset_match() -> None:
    actual = {"applicant_id": "APP-1", "amount": 400000.0, "opts": {"a": 1, "b": [1, 2]}}
    assert args_match({}, actual)
    assert args_match({"amount": 400000}, actual)  # int vs float of the same number
    assert args_match({"opts": {"b": [1, 2]}}, actual)
    assert not args_match({"opts": {"b": [1]}}, actual)  # lists compare whole
    assert not args_match({"applicant_id": "APP-2"}, actual)
    assert not args_match({"missing": None}, actual)
    assert args_match({"v": None}, {"v": None})


STEPS = [
    Step("skill", "loan-officer", "chat", {"text": "approve APP-1?"}, True, 1.0),
    Step("tool", "loan-officer", "lookup_applicant", {"applicant_id": "APP-1"}, True, 2.0),
    Step("tool", "loan-officer", "credit_bureau_score", {"applicant_id": "APP-1"}, True, 3.0),
    Step("skill", "credit-bureau", "score", {"applicant_id": "APP-1", "amount": 5}, True, 3.1),
    Step("tool", "loan-officer", "apply_lending_policy", {"score": 700}, True, 4.0),
]


def test_trajectory_any_order_in_order_and_must_not_call() -> None:
    lookup = Call(tool="lookup_applicant", args={"applicant_id": "APP-1"})
    policy = Call(tool="apply_lending_policy", agent="loan-officer")
    score = Call(skill="score", agent="credit-bureau", args={"amount": 5})
    assert check_trajectory(Trajectory(calls=[policy, lookup, score]), STEPS) == []
    assert (
        check_trajectory(Trajectory(calls=[lookup, score, policy], order="in_order"), STEPS) == []
    )
    (late,) = check_trajectory(Trajectory(calls=[policy, lookup], order="in_order"), STEPS)
    assert "tool lookup_applicant" in late
    assert "it came earlier" in late
    # One step answers one expected call: the same call twice needs two.
    (twice,) = check_trajectory(Trajectory(calls=[lookup, lookup]), STEPS)
    assert "expected tool lookup_applicant" in twice
    (bad,) = check_trajectory(Trajectory(must_not_call=[Call(skill="score")]), STEPS)
    assert bad.startswith(
        "trajectory: expected no skill score; it was called: skill score at credit-bureau"
    )
    assert check_trajectory(Trajectory(must_not_call=[Call(skill="verify")]), STEPS) == []


def test_a_wrong_argument_shows_expected_and_actual() -> None:
    wrong = Call(skill="score", agent="credit-bureau", args={"applicant_id": "APP-2"})
    (failure,) = check_trajectory(Trajectory(calls=[wrong]), STEPS)
    assert failure == (
        'trajectory: expected skill score at credit-bureau with {"applicant_id": "APP-2"}; '
        'actual skill score args: {"amount": 5, "applicant_id": "APP-1"} at credit-bureau'
    )
    (never,) = check_trajectory(Trajectory(calls=[Call(tool="calculate_emi")]), STEPS)
    assert "it was not called (calls: skill chat at loan-officer, tool lookup_applicant" in never


def test_bounds() -> None:
    assert (
        check_bounds(
            Bounds(latency_s=1, total_tokens=10, max_delegations=1),
            latency_s=0.5,
            tokens=10,
            delegations=1,
        )
        == []
    )
    failures = check_bounds(
        Bounds(latency_s=1, total_tokens=10, max_delegations=1, min_delegations=0),
        latency_s=2.5,
        tokens=11,
        delegations=3,
    )
    assert failures == [
        "latency: expected at most 1s, took 2.50s",
        "tokens: expected at most 10 over all hops, used 11",
        "delegations: expected at most 1, made 3",
    ]
    assert check_bounds(Bounds(min_delegations=2), latency_s=0, tokens=0, delegations=1) == [
        "delegations: expected at least 2, made 1"
    ]


def _write(tmp_path: Path, text: str, name: str = "cases.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_case_file_with_defaults(tmp_path: Path) -> None:
    cases = load_cases(
        _write(
            tmp_path,
            "agent: loan-officer\ntimeout_s: 9\ncases:\n"
            "  - name: a\n    turns: [hello]\n"
            "  - name: b\n    agent: credit-bureau\n    turns: [{data: {x: 1}, skill: score}]\n",
        )
    ).cases
    assert [(c.name, c.agent, c.timeout_s) for c in cases] == [
        ("a", "loan-officer", 9),
        ("b", "credit-bureau", 9),
    ]
    assert cases[0].turns[0].text == "hello"
    assert cases[1].turns[0].data == {"x": 1}
    as_json = _write(
        tmp_path,
        json.dumps({"cases": [{"name": "j", "url": "http://x", "turns": ["hi"]}]}),
        "c.json",
    )
    assert load_cases(as_json).cases[0].target == "http://x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cases:\n  - name: a\n    turns: [hi]\n", "case 'a': name the 'agent'"),
        (
            "agent: x\ncases:\n  - name: a\n    turns: [hi]\n    trajectory: {calls: [{args: {}}]}\n",
            "case 'a', field trajectory.calls.0: name exactly one of 'tool' or 'skill'",
        ),
        (
            "agent: x\ncases:\n  - name: a\n    turns: [hi]\n    expect: {regex: '('}\n",
            "case 'a', field expect: regex '(' does not compile",
        ),
        (
            "agent: x\ncases:\n  - name: a\n    turns: [hi]\n    bounds: {latency: 3}\n",
            "case 'a', field bounds.latency: Extra inputs are not permitted",
        ),
        ("agent: x\ncases:\n  - turns: [hi]\n", "case #1, field name: Field required"),
        (
            "agent: x\ncases:\n  - {name: a, turns: [hi]}\n  - {name: a, turns: [hi]}\n",
            "two cases are named 'a'",
        ),
        ("agent: x\ncases: [\n", "not YAML"),
    ],
)
def test_mistakes_in_a_case_file_name_the_case_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_cases(_write(tmp_path, text))
    assert message in str(caught.value)


def test_a_missing_case_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read cases .*nope\.yaml"):
        load_cases(tmp_path / "nope.yaml")


async def test_a_fault_case_without_a_mesh_up_fails_saying_what_to_do() -> None:
    import httpx

    case = Case(name="down", agent="loan-officer", turns=["hi"], without=["credit-bureau"])
    async with httpx.AsyncClient() as http:
        run = await Evaluator(http).run_case(case)
    assert run.failures == [
        "without ['credit-bureau']: stopping agents needs a local `mesh up` "
        "(run from its folder, or pass --meshfile)"
    ]


def test_junit_and_table_of_results(tmp_path: Path) -> None:
    ok = Case(name="ok", agent="a", turns=["hi"])
    bad = Case(name="bad & <odd>", agent="a", turns=["hi"])
    results = [
        CaseResult(ok, [RunResult(latency_s=0.2), RunResult(latency_s=0.4)]),
        CaseResult(
            bad, [RunResult(failures=["answer: expected 'x'; got 'y'"], notes=["n1"]), RunResult()]
        ),
    ]
    path = tmp_path / "junit.xml"
    write_junit(results, path)
    root = ET.parse(path).getroot()
    assert (root.get("tests"), root.get("failures")) == ("2", "1")
    failure = root.find("testcase[@name='bad & <odd>']/failure")
    assert failure is not None
    assert failure.get("message") == "run 1: answer: expected 'x'; got 'y'"
    assert root.find("testcase[@name='bad & <odd>']/system-out").text == "n1"  # type: ignore[union-attr]
    table = format_results(results)
    assert "1 of 2 cases passed" in table
    assert "FAIL bad & <odd> (run 1): answer: expected 'x'; got 'y'" in table


def test_the_command_names_unknown_cases_and_mistakes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mesh._cli.main import main

    path = _write(tmp_path, json.dumps({"cases": [{"name": "a", "turns": ["hi"]}]}), "c.json")
    assert main(["eval", str(path)]) == 1
    assert "case 'a': name the 'agent'" in capsys.readouterr().err
    path = _write(
        tmp_path, json.dumps({"agent": "x", "cases": [{"name": "a", "turns": ["hi"]}]}), "c.json"
    )
    assert main(["eval", str(path), "--case", "nope"]) == 1
    assert "no case named nope in" in capsys.readouterr().err
    assert main(["eval", str(path), "--repeat", "0"]) == 1
    assert "--repeat: at least 1" in capsys.readouterr().err


def test_the_progress_bar_shows_only_on_a_terminal() -> None:
    import io

    from mesh._cli.eval import _progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert _progress(io.StringIO()) is None
    screen = Terminal()
    show = _progress(screen)
    show(1, 4, "meera-approved")
    show(4, 4, "")
    assert "[#####---------------] 1/4 meera-approved" in screen.getvalue()
    assert screen.getvalue().endswith("\r\x1b[2K")  # the line is cleared at the end


def test_up_refuses_when_a_mesh_up_already_runs_for_the_mesh_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mesh._cli.main import main
    from mesh._control import UpLock

    meshfile = _write(
        tmp_path,
        f'state_dir = "{tmp_path / "state"}"\n[nodes.a]\nmodule = "agents.credit_bureau:agent"\n'
        "port = 8411\n",
        "mesh.toml",
    )
    cases = _write(
        tmp_path, json.dumps({"agent": "x", "cases": [{"name": "a", "turns": ["hi"]}]}), "c.json"
    )
    with UpLock(tmp_path / "state"):  # the demo, say, already running this mesh
        assert main(["eval", str(cases), "--up", str(meshfile), "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "a `mesh up` already runs for" in err
    assert f"mesh eval {cases} --meshfile {meshfile}" in err
