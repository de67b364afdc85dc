"""remote()'s answer shapes through a node turn's blocking send: ``durable_children`` in the call's
metadata and a deadline past ``long_after_s``, so each call is the send that would go long if
still open after 5 s (since s37c written in line in ``Delegation._attempt``, not a coroutine
of its own). tests/test_attack_s36.py's ~90 answers (settled, each member changed in turn,
failed, rejected, asking, direct messages, JSON-RPC errors, envelopes, escapes): the value or
the error, the requests sent, metrics and log lines are the tree before's (``BEFORE``)."""

from __future__ import annotations

import pytest

from tests import test_attack_s36 as s36
from tests.test_attack_s36 import Trees, trees  # noqa: F401 - the fixture, used by name

# The answers driver's call context and toolset, as a node's LLM turn calls (durable children,
# the toolset's own 30 s deadline: the blocking send is the one that may go long).
_CTX = 'metadata={"deadline": time.time() + 30, "usage_sink": [], "task_id": f"t-{i}", **meta})'
_TURN_CTX = (
    'metadata={"deadline": time.time() + 30, "usage_sink": [], "task_id": f"t-{i}", '
    '"durable_children": True, **meta})'
)
_CALLS = "deadline_s=5.0, metas=None"
_TURN_CALLS = "deadline_s=30.0, metas=None"


def _turn_driver() -> str:
    source = s36._ANSWERS_DRIVER
    assert source.count(_CTX) == 1
    assert source.count(_CALLS) == 1
    return source.replace(_CTX, _TURN_CTX).replace(_CALLS, _TURN_CALLS)


@pytest.mark.integration
def test_answers_of_every_shape_through_a_turns_blocking_send_are_the_tree_before(
    trees: Trees,  # noqa: F811 - the fixture
) -> None:
    now, before = s36._both(trees, _turn_driver(), "answers")
    assert now["settled"][0][0][0][0] == "ok", now["settled"]
    assert s36._diff_cases(now, before) == [], s36._diff_cases(now, before)
    s36._same(now, before)
