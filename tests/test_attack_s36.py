"""Attack cases (session 36) on this session's changes, each claiming no behaviour change:

* the typed specialist's fast path (helper A: the glue from the fast route to the dispatcher;
  helper D: the stored task's bytes);
* the coordinator's delegation client (helper C: the request's body, the answer's parse, the
  metric series looked up while the peer works).

Each driver runs in a process of each tree: this checkout ("now") and ``git archive dd406de``
("before", the session's base), with PYTHONSAFEPATH=1 (``tests.test_attack_s35._env``): ``python
-c`` puts the working directory first on sys.path, and a child started in the checkout would
import the checkout's ``mesh`` before PYTHONPATH's tree. Sessions 33 to 35's drivers (each a
comparison of two trees) run again here against this session's base.

A test that passes guards behaviour that held; one marked ``xfail(strict=True)`` is a break
(the tree before, ``git archive dd406de``, behaves otherwise; each says how and which commit);
a break fixed since is a passing test naming the commit that broke it and the one that fixed it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import test_attack_s33 as s33
from tests import test_attack_s34 as s34
from tests import test_attack_s35 as s35
from tests.support import ROOT, archived_tree

BEFORE = "dd406de"
#: The tree "now" runs: this checkout, or (S36_NOW) another, say a ``git archive HEAD``, to
#: tell committed changes from a shared checkout's edits in progress.
NOW = Path(os.environ.get("S36_NOW", str(ROOT)))


@dataclass
class Trees:
    """Where the driver scripts run, and the tree of ``BEFORE`` (``git archive``)."""

    work: Path
    before: Path

    def path(self, side: str) -> str:
        return str(self.before) if side == "before" else str(NOW)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> Trees:
    tmp = tmp_path_factory.mktemp("s36-trees")
    return Trees(tmp, archived_tree(BEFORE, tmp / "before"))


_all = s35._all
_same = s35._same


def _both(
    trees: Trees, source: str, *args: str, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    now, before = _all(trees, [("now", source, args), ("before", source, args)], env)  # type: ignore[arg-type]
    return now, before


# --- sessions 33 to 35's comparisons, against this session's base ------------------------------


@pytest.mark.integration
def test_typed_requests_of_odd_values_are_answered_and_stored_as_the_tree_before(
    trees: Trees,
) -> None:
    """s34's odd typed requests (numbers, duplicate keys, nesting, metadata shapes, invalid
    input, skill errors; JSON-RPC and REST; GetTask, a restart, the stored rows)."""
    now, before = _both(trees, s34._TYPED_DRIVER)
    assert len(now["answers"]) > 600
    _same(now, before)


@pytest.mark.integration
def test_odd_request_shapes_are_answered_as_the_tree_before(trees: Trees) -> None:
    """s34's 26 part lists under 12 metadata shapes, JSON-RPC and REST, none a 500."""
    now, before = _both(trees, s34._SHAPES_DRIVER)
    assert {answer[-1][0] for answer in now["answers"]} == {200, 400}
    _same(now, before)


@pytest.mark.integration
def test_released_progress_and_asking_typed_runs_are_the_tree_before(trees: Trees) -> None:
    """s34's typed runs released while they await, report progress or ask: every answer,
    event and read (and after a restart)."""
    now, before = _both(trees, s34._HELD_DRIVER)
    _same(now, before)
    now, before = _both(trees, s34._PROGRESS_DRIVER)
    _same(now, before)


@pytest.mark.integration
def test_typed_answers_and_settled_texts_are_the_tree_before(trees: Trees) -> None:
    """s33's typed answers (flat values of every kind, 300 key sets, values the walk refuses,
    direct replies, attachments; JSON-RPC, REST, GetTask; metadata shapes), each written from a
    Settled also walked in this tree."""
    now, before = _both(trees, s33._FAST_DRIVER)
    assert now.pop("differ") == []
    assert now.pop("settled") > 300
    before.pop("differ")
    before.pop("settled")
    _same(now, before)


@pytest.mark.integration
def test_every_requests_line_and_metrics_are_there_right_after_its_answer(trees: Trees) -> None:
    """s35's post-answer work seen right after each answer (a scrape, the log lines): success,
    failures, invalid input, REST, direct replies, an ask and its answer, a deadline, a cancel,
    a caller gone, a duplicate, 30 at once, 8 MB."""
    now, before = _both(trees, s35._AFTER_DRIVER, "main")
    _same(now, before)


