"""``TaskResult.from_json`` makes its ``TaskResult`` and ``Artifact``s without their frozen
``__init__`` (``mesh._frozen.made``, one instance dict filled at once): each is the object
the ``__init__`` makes from the same fields (every field set, equal, hashed alike, frozen)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mesh._a2a.results import TaskResult, artifact_from_json
from mesh._artifacts import Artifact

_TASKS: list[dict[str, Any]] = [
    {  # a typed skill's answer, as a node sends it
        "id": "t-1",
        "contextId": "c-1",
        "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-12-02T13:29:04.945534Z"},
        "artifacts": [
            {
                "artifactId": "a-1",
                "name": "score",
                "parts": [
                    {"data": {"score": 396.0, "tier": "D"}, "mediaType": "application/json"},
                    {"text": '{"score":396,"tier":"D"}', "mediaType": "text/plain"},
                ],
            },
            {"name": "chart", "parts": [{"raw": "aGk=", "mediaType": "image/png"}]},
        ],
        "metadata": {"skill": "score", "usage": {"inputTokens": 3.0}},
    },
    {  # failed
        "id": "t-2",
        "status": {"state": "TASK_STATE_FAILED", "message": {"parts": [{"text": "boom"}]}},
        "metadata": {"error": {"reason": "rejected", "message": "no"}},
    },
    {  # failed, with what it made before
        "id": "t-4",
        "status": {"state": "TASK_STATE_FAILED"},
        "artifacts": [{"name": "partial", "parts": [{"text": "half"}, "junk", {"data": {}}]}],
        "metadata": {"error": {"reason": "failed", "message": "no"}, "skill": "partial"},
    },
    {  # waiting for input
        "id": "t-3",
        "contextId": "c-3",
        "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"parts": [{"text": "Why?"}]}},
    },
    {},  # nothing at all
]


def _by_init(made: Any) -> Any:
    return type(made)(**{f.name: getattr(made, f.name) for f in dataclasses.fields(made)})


@pytest.mark.parametrize("task", _TASKS)
def test_a_read_task_is_the_object_its_init_makes(task: dict[str, Any]) -> None:
    result = TaskResult.from_json(task)
    assert set(vars(result)) == {f.name for f in dataclasses.fields(TaskResult)}
    again = _by_init(result)
    assert result == again
    assert repr(result) == repr(again)
    assert vars(result) == vars(again)
    for artifact in result.artifacts:
        assert set(vars(artifact)) == {f.name for f in dataclasses.fields(Artifact)}
        assert artifact == _by_init(artifact)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.state = "completed"  # type: ignore[misc]


def test_a_read_artifact_hashes_as_its_init_makes() -> None:
    artifact = artifact_from_json({"name": "n", "parts": [{"text": "a"}], "description": "d"})
    assert hash(artifact) == hash(Artifact(name="n", parts=("a",), description="d"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        artifact.name = "m"  # type: ignore[misc]


def test_the_answer_is_read_from_a_list_of_parts_and_artifacts_from_any() -> None:
    # The answer comes from a list of parts only (what the wire gives); ``artifacts`` keeps the
    # objects of any iterable, as artifact_from_json reads them (as at 19420e3).
    failed = TaskResult.from_json(_TASKS[1 + 1])
    assert (failed.state, failed.text, failed.data) == ("failed", "half", {})
    assert failed.error == {"reason": "failed", "message": "no"}
    assert failed.artifacts == (Artifact(name="partial", parts=("half", {})),)
    odd = TaskResult.from_json(
        {"status": {"state": "TASK_STATE_COMPLETED"}, "artifacts": [{"parts": ({"text": "t"},)}]}
    )
    assert (odd.text, odd.data) == ("", None)
    assert odd.artifacts == (Artifact(name="", parts=("t",)),)


def _settled_answer(**changes: Any) -> dict[str, Any]:
    """A typed skill's settled answer as a node's fast route writes it, with ``changes``
    (a member set to ``_GONE`` is left out)."""
    task: dict[str, Any] = {
        "id": "t-9",
        "contextId": "c-9",
        "status": {"state": "TASK_STATE_COMPLETED", "timestamp": "2026-12-02T21:50:38.191024Z"},
        "artifacts": [
            {
                "artifactId": "answer-t-9",
                "name": "score",
                "parts": [
                    {"data": {"score": 396.0, "applicant_id": "a-1", "tier": "D"}, "mediaType": "application/json"},
                    {"text": '{"applicant_id":"a-1","score":396,"tier":"D"}', "mediaType": "text/plain"},
                ],
            }
        ],
        "metadata": {"skill": "score", "usage": {"totalTokens": 0.0}, "childrenUsage": {}},
    }  # fmt: skip
    for name, value in changes.items():
        if value is _GONE:
            del task[name]
        else:
            task[name] = value
    return task


_GONE: Any = object()
_PARTS = _settled_answer()["artifacts"][0]["parts"]


def _artifact(**changes: Any) -> list[dict[str, Any]]:
    artifact = {"artifactId": "a", "name": "score", "parts": _PARTS, **changes}
    return [{k: v for k, v in artifact.items() if v is not _GONE}]


# The settled answer and shapes near it: each read as the general walk reads it.
_NEAR_SETTLED: list[dict[str, Any]] = [
    _settled_answer(),
    _settled_answer(id=None, contextId=""),
    _settled_answer(id=7),
    _settled_answer(contextId=_GONE),
    _settled_answer(extra=1),
    _settled_answer(metadata={}),
    _settled_answer(metadata={"skill": "other"}),
    _settled_answer(metadata=[]),
    _settled_answer(status={"state": "TASK_STATE_COMPLETED", "timestamp": None}),
    _settled_answer(status={"state": "TASK_STATE_COMPLETED"}),
    _settled_answer(status={"state": "TASK_STATE_FAILED", "timestamp": "t"}),
    _settled_answer(status={"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": "t"}),
    _settled_answer(status={"state": "TASK_STATE_COMPLETED", "timestamp": "t", "message": {}}),
    _settled_answer(status=[]),
    _settled_answer(artifacts=[]),
    _settled_answer(artifacts=_artifact() * 2),
    _settled_answer(artifacts=(_artifact()[0],)),
    _settled_answer(artifacts=_artifact(name="")),
    _settled_answer(artifacts=_artifact(name="other")),
    _settled_answer(artifacts=_artifact(name=None)),
    _settled_answer(artifacts=_artifact(artifactId=_GONE)),
    _settled_answer(artifacts=_artifact(description="d")),
    _settled_answer(artifacts=_artifact(parts=tuple(_PARTS))),
    _settled_answer(artifacts=_artifact(parts=_PARTS[:1])),
    _settled_answer(artifacts=_artifact(parts=_PARTS[::-1])),
    _settled_answer(artifacts=_artifact(parts=[*_PARTS, {"text": "more"}])),
    _settled_answer(artifacts=_artifact(parts=[{"data": [1.0, 2.5], "mediaType": "x"}, _PARTS[1]])),
    _settled_answer(artifacts=_artifact(parts=[{"data": {"n": {"m": 2.0}, "l": [3.0]}, "mediaType": "x"}, _PARTS[1]])),
    _settled_answer(artifacts=_artifact(parts=[_PARTS[0], {"text": 5, "mediaType": "x"}])),
    _settled_answer(artifacts=_artifact(parts=[_PARTS[0], {"text": "t"}])),
    _settled_answer(artifacts=_artifact(parts=[{"data": {"a": 1.0}}, _PARTS[1]])),
    _settled_answer(artifacts=_artifact(parts=[{"data": {}, "mediaType": "x", "y": 1}, _PARTS[1]])),
]  # fmt: skip


@pytest.mark.parametrize("task", _NEAR_SETTLED)
def test_the_settled_answer_reads_as_the_walk_reads_it(
    task: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settled typed answer's own reading (``_settled``) gives what the general walk
    gives, for it and for every shape near it (which the walk reads)."""
    import mesh._a2a.results as results

    fast = TaskResult.from_json(task)
    monkeypatch.setattr(results, "_settled", lambda task: None)
    walked = TaskResult.from_json(task)
    assert fast == walked
    for field in dataclasses.fields(TaskResult):
        assert type(getattr(fast, field.name)) is type(getattr(walked, field.name)), field.name
    assert fast.artifacts == walked.artifacts
    assert [type(p) for a in fast.artifacts for p in a.parts] == [
        type(p) for a in walked.artifacts for p in a.parts
    ]
    assert fast.data == walked.data
    assert repr(fast.data) == repr(walked.data)
    assert fast.metadata is not task.get("metadata")  # a copy, as the walk's


def test_the_settled_answer_takes_its_own_reading() -> None:
    import mesh._a2a.results as results

    assert results._settled(_settled_answer()) is not None
    assert results._settled(_settled_answer(extra=1)) is None
