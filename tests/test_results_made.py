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