@pytest.mark.integration
def test_remote_calls_are_the_tree_before(trees: Trees) -> None:
    """s34's remote() against a real node and 19 hostile peers (garbage, JSON-RPC errors,
    chunked, cut or reset mid-body, 5xx, 403, 404, 40 MB, slow past the deadline, gzip, a
    wrong content type), 40 calls in flight, a 3 MB argument: answers, errors, retries,
    breaker, metrics and every mesh log line, with mesh serve's logging switch on."""
    now, before = _both(trees, s35._SERVE_LOGGING + s34._REMOTE_DRIVER, *s34._REMOTE_HELD)
    assert now["score"][0][0][0] == "ok"
    _same(now, before)


@pytest.mark.integration
def test_remote_failover_is_the_tree_before(trees: Trees) -> None:
    """s34's failover between the real node and a replica that resets, is refused, answers
    503 or garbage, or cuts its answer, in either order."""
    modes = ("rst_at_once", "refused", "s503", "garbage", "cut_mid_body", "rst_mid_body")
    now, before = _both(
        trees, s35._SERVE_LOGGING + s34._REMOTE_DRIVER, *(f"failover:{m}" for m in modes)
    )
    assert "ok" in json.dumps(now["failover:rst_at_once"])
    _same(now, before)


@pytest.mark.integration
def test_coordinator_turns_over_a2a_are_the_tree_before(trees: Trees) -> None:
    """s34's coordinator turns delegating over A2A to the bench's specialist."""
    now, before = _both(trees, s35._SERVE_LOGGING + s34._COORDINATOR_DRIVER)
    _same(now, before)


@pytest.mark.integration
def test_read_answers_and_sent_bodies_are_the_tree_before(trees: Trees) -> None:
    """s34's 3000 seeded task answers read by ``TaskResult.from_json`` and SendMessage bodies
    of odd values."""
    now, before = _both(trees, s34._RESULTS_DRIVER)
    _same(now, before)
    now, before = _both(trees, s34._BODY_DRIVER)
    _same(now, before)


@pytest.mark.integration
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_many_posts_in_flight_end_as_the_tree_before(trees: Trees, loop: str) -> None:
    """s34's 400 seeded posts over a pool of eight, each answered its own way."""
    now, before = _both(trees, s34._STORM_DRIVER, *(("uvloop",) if loop == "uvloop" else ()))
    _same(now, before)


@pytest.mark.integration
def test_pool_answers_and_failures_are_the_tree_before(trees: Trees) -> None:
    """s34's DirectPool scenarios (textbook answers, chunked, cut, reset, slow, stale kept
    connections, peers closing every connection)."""
    now, before = _both(trees, s34._POOL_DRIVER, *s34.HELD)
    _same(now, before)


@pytest.mark.integration
def test_a_database_of_either_tree_is_read_listed_continued_and_swept_alike(
    trees: Trees, tmp_path: Path
) -> None:
    """s35's store driver: a node.db made by each tree (36 typed requests of odd values, three
    contexts, failures, a duplicate), read by each on a copy: every GetTask, ListTasks page,
    trace row, duplicate before and after a restart, new task, retention's choice; the base
    tree reading this tree's database reads what it reads of its own."""
    made_now, made_before = _all(
        trees,  # type: ignore[arg-type]
        [
            ("now", s35._STORE_DRIVER, ("make", str(tmp_path / "made-now"))),
            ("before", s35._STORE_DRIVER, ("make", str(tmp_path / "made-before"))),
        ],
    )
    _same(made_now, made_before)
    for made in ("now", "before"):
        for side in ("now", "before"):
            shutil.copytree(tmp_path / f"made-{made}", tmp_path / f"{made}-read-by-{side}")
    reads = _all(
        trees,  # type: ignore[arg-type]
        [
            (side, s35._STORE_DRIVER, ("read", str(tmp_path / f"{made}-read-by-{side}")))
            for made in ("now", "before")
            for side in ("now", "before")
        ],
    )
    now_now, now_before, before_now, before_before = reads
    for out in reads:
        assert out.pop("integrity") == "ok"
        out.pop("plans")
    _same(before_now, before_before)
    # Made by the other tree: its ids its own, so ties in time fall in another order.
    _same(s35._unordered(now_before), s35._unordered(before_before))
    _same(s35._unordered(now_now), s35._unordered(before_before))
