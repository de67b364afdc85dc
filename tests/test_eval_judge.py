"""The rubric of ``mesh eval``, judged for real: ``mesh eval`` (a child process) runs the judge
on mesh's Gemini model, through the real google-genai client, against tests/fakes/gemini_server.py
(``GOOGLE_GEMINI_BASE_URL``, the setting the Gemini model honours), scripted with the verdicts.
The cases run against the three-hop mesh of tests/test_eval.py; the fake server shows what reached
the judge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.gemini_server import FakeGemini, Recorded, text_response
from tests.support import clean_env
from tests.test_eval import Mesh, chain_case, mesh_eval
from tests.test_eval import mesh as mesh  # the module's fixture: a registry and three nodes

pytestmark = pytest.mark.integration

ANSWER = "top heard: middle has the alpha report (3 steps)"


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


def judge_env(fake: FakeGemini, **extra: str) -> dict[str, str]:
    return clean_env(GOOGLE_API_KEY="judge-test-key", GOOGLE_GEMINI_BASE_URL=fake.url, **extra)


def rubric_case(name: str, rubric: str) -> dict[str, Any]:
    case = chain_case(name=name)
    case["expect"]["rubric"] = rubric
    return case


def prompt(request: Recorded) -> str:
    (content,) = request.contents
    assert content["role"] == "user"
    return str(content["parts"][0]["text"])


def generation_config(request: Recorded) -> dict[str, Any]:
    """``generationConfig`` with its keys in camelCase (the SDK may send either spelling)."""
    config = dict(request.body.get("generationConfig", {}))
    out: dict[str, Any] = {}
    for key, value in config.items():
        head, *rest = key.split("_")
        out[head + "".join(w.title() for w in rest)] = value
    return out


def test_the_judge_passes_fails_and_errs_per_its_answer(
    mesh: Mesh, fake: FakeGemini, tmp_path: Path
) -> None:
    fake.reply(text_response('{"passed": true, "reason": "It names the alpha report."}'))
    fake.reply(text_response('{"passed": false, "reason": "It never names the bottom agent."}'))
    fake.reply(text_response("Looks fine to me!"))
    fake.reply(text_response('{"passed": "false", "reason": "a string, not a boolean"}'))
    fake.fail(400, "API key not valid. Please pass a valid API key.")
    rubrics = {
        "rubric-passes": "Says which report the middle agent has.",
        "rubric-fails": "Names the agent that wrote the report.",
        "judge-not-json": "Says how many steps the report took.",
        "judge-string-verdict": "Is polite.",
        "judge-http-error": "Is short.",
    }
    cases = [rubric_case(name, rubric) for name, rubric in rubrics.items()]

    done, report, junit = mesh_eval(
        {"cases": cases}, tmp_path, "--registry", mesh.registry, env=judge_env(fake)
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    runs = {c["name"]: c["runs"][0] for c in report["cases"]}
    assert {c["name"]: c["passed"] for c in report["cases"]} == {
        "rubric-passes": True,
        "rubric-fails": False,
        "judge-not-json": False,
        "judge-string-verdict": False,
        "judge-http-error": False,
    }
    assert runs["rubric-passes"]["failures"] == []
    assert runs["rubric-passes"]["notes"] == []
    assert runs["rubric-fails"]["failures"] == ["rubric: It never names the bottom agent."]
    (not_json,) = runs["judge-not-json"]["failures"]
    assert not_json.startswith("rubric: the judge's answer was not the verdict asked for")
    assert "'Looks fine to me!'" in not_json
    (string_verdict,) = runs["judge-string-verdict"]["failures"]
    assert string_verdict.startswith("rubric: the judge's answer was not the verdict asked for")
    assert runs["judge-http-error"]["failures"] == [
        "rubric not judged, the judge failed: gemini model 'gemini-2.5-flash': HTTP 400 "
        "INVALID_ARGUMENT: API key not valid. Please pass a valid API key."
    ]
    # A judge that failed does not end the case: its trajectory was still read and checked.
    assert [t["agent"] for t in runs["judge-http-error"]["tasks"]] == [
        "stream-top",
        "stream-middle",
        "stream-bottom",
    ]
    assert "FAIL rubric-fails: rubric: It never names the bottom agent." in done.stdout

    # The judge's reason reaches CI through JUnit.
    assert junit.get("failures") == "4"
    assert junit.find("testcase[@name='rubric-passes']/failure") is None
    failure = junit.find("testcase[@name='rubric-fails']/failure")
    assert failure is not None
    assert failure.get("message") == "run 1: rubric: It never names the bottom agent."
    error = junit.find("testcase[@name='judge-http-error']/failure")
    assert error is not None
    assert "the judge failed" in error.get("message", "")

    # What reached the judge: one request per rubric, in order, each with the case's own
    # rubric and the answer the mesh gave, on the judge's model, asking for a JSON verdict.
    assert fake.pending == 0
    assert len(fake.requests) == len(rubrics)
    for request, rubric in zip(fake.requests, rubrics.values(), strict=True):
        assert (request.version, request.model, request.rpc) == (
            "v1beta",
            "gemini-2.5-flash",
            "generateContent",
        )
        assert request.headers["x-goog-api-key"] == "judge-test-key"
        assert prompt(request) == (
            f"Request:\nreport alpha\n\nAnswer:\n{ANSWER}\n\nRubric:\n{rubric}"
        )
        system = request.body["systemInstruction"]["parts"][0]["text"]
        assert "rubric" in system
        config = generation_config(request)
        assert config["responseMimeType"] == "application/json"
        assert config["temperature"] == 0.0
        assert config["responseJsonSchema"]["required"] == ["passed", "reason"]


def test_a_turns_rubric_is_judged_with_that_turns_answer(
    mesh: Mesh, fake: FakeGemini, tmp_path: Path
) -> None:
    fake.reply(text_response('{"passed": true, "reason": "alpha it is"}'))
    fake.reply(text_response('{"passed": false, "reason": "beta, not gamma"}'))
    case = chain_case(
        name="two-turns",
        turns=[
            {"text": "report alpha", "expect": {"rubric": "Talks about alpha."}},
            "report beta",
        ],
        expect={"rubric": "Talks about gamma."},
        trajectory={},
        bounds={},
    )

    done, report, _junit = mesh_eval(
        {"cases": [case]}, tmp_path, "--registry", mesh.registry, env=judge_env(fake)
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert report["cases"][0]["runs"][0]["failures"] == ["rubric: beta, not gamma"]
    first, last = fake.requests
    assert prompt(first) == (
        f"Request:\nreport alpha\n\nAnswer:\n{ANSWER}\n\nRubric:\nTalks about alpha."
    )
    assert prompt(last) == (
        "Request:\nreport beta\n\nAnswer:\ntop heard: middle has the beta report (3 steps)"
        "\n\nRubric:\nTalks about gamma."
    )


def test_an_offline_run_skips_the_rubric_saying_why(
    mesh: Mesh, fake: FakeGemini, tmp_path: Path
) -> None:
    """``make eval`` runs with MESH_MODEL=scripted: a developer's key in the environment must
    not make the scripted model judge (it cannot), nor call Gemini."""
    case = rubric_case("offline", "Says which report the middle agent has.")

    done, report, _junit = mesh_eval(
        {"cases": [case]},
        tmp_path,
        "--registry",
        mesh.registry,
        env=judge_env(fake, MESH_MODEL="scripted"),
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert report["cases"][0]["runs"][0]["notes"] == [
        "rubric not judged: MESH_MODEL=scripted runs offline (unset it, with a Gemini key set, "
        "to judge rubrics with gemini-2.5-flash)"
    ]
    assert fake.requests == []
