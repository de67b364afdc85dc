"""Attack cases (session 36) on this session's changes, each claiming no behaviour change:

* the typed specialist's fast path (helper A: the glue from the fast route to the dispatcher;
  helper D: the stored task's bytes);
* the coordinator's delegation client (helper C: the request's body, the answer's parse, the
  metric series looked up while the peer works).

Attacked: 204c676, 77432ed, d661cf6 (the route's glue: call context, REQUIRED check, request
context, message key, named skill), 2520401 (models through pydantic's validator directly;
InFlight), 807108e (the settled answer's parse), 6c815d2 (the metric series), a4c0887 (usage),
6034858 (the settled task's wire bytes as its row). One break: 2520401's per-model decision,
fixed in session 37 (``dispatcher._plain`` decides on each call again).

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
from tests.attack_prelude import ASK_IDS, SPAN_IDS, prelude, quieted
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


def _in_turn(trees: Trees, source: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``_both``, one tree's process after the other's: for drivers whose calls race a deadline
    of a second (20 at once, retries with backoff), which a loaded host decides otherwise when
    the two run side by side."""
    (now,) = _all(trees, [("now", source, args)])  # type: ignore[arg-type]
    (before,) = _all(trees, [("before", source, args)])  # type: ignore[arg-type]
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
    now, before = _both(trees, quieted(s35._AFTER_DRIVER), "main")
    _same(now, before)


@pytest.mark.integration
def test_remote_calls_are_the_tree_before(trees: Trees) -> None:
    """s34's remote() against a real node and 19 hostile peers (garbage, JSON-RPC errors,
    chunked, cut or reset mid-body, 5xx, 403, 404, 40 MB, slow past the deadline, gzip, a
    wrong content type), 40 calls in flight, a 3 MB argument: answers, errors, retries,
    breaker, metrics and every mesh log line, with mesh serve's logging switch on."""
    source = s35._SERVE_LOGGING + quieted(s34._REMOTE_DRIVER)
    now, before = _in_turn(trees, source, *s34._REMOTE_HELD)
    assert now["score"][0][0][0] == "ok"
    _same(now, before)


@pytest.mark.integration
def test_remote_failover_is_the_tree_before(trees: Trees) -> None:
    """s34's failover between the real node and a replica that resets, is refused, answers
    503 or garbage, or cuts its answer, in either order."""
    modes = ("rst_at_once", "refused", "s503", "garbage", "cut_mid_body", "rst_mid_body")
    source = s35._SERVE_LOGGING + quieted(s34._REMOTE_DRIVER)
    now, before = _in_turn(trees, source, *(f"failover:{m}" for m in modes))
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
def test_delegation_lines_and_records_are_the_tree_before(trees: Trees) -> None:
    """s35's delegation line under mesh serve's logging: its text and record (every attribute
    but the times) with the logging changed while the peer works, a record factory installed
    then, thread and process fields turned on then (helper C's ``_Line.prepare``, which also
    looks up the call's metric series)."""
    for mode in ("main", "factory", "threads"):
        now, before = _in_turn(trees, s35._LINE_DRIVER, mode)
        assert before["res"][0][2], before["res"][0]  # a line
        _same(now, before)


@pytest.mark.integration
def test_a_node_behind_a_slow_reader_counts_logs_and_drains_as_before(trees: Trees) -> None:
    """s35's node whose answer waits for a slow reader: the task counted, in flight and logged
    as before, and a drain then (2520401's InFlight without its Event)."""
    runs = [
        (side, s35._SLOW_READER_DRIVER, (mode,))
        for mode in ("read", "drain")
        for side in ("now", "before")
    ]
    now_read, before_read, now_drain, before_drain = _all(trees, runs)  # type: ignore[arg-type]
    assert before_read["b_completed"]
    _same(now_read, before_read)
    _same(now_drain, before_drain)


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


# --- helper C: the answer's parse (a fast one for the settled shape), the metric series ------
#
# A fake peer serving a real node's card (skills ``score`` and ``anys``) answers each
# SendMessage with a text of its own: the settled answer a mesh node writes (as it writes it),
# then each member of it changed one at a time (states, artifacts, parts, names, extra and
# missing members, key order, whitespace, escapes, duplicate keys, numbers spelled 1e3, 1.0, big
# ints, NaN) and other answers (a direct message, a wrong id, a BOM, trailing bytes, content
# types). remote() reads each: its value or error (type, message, reason), the request the peer
# got, the caller's metrics and log lines; ``TaskResult.from_json`` of each task besides.

_ANSWERS_DRIVER = (
    prelude(SPAN_IDS, traces=False)
    + r'''
import asyncio, json, logging, re, sys, tempfile, time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel

import mesh
from mesh import Agent, skill
from mesh._a2a.results import TaskResult
from mesh._asks import ChildWaiting
from mesh._metrics import NodeMetrics
from mesh._netguard import create_http_client
from mesh._netpolicy import NetworkPolicy
from mesh._node import Node
from mesh._remote import remote
from mesh._settings import NodeSettings
from mesh._tools import ToolContext
from mesh._trust import PeerTrust
from tests.support import free_port, uvicorn_serving

PORTS = re.compile(r"127\.0\.0\.1:\d+")
FLOATS = re.compile(r"\d+\.\d+ ?(ms|s)\b|duration_ms=[\d.]+|/tmp/[\w/.-]+")
VARIES = re.compile(r'"deadline": ?[\d.e+-]+|Content-Length: \d+|"id": ?\d+')
DEADLINE = re.compile(r'"deadline": ?([^,}]+)')


def canon(text):
    text = VARIES.sub("<varies>", text)
    return FLOATS.sub("<dur>", PORTS.sub("<host>", scrub(text)))


class In(BaseModel):
    applicant_id: str
    amount: float


class Out(BaseModel):
    applicant_id: str
    score: int
    ratio: float
    tags: list[str]


@skill
def score(req: In) -> Out:
    """Score."""
    return Out(applicant_id=req.applicant_id, score=7, ratio=0.5, tags=["a"])


class Anys(BaseModel):
    v: Any = None


@skill
def anys(req: Anys) -> Anys:
    """Anything."""
    return req


agent = Agent(name="s36-peer", description="Answers.", skills=[score, anys])

DATA = '{"applicant_id":"x","score":7.0,"ratio":0.5,"tags":["a"]}'
TEXT = json.dumps('{"applicant_id":"x","score":7,"ratio":0.5,"tags":["a"]}')
ART = '{"artifactId":"answer-T","name":"score","parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"}]}'
META = '{"caller":"c","usage":{"totalTokens":0.0},"traceparent":"00-ac60b376755dbd55731ef89e45c14fbb-77de7bba4434b1ef-01","childrenUsage":{},"skill":"score"}'
STATUS = '{"state":"TASK_STATE_COMPLETED","timestamp":"2026-12-02T22:22:27.673352Z"}'


def settled(data=DATA, text=TEXT, art=None, meta=META, status=STATUS, extra="", task_extra="", artifacts=None):
    art = art if art is not None else ART % (data, text)
    artifacts = artifacts if artifacts is not None else "[%s]" % art
    task = ('{"id":"T","contextId":"C","status":%s,"artifacts":%s%s,"metadata":%s}'
            % (status, artifacts, task_extra, meta))
    return '{"result":{"task":%s}%s,"id":RID,"jsonrpc":"2.0"}' % (task, extra)


def status(state, message=None, ts=True):
    s = '{"state":"%s"' % state
    if message is not None:
        s += ',"message":%s' % message
    if ts:
        s += ',"timestamp":"2026-12-02T22:22:27.673352Z"'
    return s + "}"


QUESTION = ('{"messageId":"q","role":"ROLE_AGENT","parts":[{"text":"which one?"},{"data":{"type":"object",'
            '"properties":{"ok":{"type":"boolean"}}},"mediaType":"application/schema+json"}]}')
ERRMETA = '{"skill":"score","error":{"reason":"%s","message":"it broke \\u00e9"}}'

CASES = {
    "settled": settled(),
    "settled_history": settled(task_extra=',"history":[{"messageId":"h","role":"ROLE_AGENT","parts":[{"text":"running"}]}]'),
    "pretty": None,  # settled(), indented
    "reordered": None,  # settled(), every object's keys reversed
    "spaced": settled().replace(":", ": ").replace(",", ", "),
    "escaped_key": settled().replace('"contextId"', '"\\u0063ontextId"'),
    "escaped_values": settled(data='{"applicant_id":"a\\"b\\\\c\\u00e9\\ud83d\\ude42\\u2028\\/","score":7,"ratio":0.5,"tags":["\\n"]}'),
    "unicode_raw": settled(data='{"applicant_id":"\u00e9\U0001f642","score":7,"ratio":0.5,"tags":[]}'),
    "dup_state": settled(status='{"state":"TASK_STATE_FAILED","state":"TASK_STATE_COMPLETED","timestamp":"2026-12-02T22:22:27Z"}'),
    "dup_data": settled(data='{"applicant_id":"x","score":7,"score":8.0,"ratio":0.5,"tags":["a"]}'),
    "num_1e3": settled(data='{"applicant_id":"x","score":1e3,"ratio":1E0,"tags":[]}'),
    "num_1_0": settled(data='{"applicant_id":"x","score":1.0,"ratio":1.0,"tags":[]}'),
    "num_big": settled(data='{"applicant_id":"x","score":123456789012345678901234567890,"ratio":9007199254740993,"tags":[]}'),
    "num_2_53": settled(data='{"applicant_id":"x","score":9007199254740992.0,"ratio":-0.0,"tags":[]}'),
    "num_2_53_up": settled(data='{"applicant_id":"x","score":9007199254740994.0,"ratio":-0,"tags":[]}'),
    "num_frac": settled(data='{"applicant_id":"x","score":7.5,"ratio":0.1,"tags":[]}'),
    "num_nan": settled(data='{"applicant_id":"x","score":7,"ratio":NaN,"tags":[]}'),
    "num_inf": settled(data='{"applicant_id":"x","score":7,"ratio":1e400,"tags":[]}'),
    "num_string": settled(data='{"applicant_id":"x","score":"7","ratio":0.5,"tags":[]}'),
    "nested": settled(data='{"applicant_id":"x","score":7,"ratio":0.5,"tags":[],"more":{"a":[1.0,{"b":2.0}],"c":{}}}'),
    "data_empty": settled(data='{}'),
    "data_list": settled(data='[1,2]'),
    "data_null": settled(data='null'),
    "text_not_json": settled(text='"hello"'),
    "text_empty": settled(text='""'),
    "text_number": settled(text='5'),
    "failed": settled(status=status("TASK_STATE_FAILED"), artifacts="[]", meta=ERRMETA % "failed"),
    "failed_no_meta": settled(status=status("TASK_STATE_FAILED", '{"messageId":"e","role":"ROLE_AGENT","parts":[{"text":"down"}]}'), artifacts="[]", meta='{}'),
    "failed_with_artifact": settled(status=status("TASK_STATE_FAILED")),
    "rejected": settled(status=status("TASK_STATE_REJECTED"), artifacts="[]", meta=ERRMETA % "invalid_input"),
    "canceled": settled(status=status("TASK_STATE_CANCELED"), artifacts="[]", meta=ERRMETA % "canceled"),
    "unavailable": settled(status=status("TASK_STATE_FAILED"), artifacts="[]", meta=ERRMETA % "unavailable"),
    "input_required": settled(status=status("TASK_STATE_INPUT_REQUIRED", QUESTION), artifacts="[]", meta='{"skill":"score"}'),
    "auth_required": settled(status=status("TASK_STATE_AUTH_REQUIRED", QUESTION), artifacts="[]", meta='{"skill":"score"}'),
    "working": settled(status=status("TASK_STATE_WORKING"), artifacts="[]"),
    "submitted": settled(status=status("TASK_STATE_SUBMITTED"), artifacts="[]"),
    "unspecified": settled(status=status("TASK_STATE_UNSPECIFIED")),
    "unknown_state": settled(status=status("TASK_STATE_SOMETHING")),
    "state_lower": settled(status=status("completed")),
    "state_number": settled(status='{"state":3,"timestamp":"2026-12-02T22:22:27Z"}'),
    "no_timestamp": settled(status='{"state":"TASK_STATE_COMPLETED"}'),
    "timestamp_null": settled(status='{"state":"TASK_STATE_COMPLETED","timestamp":null}'),
    "timestamp_number": settled(status='{"state":"TASK_STATE_COMPLETED","timestamp":5}'),
    "status_message": settled(status=status("TASK_STATE_COMPLETED", '{"messageId":"s","role":"ROLE_AGENT","parts":[{"text":"done"}]}')),
    "status_extra": settled(status='{"state":"TASK_STATE_COMPLETED","timestamp":"2026-12-02T22:22:27Z","x":1}'),
    "status_list": settled(status='[]'),
    "three_parts": settled(art='{"artifactId":"a","name":"score","parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"},{"data":{"x":1},"mediaType":"application/json"}]}' % (DATA, TEXT)),
    "parts_reversed": settled(art='{"artifactId":"a","name":"score","parts":[{"text":%s,"mediaType":"text/plain"},{"data":%s,"mediaType":"application/json"}]}' % (TEXT, DATA)),
    "data_only": settled(art='{"artifactId":"a","name":"score","parts":[{"data":%s,"mediaType":"application/json"}]}' % DATA),
    "text_only": settled(art='{"artifactId":"a","name":"score","parts":[{"text":%s,"mediaType":"text/plain"}]}' % TEXT),
    "no_media_types": settled(art='{"artifactId":"a","name":"score","parts":[{"data":%s},{"text":%s}]}' % (DATA, TEXT)),
    "other_media_types": settled(art='{"artifactId":"a","name":"score","parts":[{"data":%s,"mediaType":"text/plain"},{"text":%s,"mediaType":"application/json"}]}' % (DATA, TEXT)),
    "part_extra": settled(art='{"artifactId":"a","name":"score","parts":[{"data":%s,"mediaType":"application/json","metadata":{}},{"text":%s,"mediaType":"text/plain"}]}' % (DATA, TEXT)),
    "part_file": settled(art='{"artifactId":"a","name":"score","parts":[{"data":%s,"mediaType":"application/json"},{"raw":"iVBO","mediaType":"image/png"}]}' % DATA),
    "name_other": settled(art=ART.replace('"score"', '"other"') % (DATA, TEXT)),
    "name_missing": settled(art='{"artifactId":"a","parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"}]}' % (DATA, TEXT)),
    "name_number": settled(art='{"artifactId":"a","name":5,"parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"}]}' % (DATA, TEXT)),
    "name_null": settled(art='{"artifactId":"a","name":null,"parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"}]}' % (DATA, TEXT)),
    "artifact_description": settled(art='{"artifactId":"a","name":"score","description":"d","parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"}]}' % (DATA, TEXT)),
    "artifact_no_id": settled(art='{"name":"score","parts":[{"data":%s,"mediaType":"application/json"},{"text":%s,"mediaType":"text/plain"}]}' % (DATA, TEXT)),
    "two_artifacts": settled(artifacts="[%s,%s]" % (ART.replace('"score"', '"note"') % ('{"n":1}', '"n"'), ART % (DATA, TEXT))),
    "two_artifacts_unnamed": settled(artifacts="[%s,%s]" % (ART.replace('"score"', '"note"') % ('{"n":1}', '"n"'), ART.replace('"score"', '"x"') % (DATA, TEXT))),
    "no_artifacts": settled(artifacts="[]"),
    "artifacts_null": settled(artifacts="null"),
    "artifacts_missing": settled().replace(',"artifacts":[%s]' % (ART % (DATA, TEXT)), ""),
    "meta_missing": settled().replace(',"metadata":' + META, ""),
    "meta_null": settled(meta="null"),
    "meta_list": settled(meta="[]"),
    "meta_empty": settled(meta="{}"),
    "meta_usage": settled(meta='{"skill":"score","usage":{"inputTokens":5.0,"outputTokens":7,"totalTokens":12.0},"childrenUsage":{"x":{"totalTokens":3}}}'),
    "meta_usage_legacy": settled(meta='{"skill":"score","usage":{"input_tokens":3,"outputTokens":2.0},"children_usage":{"totalTokens":4,"thinking_tokens":1}}'),
    "meta_usage_both": settled(meta='{"usage":{"totalTokens":1},"childrenUsage":{"totalTokens":2},"children_usage":{"totalTokens":5}}'),
    "meta_usage_null": settled(meta='{"usage":null,"childrenUsage":null,"children_usage":{"inputTokens":7}}'),
    "meta_usage_odd": settled(meta='{"usage":{"inputTokens":true,"x":"1"},"childrenUsage":[]}'),
    "meta_error_completed": settled(meta='{"skill":"score","error":{"reason":"failed","message":"m"}}'),
    "meta_skill_other": settled(meta='{"skill":"other"}'),
    "task_kind": settled(task_extra=',"kind":"task"'),
    "id_empty": settled().replace('"id":"T"', '"id":""'),
    "id_number": settled().replace('"id":"T"', '"id":5'),
    "id_null": settled().replace('"id":"T"', '"id":null'),
    "context_missing": settled().replace('"contextId":"C",', ""),
    "result_extra": settled(extra=',"x":1'),
    "wrong_rpc_id": settled().replace("RID", "999999"),
    "no_jsonrpc": settled().replace(',"jsonrpc":"2.0"', ""),
    "message": '{"result":{"message":{"messageId":"m","contextId":"C","role":"ROLE_AGENT","parts":[{"data":%s,"mediaType":"application/json"},{"text":%s}],"metadata":{"skill":"score"}}},"id":RID,"jsonrpc":"2.0"}' % (DATA, TEXT),
    "task_and_message": settled().replace('"result":{', '"result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[]},'),
    "task_null": '{"result":{"task":null},"id":RID,"jsonrpc":"2.0"}',
    "task_list": '{"result":{"task":[]},"id":RID,"jsonrpc":"2.0"}',
    "result_and_error": settled(extra=',"error":{"code":-32603,"message":"both"}'),
    "error_data": '{"error":{"code":-32602,"message":"Invalid params","data":{"field":"amount"}},"id":RID,"jsonrpc":"2.0"}',
    "error_task_not_found": '{"error":{"code":-32001,"message":"Task not found"},"id":RID,"jsonrpc":"2.0"}',
    "data_tricky": settled(data='{"applicant_id":"\\\",\\\"status\\\":{\\\"state\\\":\\\"TASK_STATE_FAILED\\\"}}],","score":7,"ratio":0.5,"tags":["}]}","\\"parts\\"",""]}'),
    "text_tricky": settled(text=json.dumps('"}],"metadata":{"error":{"reason":"failed"}}}')),
    "data_task_keys": settled(data='{"applicant_id":"x","score":7,"ratio":0.5,"tags":[],"id":"I","status":{"state":"TASK_STATE_FAILED"},"artifacts":[],"metadata":{"error":1},"contextId":"Q"}'),
    "data_escaped_key": settled(data='{"\\u0061pplicant_id":"x","score":7,"ratio":0.5,"tags":[]}'),
    "num_upper_exp": settled(data='{"applicant_id":"x","score":7E0,"ratio":-0E0,"tags":[]}'),
    "num_trailing_zeros": settled(data='{"applicant_id":"x","score":7.000,"ratio":0.50,"tags":[]}'),
    "num_bool": settled(data='{"applicant_id":"x","score":true,"ratio":false,"tags":[]}'),
    "parts_keys_reversed": settled(art='{"parts":[{"mediaType":"application/json","data":%s},{"mediaType":"text/plain","text":%s}],"name":"score","artifactId":"a"}' % (DATA, TEXT)),
    "status_keys_reversed": settled(status='{"timestamp":"2026-12-02T22:22:27.673352Z","state":"TASK_STATE_COMPLETED"}'),
    "meta_tricky": settled(meta='{"skill":"score","note":"\\"}],\\"state\\":\\"TASK_STATE_FAILED","error":null}'),
    "bom": "\ufeff" + settled(),
    "trailing": settled() + " x",
    "trailing_space": settled() + " \n",
    "ctype_charset": settled(),
    "ctype_a2a": settled(),
    "ctype_none": settled(),
}
CTYPES = {"ctype_charset": b"application/json; charset=utf-8", "ctype_a2a": b"application/a2a+json", "ctype_none": None}


def reorder(value):
    if isinstance(value, dict):
        return {k: reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(v) for v in value]
    return value


CASES["pretty"] = json.dumps(json.loads(settled().replace("RID", "0")), indent=2).replace('"id": 0', '"id": RID')
CASES["reordered"] = json.dumps(reorder(json.loads(settled().replace("RID", "0"))), separators=(",", ":")).replace('"id":0', '"id":RID')


def reply(body, ctype=b"application/json"):
    head = b"HTTP/1.1 200 OK\r\n"
    if ctype is not None:
        head += b"Content-Type: %s\r\n" % ctype
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


async def fake_peer(box):
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                if head.startswith(b"GET"):
                    writer.write(reply(box["card"]))
                    await writer.drain()
                    continue
                lines = sorted(canon(l.decode("latin-1")) for l in head.split(b"\r\n")[1:] if l)
                box["requests"].append([lines, canon(body.decode())])
                found = DEADLINE.search(body.decode())
                box.setdefault("deadlines", []).append(found[1] if found else None)
                request = json.loads(body)
                answer = box["answer"]
                if answer is None:  # by the call: the case its applicant_id names
                    answer = CASES[request["params"]["message"]["parts"][0]["data"]["applicant_id"]]
                text = answer.replace("RID", json.dumps(request.get("id")))
                writer.write(reply(text.encode("utf-8", "surrogatepass"), box.get("ctype", b"application/json")))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass

    return await asyncio.start_server(handle, "127.0.0.1", 0)


LOGS = Logs()


def ctx_for(i, **meta):
    return ToolContext(agent_name="s36-coordinator", user_id="a2a", session_id=f"s-{i}", invocation_id=f"i-{i}",
                       metadata={"deadline": time.time() + 30, "usage_sink": [], "task_id": f"t-{i}", **meta})


async def calls(url, skill_id, argsets, deadline_s=5.0, metas=None, real=False, box=None):
    """Each args in turn over one toolset (its pool, its templates): outcomes, metrics, lines.
    ``real``: a node answers, its values' members sorted (a Struct's order is the process's)."""
    LOGS.lines = []
    anywhere = NetworkPolicy.parse("any")
    http = create_http_client(anywhere, timeout=httpx.Timeout(35.0, connect=2.0))
    registry = CollectorRegistry()
    toolset = remote("s36-peer", skill=skill_id, url=url, deadline_s=deadline_s)
    toolset.bind(http=http, metrics=NodeMetrics(registry, "s36-coordinator"), caller="s36-coordinator",
                 trust=PeerTrust(networks=anywhere))
    out = []
    try:
        for i, args in enumerate(argsets):
            ctx = ctx_for(i, **(metas[i % len(metas)]() if metas else {}))
            t0, sent = time.time(), len((box or {}).get("deadlines", []))
            try:
                (tool,) = await toolset.tools(ctx)
                got = await tool.call(args, ctx)
                out.append(["ok", canon(json.dumps(got, default=repr, sort_keys=real)), real or repr(got)])
            except (Exception, ChildWaiting) as exc:
                out.append(["error", type(exc).__name__, canon(str(exc)),
                            canon(json.dumps({k: getattr(exc, k, None) for k in ("reason", "peer", "skill", "detail", "kind")}, default=repr))])
            # sorted: a Struct's member order is the process's (its map's), in either tree
            out.append(["usage", canon(json.dumps(ctx.metadata.get("usage_sink"), default=repr, sort_keys=True))])
            if box is not None:  # the deadline sent: its text (the caller's own, or now + deadline_s)
                texts = box.get("deadlines", [])[sent:]
                caller = ctx.metadata.get("deadline")
                out.append(["deadline", [[t == json.dumps(float(caller)), t == repr(float(t)),
                                          0 < float(t) - t0 <= deadline_s + 1] for t in texts]])
    finally:
        await toolset.aclose()
        await http.aclose()
    metrics = []
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(("#", "process_", "python_")) or "_bucket" in line or "_sum" in line or "_created" in line:
            continue
        metrics.append(canon(line))
    return [out, metrics, LOGS.lines]


def sorted_keys(value):
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def read(case):
    """TaskResult.from_json of the case's task, as the client's json parse gives it."""
    text = CASES[case].replace("RID", "1").lstrip("\ufeff").strip()
    try:
        value = json.loads(text)
    except ValueError as exc:
        return ["not json", str(exc)]
    task = (value.get("result") or {}).get("task") if isinstance(value.get("result"), dict) else None
    if not isinstance(task, dict):
        return ["no task"]
    try:
        r = TaskResult.from_json(task)
    except Exception as exc:
        return ["raised", type(exc).__name__, str(exc)]
    return [repr(r), list(vars(r)), [repr(a) for a in r.artifacts],
            [[type(v).__name__ for v in (r.data or {}).values()]]]


async def main():
    logging.getLogger().addHandler(LOGS)
    logging.getLogger().setLevel(logging.DEBUG)
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=Path(tempfile.mkdtemp()), registry=None))
    url = f"http://127.0.0.1:{port}"
    result = {"mesh": mesh.__file__}
    async with uvicorn_serving(node.app, port, log_level="warning"):
        async with httpx.AsyncClient(trust_env=False) as http:
            card = (await http.get(url + "/.well-known/agent-card.json")).text
        which = sys.argv[1]
        if which == "answers":
            for case in CASES:  # a peer of its own each (its breaker's state its own)
                box = {"requests": [], "answer": CASES[case], "ctype": CTYPES.get(case, b"application/json")}
                server = await fake_peer(box)
                peer_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
                box["card"] = card.replace(url, peer_url).encode()
                try:
                    got = await calls(peer_url, "score", [{"applicant_id": "x", "amount": 1}, {"applicant_id": "y", "amount": 2.5}],
                                      box=box)
                finally:
                    server.close()
                result[case] = [got, box["requests"], read(case)]
        elif which == "storm":  # 120 calls in flight over one toolset, each its own answer
            box = {"requests": [], "answer": None}
            server = await fake_peer(box)
            peer_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            box["card"] = card.replace(url, peer_url).encode()
            names = ["settled", "reordered", "failed", "rejected", "input_required", "num_1e3", "two_artifacts",
                     "message", "text_only", "meta_usage", "error_data", "escaped_values"]
            LOGS.lines = []
            anywhere = NetworkPolicy.parse("any")
            http = create_http_client(anywhere, timeout=httpx.Timeout(35.0, connect=2.0))
            registry = CollectorRegistry()
            toolset = remote("s36-peer", skill="score", url=peer_url, deadline_s=20.0)
            toolset.bind(http=http, metrics=NodeMetrics(registry, "s36-coordinator"), caller="s36-coordinator",
                         trust=PeerTrust(networks=anywhere))
            ctxs = [ctx_for(i) for i in range(120)]
            try:
                (tool,) = await toolset.tools(ctxs[0])

                async def one(i):
                    try:
                        got = await tool.call({"applicant_id": names[i % len(names)], "amount": i}, ctxs[i])
                        return ["ok", names[i % len(names)], canon(json.dumps(got, default=repr))]
                    except (Exception, ChildWaiting) as exc:
                        return ["error", names[i % len(names)], type(exc).__name__, canon(str(exc))]

                got = await asyncio.gather(*(one(i) for i in range(120)))
            finally:
                await toolset.aclose()
                await http.aclose()
                server.close()
            metrics = sorted(canon(line) for line in generate_latest(registry).decode().splitlines()
                             if line.startswith("mesh_delegation") and "_bucket" not in line and "_created" not in line
                             and "_sum" not in line)
            result["storm"] = [sorted(json.dumps(g) for g in got), metrics, sorted(json.dumps(l) for l in LOGS.lines),
                               sorted(json.dumps(sorted_keys(c.metadata.get("usage_sink"))) for c in ctxs)]
        else:  # the bodies sent for odd arguments and call metadata, to the real node
            box = {"requests": []}
            server = await fake_peer(box)
            peer_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            box["card"] = card.replace(url, peer_url).encode()
            box["answer"] = ('{"result":{"task":{"id":"T","contextId":"C","status":{"state":"TASK_STATE_COMPLETED"},'
                             '"artifacts":[{"artifactId":"a","name":"anys","parts":[{"data":{"v":1}}]}],"metadata":{}}},"id":RID,"jsonrpc":"2.0"}')
            values = [1, 1.0, -0.0, 1e3, 2**64, -(2**70), 0.1, 5e-324, 1.7976931348623157e308, True, None, "", "\u00e9\U0001f642\u2028",
                      "a\"b\\c\n\t\x00\x7f</script>", [], {}, [1, [2, [3]]], {"b": 1, "a": 2}, {"": {"": []}}, "x" * 70000,
                      {"k" * 300: 1}, [None, True, 1.5, "s"], float("nan"), float("inf")]
            metas = [dict, lambda: {"traceparent": "00-" + "12" * 16 + "-" + "34" * 8 + "-01"},
                     lambda: {"durable_children": True}, lambda: {"deadline": time.time() + 2.5},
                     lambda: {"deadline": int(time.time()) + 3, "caller": "\u00e9"}, lambda: {"deadline": 1e20},
                     lambda: {"deadline": time.time() + 4.000001, "task_id": "t-\u00e9"}]
            got = await calls(peer_url, "anys", [{"v": v} for v in values], metas=metas, box=box)
            result["bodies"] = [got, box["requests"]]
            # the same arguments to the real node, through one toolset
            got = await calls(url, "anys", [{"v": v} for v in values if not (isinstance(v, float) and v != v)], metas=metas, real=True)
            result["real"] = got
            got = await calls(url, "score", [{"applicant_id": "a", "amount": 1}, {"applicant_id": "b", "amount": 1e3},
                                             {"applicant_id": "c"}, {"applicant_id": 5, "amount": 1}, {"applicant_id": "d", "amount": "1"},
                                             {"applicant_id": "e", "amount": 2**64}, {"applicant_id": "f", "amount": 1, "extra": 1}], real=True)
            result["score"] = got
            server.close()
    print(json.dumps(result))


asyncio.run(main())
'''
)


def _diff_cases(now: dict[str, Any], before: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))


@pytest.mark.integration
def test_answers_of_every_shape_are_read_as_the_tree_before(trees: Trees) -> None:
    """remote() meets the settled answer and ~90 others (each member changed in turn, other
    states, parts, names, key orders, escapes, numbers, JSON-RPC envelopes): the value or the
    error, the request sent, metrics and log lines, and ``TaskResult.from_json``'s object."""
    now, before = _both(trees, _ANSWERS_DRIVER, "answers")
    assert now["settled"][0][0][0][0] == "ok", now["settled"]
    assert _diff_cases(now, before) == [], _diff_cases(now, before)
    _same(now, before)


@pytest.mark.integration
def test_many_calls_in_flight_over_one_toolset_end_as_the_tree_before(trees: Trees) -> None:
    """120 remote() calls at once over one toolset's pool, each answered its own way (the
    settled answer, reordered, failed, rejected, asking, 1e3, two artifacts, a direct message,
    text only, usage, a JSON-RPC error, escapes): outcomes, the delegation metrics (counts by
    outcome, durations, retries), the log lines, each call's usage report."""
    now, before = _both(trees, _ANSWERS_DRIVER, "storm")
    assert any('"ok", "settled"' in g for g in now["storm"][0])
    _same(now, before)


@pytest.mark.integration
def test_request_bodies_of_odd_arguments_are_the_tree_before(trees: Trees) -> None:
    """remote()'s SendMessage body for ~24 argument values (ints and floats, -0.0, 1e3, big
    ints, NaN, inf, escapes, control characters, 70 KB, nesting, key order) under five call
    metadata shapes, through one toolset (its templates reused); the same to a real node; a
    typed skill's arguments refused or coerced locally."""
    now, before = _both(trees, _ANSWERS_DRIVER, "bodies")
    _same(now, before)


# --- helper A: the glue from the fast route to the dispatcher; helper D: the stored bytes -----
#
# One card of many skills: typed functions (sync, async, awaiting, reporting progress, asking,
# a direct reply, taking files, long-running, a forbidding model, required and nested fields),
# an LLM typed skill and the chat skill (scripted model). Requests on JSON-RPC and REST, sent and
# streamed: the skill named, unknown, not named (routed by the data or the text), parts of every
# kind, wrong media types, output modes, history lengths, non-blocking, extensions asked for
# (known, unknown, several), content types and A2A versions, tenants, missing and wrong fields,
# a task id of another task, a question answered, the same message again. Each answer's status,
# headers that matter and body; GetTask of each task and ListTasks; the node's log lines and
# task metrics. "make" does that on a new data dir; "read" (another process, another tree
# perhaps, on a copy) reads every task back, lists them, sends the same messages again.

_SKILLS_DRIVER = (
    prelude(ASK_IDS, quiet=True)
    + r'''
import asyncio, base64, json, logging, re, sqlite3, sys, time
from pathlib import Path
from typing import Any, Optional

import httpx
from pydantic import BaseModel, ConfigDict, Field

import mesh
from mesh import Agent, Rule, Script, SkillContext, llm_skill, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

NUMS = re.compile(r'"(durationMs|duration_ms|startedAt|endedAt|at|deadline)": ?[0-9.e+-]+')
VARY = re.compile(r"duration_ms=[\d.]+|0x[0-9a-f]+|\d+\.\d+ ?s\b|127\.0\.0\.1:\d+|/tmp/[\w/.-]+")
TOKENS = re.compile(r'"nextPageToken": ?"[^"]*"')


def canon(text):
    text = counted_runs(TOKENS.sub('"nextPageToken": "<token>"', text))
    return sorted_structs(parsed(NUMS.sub(r'"\1": 0', VARY.sub("<v>", scrub(text)))))


def sorted_structs(value):
    """Objects' members sorted: a Struct's order is the process's (its map's), in either tree."""
    if isinstance(value, dict):
        return {k: sorted_structs(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_structs(v) for v in value]
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.dumps(sorted_structs(json.loads(value)), sort_keys=True)
        except ValueError:
            pass
    return value


class In(BaseModel):
    key: str
    n: int = 1


class Out(BaseModel):
    key: str
    n: int
    note: str = ""


class Deep(BaseModel):
    items: list[In]
    extra: dict[str, Any] = {}
    maybe: Optional[float] = None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1)
    n: int = Field(default=1, ge=0)


class Decision(BaseModel):
    ok: bool


@skill
def echo(req: In) -> Out:
    """Echo; n < 0 fails."""
    if req.n < 0:
        raise ValueError(f"negative {req.n}")
    return Out(key=req.key, n=req.n)


@skill
async def quick(req: In) -> Out:
    """Async, never awaits."""
    return Out(key=req.key, n=req.n * 2)


@skill
async def napping(req: In) -> Out:
    """Awaits once."""
    await asyncio.sleep(0.001)
    return Out(key=req.key, n=req.n * 3)


@skill
async def progress(req: In, ctx: SkillContext) -> Out:
    """Reports progress n times (no await between), then answers."""
    for i in range(req.n):
        await ctx.progress(f"{req.key} step {i} \u00e9" + "p" * (i * 90))
    return Out(key=req.key, n=req.n, note="\U0001f642" * req.n)


@skill(asks=True)
async def asker(req: In, ctx: SkillContext) -> Out:
    """Asks, then answers."""
    answer = await ctx.ask(f"go on with {req.key}?", schema=Decision)
    return Out(key=req.key, n=req.n, note=repr(answer))


@skill(reply="message")
def direct(req: In) -> Out:
    """A direct reply; n < 0 fails."""
    if req.n < 0:
        raise ValueError("negative direct")
    return Out(key=req.key, n=req.n)


@skill(accepts=["image/png"])
async def picture(req: In, ctx: SkillContext) -> Out:
    """Takes PNG files."""
    return Out(key=req.key, n=len(ctx.files), note=",".join(f.media_type for f in ctx.files))


@skill(long_running=True)
async def slow(req: In) -> Out:
    """Long-running (declared)."""
    await asyncio.sleep(0.01)
    return Out(key=req.key, n=req.n)


@skill
def deep(req: Deep) -> Deep:
    """Nested values back."""
    return req


@skill
def strict(req: Strict) -> Out:
    """No extra fields."""
    return Out(key=req.key, n=req.n)


@skill
def attaching(req: In, ctx: SkillContext) -> Out:
    """Attaches a note."""
    ctx.attach({"k": req.key, "n": [1.5, None]}, f"note {req.key}", name="note")
    return Out(key=req.key, n=req.n)


class Draft(BaseModel):
    text: str


class Summary(BaseModel):
    words: int


summarize = llm_skill("summarize", input=Draft, output=Summary, description="Summarize a text.")

agent = Agent(
    name="s36-skills",
    description="Skills of every kind.",
    instruction="Answer briefly.",
    skills=[echo, quick, napping, progress, asker, direct, picture, slow, deep, strict, attaching, summarize],
    script=Script(rules=[Rule(when=r"\S", answer="heard you", answer_data={"words": 2})]),
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 8).decode()
BASE = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def cases():
    """(name, binding, method, message, extra params, headers)."""
    m = lambda skill_id, parts, **kw: {"role": "ROLE_USER", "parts": parts,
                                       **({"metadata": {"skill": skill_id}} if skill_id else {}), **kw}
    d = lambda data, **kw: [{"data": data, **kw}]
    out = []
    for binding in ("rpc", "rest"):
        for method in ("send", "stream"):
            for sk in ("echo", "quick", "napping", "progress", "direct", "slow", "strict", "attaching", "summarize"):
                out.append((f"{sk}", binding, method, m(sk, d({"key": "k", "n": 2} if sk != "summarize" else {"text": "a b"})), {}, {}))
            out.append(("echo-fails", binding, method, m("echo", d({"key": "k", "n": -1})), {}, {}))
            out.append(("direct-fails", binding, method, m("direct", d({"key": "k", "n": -1})), {}, {}))
            out.append(("unknown", binding, method, m("nope", d({"key": "k"})), {}, {}))
            out.append(("missing", binding, method, m("echo", d({"n": 1})), {}, {}))
            out.append(("wrong-type", binding, method, m("echo", d({"key": 5, "n": "x"})), {}, {}))
            out.append(("chat", binding, method, m(None, [{"text": "hello there"}]), {}, {}))
    rpc = "rpc"
    for name, msg, params, headers in [  # each on both bindings
        ("progress-0", m("progress", d({"key": "k", "n": 0})), {}, {}),
        ("progress-1", m("progress", d({"key": "\u00e9\U0001f642", "n": 1})), {}, {}),
        ("progress-3", m("progress", d({"key": "k" * 300, "n": 3})), {}, {}),
        ("echo-big", m("echo", d({"key": "x" * 20000, "n": 2**62})), {}, {}),
        ("echo-unicode", m("echo", d({"key": "\u00e9\u2028\U0001f642\\\"", "n": 0})), {}, {}),
        ("echo-float-n", m("echo", d({"key": "k", "n": 3.0})), {}, {}),
        ("echo-extra", m("echo", d({"key": "k", "zz": {"a": [1, {}]}})), {}, {}),
        ("echo-text", m("echo", [{"text": '{"key": "t", "n": 4}'}]), {}, {}),
        ("echo-text-not-json", m("echo", [{"text": "not json"}]), {}, {}),
        ("echo-data-and-text", m("echo", [{"data": {"key": "a"}}, {"text": "more"}]), {}, {}),
        ("echo-two-data", m("echo", [{"data": {"key": "a"}}, {"data": {"key": "b"}}]), {}, {}),
        ("echo-media-text", m("echo", d({"key": "k"}, mediaType="text/plain")), {}, {}),
        ("echo-media-odd", m("echo", d({"key": "k"}, mediaType="application/x-odd")), {}, {}),
        ("echo-file", m("echo", [{"data": {"key": "k"}}, {"raw": PNG, "mediaType": "image/png"}]), {}, {}),
        ("picture-file", m("picture", [{"data": {"key": "k"}}, {"raw": PNG, "mediaType": "image/png", "filename": "a.png"}]), {}, {}),
        ("picture-wrong-file", m("picture", [{"data": {"key": "k"}}, {"raw": PNG, "mediaType": "image/gif"}]), {}, {}),
        ("picture-url", m("picture", [{"data": {"key": "k"}}, {"url": "http://example.invalid/a.png", "mediaType": "image/png"}]), {}, {}),
        ("no-skill-data", m(None, d({"key": "routed"})), {}, {}),
        ("no-skill-text-object", m(None, [{"text": '{"key": "routed", "n": 2}'}]), {}, {}),
        ("no-skill-deep", m(None, d({"items": [{"key": "a"}]})), {}, {}),
        ("deep", m("deep", d({"items": [{"key": "a", "n": 1}, {"key": "b"}], "extra": {"z": [1.5, -0.0, 1e300], "a": None}, "maybe": 2})), {}, {}),
        ("deep-bad", m("deep", d({"items": [{"n": 1}, 5], "maybe": "x"})), {}, {}),
        ("strict-extra", m("strict", d({"key": "k", "other": 1})), {}, {}),
        ("strict-empty", m("strict", d({"key": "", "n": -1})), {}, {}),
        ("summarize-bad", m("summarize", d({"words": 1})), {}, {}),
        ("skill-empty-name", m("", d({"key": "k"})), {}, {}),
        ("skill-chat", m("chat", [{"text": "hi"}]), {}, {}),
        ("skill-chat-data", m("chat", d({"key": "k"})), {}, {}),
        ("meta-many", {**m("echo", d({"key": "k"})), "metadata": {"skill": "echo", "caller": "c\u00e9", "deadline": time.time() + 60,
                       "traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "x": {"b": [1, 2.5], "a": None}}}, {}, {}),
        ("meta-deadline-past", {**m("echo", d({"key": "k"})), "metadata": {"skill": "echo", "deadline": 1.0}}, {}, {}),
        ("meta-list", {**m("echo", d({"key": "k"})), "metadata": ["echo"]}, {}, {}),
        ("context-given", m("echo", d({"key": "k"}), contextId="ctx-\u00e9" + "c" * 200), {}, {}),
        ("context-odd", m("echo", d({"key": "k"}), contextId=""), {}, {}),
        ("task-unknown", m("echo", d({"key": "k"}), taskId="no-such-task"), {}, {}),
        ("reference-tasks", m("echo", d({"key": "k"}), referenceTaskIds=["a", "b"]), {}, {}),
        ("message-extensions", m("echo", d({"key": "k"}), extensions=["urn:x"]), {}, {}),
        ("role-agent", {**m("echo", d({"key": "k"})), "role": "ROLE_AGENT"}, {}, {}),
        ("role-missing", {k: v for k, v in m("echo", d({"key": "k"})).items() if k != "role"}, {}, {}),
        ("parts-empty", m("echo", []), {}, {}),
        ("history-0", m("echo", d({"key": "k"})), {"configuration": {"historyLength": 0}}, {}),
        ("history-1", m("progress", d({"key": "k", "n": 2})), {"configuration": {"historyLength": 1}}, {}),
        ("history-neg", m("echo", d({"key": "k"})), {"configuration": {"historyLength": -1}}, {}),
        ("modes-text", m("echo", d({"key": "k"})), {"configuration": {"acceptedOutputModes": ["text/plain"]}}, {}),
        ("modes-png", m("echo", d({"key": "k"})), {"configuration": {"acceptedOutputModes": ["image/png"]}}, {}),
        ("modes-empty", m("echo", d({"key": "k"})), {"configuration": {"acceptedOutputModes": []}}, {}),
        ("non-blocking", m("napping", d({"key": "k"})), {"configuration": {"returnImmediately": True}}, {}),
        ("config-odd", m("echo", d({"key": "k"})), {"configuration": {"pushNotificationConfig": {"url": "http://127.0.0.1:9/x"}}}, {}),
        ("params-meta", m("echo", d({"key": "k"})), {"metadata": {"a": 1}}, {}),
        ("tenant", m("echo", d({"key": "k"})), {"tenant": "t1"}, {}),
        ("ext-known", m("echo", d({"key": "k"})), {}, {"A2A-Extensions": "urn:mesh:tasks:v1"}),
        ("ext-unknown", m("echo", d({"key": "k"})), {}, {"A2A-Extensions": "urn:nobody:x"}),
        ("ext-several", m("echo", d({"key": "k"})), {}, {"A2A-Extensions": "urn:mesh:tasks:v1, urn:nobody:x"}),
        ("ext-empty", m("echo", d({"key": "k"})), {}, {"A2A-Extensions": ""}),
        ("ext-asker", m("asker", d({"key": "k"})), {}, {"A2A-Extensions": "urn:mesh:tasks:v1"}),
        ("ctype-text", m("echo", d({"key": "k"})), {}, {"Content-Type": "text/plain"}),
        ("ctype-charset", m("echo", d({"key": "k"})), {}, {"Content-Type": "application/json; charset=utf-8"}),
        ("ctype-a2a", m("echo", d({"key": "k"})), {}, {"Content-Type": "application/a2a+json"}),
        ("version-none", m("echo", d({"key": "k"})), {}, {"A2A-Version": None}),
        ("version-03", m("echo", d({"key": "k"})), {}, {"A2A-Version": "0.3"}),
        ("version-2", m("echo", d({"key": "k"})), {}, {"A2A-Version": "2.0"}),
    ]:
        out.append((name, rpc, "send", msg, params, headers))
        out.append((name, "rest", "send", msg, params, headers))
    # 3 MB: lengths of four varint bytes in the stored task's bytes
    out.append(("echo-huge", rpc, "send", m("echo", d({"key": "y" * 3_000_000})), {}, {}))
    return out


RPC = {"send": "SendMessage", "stream": "SendStreamingMessage"}
REST = {"send": "/a2a/rest/message:send", "stream": "/a2a/rest/message:stream"}


LOGS = Logs()
KEEP = ("mesh_tasks_total", "mesh_task_duration_seconds_count", "mesh_fastpath_sends_total", "mesh_tasks_in_flight")


async def serve(data, steps):
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=data, registry=None))
    # The server shares this loop with the client, whose canon of a multi-MB answer can hold
    # it past uvicorn's 5 s keep-alive on a loaded host: the timer then fires first and the
    # next request meets a closed connection (httpx.ReadError, in either tree).
    async with (
        uvicorn_serving(node.app, port, log_level="warning", timeout_keep_alive=600),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        return await steps(http)


async def post(http, binding, method, message, params, headers, rid=1):
    hdrs = {**BASE, **{k: v for k, v in headers.items() if v is not None}}
    for k, v in headers.items():
        if v is None:
            hdrs.pop(k, None)
    if binding == "rpc":
        body = {"jsonrpc": "2.0", "id": rid, "method": RPC[method], "params": {"message": message, **params}}
        r = await http.post("/", content=json.dumps(body), headers=hdrs)
    else:
        r = await http.post(REST[method], content=json.dumps({"message": message, **params}), headers=hdrs)
    kept = {k: r.headers.get(k) for k in ("content-type", "a2a-extensions", "a2a-version")}
    if method == "stream" and r.status_code == 200 and "event-stream" in (r.headers.get("content-type") or ""):
        events = [canon(line[5:].strip()) for line in r.text.splitlines() if line.startswith("data:")]
        return [r.status_code, kept, events]
    return [r.status_code, kept, canon(r.text)]


def task_id_of(answer):
    body = answer[2]
    if isinstance(body, list):
        body = body[-1] if body else {}
    if not isinstance(body, dict):
        return None
    found = body.get("result", body)
    for key in ("task", "statusUpdate", "artifactUpdate"):
        if isinstance(found, dict) and isinstance(found.get(key), dict):
            found = found[key]
            break
    return found.get("id") or found.get("taskId") if isinstance(found, dict) else None


async def rpc(http, method, params):
    r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=BASE)
    return canon(r.text)


async def metrics(http):
    text = (await http.get("/metrics")).text
    return sorted(l for l in text.splitlines() if l.startswith(KEEP))


async def settled(http):
    """Until no task is WORKING (a non-blocking run's), and its line logged."""
    for _ in range(500):
        listed = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"status": "TASK_STATE_WORKING"}}, headers=BASE)
        if not listed.json()["result"]["tasks"]:
            break
        await asyncio.sleep(0.02)
    for _ in range(100):  # the line comes after the task's last save
        if any("skill=napping" in str(line) for line in LOGS.lines):
            break
        await asyncio.sleep(0.01)


async def make(data):
    async def steps(http):
        res, ids = [], []
        for n, (name, binding, method, msg, params, headers) in enumerate(cases()):
            msg = {**msg, "messageId": f"m{n}"}
            LOGS.lines = []
            answer = await post(http, binding, method, msg, params, headers, rid=n)
            if name == "non-blocking":  # its run ends after the answer: its line then
                await settled(http)
            res.append([name, binding, method, answer, LOGS.lines[:] if method == "send" else len(LOGS.lines)])
        # An asker: its question, then its answer (the task named), a duplicate of each.
        for binding in ("rpc", "rest"):
            ctx = f"ctx-ask-{binding}"
            msg = {"role": "ROLE_USER", "messageId": f"q-{binding}", "contextId": ctx, "parts": [{"data": {"key": "q"}}],
                   "metadata": {"skill": "asker"}}
            asked = await post(http, binding, "send", msg, {}, {})
            res.append(["asked", binding, asked])
            listed = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": ctx}}, headers=BASE)
            tid = listed.json()["result"]["tasks"][0]["id"]
            res.append(["asked-again", binding, await post(http, binding, "send", msg, {}, {})])
            reply = {"role": "ROLE_USER", "messageId": f"a-{binding}", "contextId": ctx, "taskId": tid,
                     "parts": [{"data": {"ok": True}}], "metadata": {"skill": "asker"}}
            res.append(["answered", binding, await post(http, binding, "send", reply, {}, {})])
            res.append(["answered-again", binding, await post(http, binding, "send", reply, {}, {})])
            res.append(["task-done", binding, await post(http, binding, "send", {**reply, "messageId": f"late-{binding}"}, {}, {})])
        await settled(http)
        listed = (await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 100}}, headers=BASE)).json()
        ids = [t["id"] for t in listed["result"]["tasks"]]
        res.append(["get", [await rpc(http, "GetTask", {"id": tid}) for tid in ids]])
        res.append(["list", canon(json.dumps(listed))])
        res.append(["metrics", await metrics(http)])
        return res, ids

    res, ids = await serve(data, steps)
    Path(data, "ids.json").write_text(json.dumps(ids))
    return {"res": res, "rows": rows(data)}


def rows(data):
    """Each stored task: its columns and its bytes parsed (JSON). (Not the bytes themselves:
    a Struct's map is written in the process's order, in either tree.)"""
    from a2a.types import Task
    from google.protobuf.json_format import MessageToJson

    conn = sqlite3.connect(Path(data, "node.db"))
    out = []
    for owner, ctx, state, blob in conn.execute("select owner, context_id, state, data from a2a_tasks"):
        task = Task.FromString(blob)
        out.append([owner, canon(json.dumps(ctx)), state, canon(MessageToJson(task)), len(blob) > 3_000_000])
    conn.close()
    return sorted(out, key=json.dumps)


async def read(data):
    ids = json.loads(Path(data, "ids.json").read_text())

    async def steps(http):
        res = [["get", [await rpc(http, "GetTask", {"id": tid}) for tid in ids]]]
        res.append(["get-h0", [await rpc(http, "GetTask", {"id": tid, "historyLength": 0}) for tid in ids]])
        listed = await rpc(http, "ListTasks", {"pageSize": 100})
        res.append(["list", listed])
        res.append(["list-art", await rpc(http, "ListTasks", {"pageSize": 100, "includeArtifacts": True})])
        again = []
        for n, (name, binding, method, msg, params, headers) in enumerate(cases()):
            if method == "send" and n % 2 == 0:
                msg = {**msg, "messageId": f"m{n}"}
                again.append([name, binding, await post(http, binding, method, msg, params, headers, rid=n)])
        res.append(["again", again])
        res.append(["metrics", await metrics(http)])
        return res

    return {"res": await serve(data, steps)}


async def main(phase, data):
    logging.getLogger().addHandler(LOGS)
    logging.getLogger().setLevel(logging.INFO)
    out = {"mesh": mesh.__file__}
    out.update(await (make if phase == "make" else read)(Path(data)))
    print(json.dumps(out))


asyncio.run(main(sys.argv[1], sys.argv[2]))
'''
)


def _skills(trees: Trees, tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each tree makes a database; this tree's read by each tree, the base's by the base (on
    copies): ([made now, made before], [now by now, now by before, before by before]). (The
    base's read by this tree: the s35 store driver's test above.)"""
    made = _all(
        trees,  # type: ignore[arg-type]
        [(side, _SKILLS_DRIVER, ("make", str(tmp / f"made-{side}"))) for side in ("now", "before")],
    )
    runs = []
    for maker, reader in (("now", "now"), ("now", "before"), ("before", "before")):
        shutil.copytree(tmp / f"made-{maker}", tmp / f"{maker}-by-{reader}")
        runs.append((reader, _SKILLS_DRIVER, ("read", str(tmp / f"{maker}-by-{reader}"))))
    return made, _all(trees, runs)  # type: ignore[arg-type]


@pytest.mark.integration
def test_a_card_of_every_kind_of_skill_answers_stores_and_reads_back_as_the_tree_before(
    trees: Trees, tmp_path: Path
) -> None:
    """~290 requests to one card of 12 skills of every kind (see ``_SKILLS_DRIVER``), sent and
    streamed on JSON-RPC and REST: every answer (never a 500), log line, metric, GetTask,
    ListTasks and stored row (its bytes protobuf's own serialization); then each database
    read by each tree: GetTask, ListTasks, the same messages again."""
    (made_now, made_before), reads = _skills(trees, tmp_path)
    # A direct reply's failure on REST is a 500 in both trees (the SDK's error for a skill's
    # exception with no task to hold it); nothing else is.
    fivehundreds = {(r[0], r[1]) for r in made_now["res"] if len(r) == 5 and r[3][0] == 500}
    assert fivehundreds == {("direct-fails", "rest")}, fivehundreds
    _same(made_now, made_before)
    now_by_now, now_by_before, before_by_before = reads
    _same(now_by_before, before_by_before)
    _same(now_by_now, before_by_before)


# --- 2520401: a skill's models through pydantic's validator and serializer directly ----------
#
# Skills whose models override model_validate / model_dump (a classmethod, a plain function, a
# staticmethod), serialize by alias, have computed fields, field and model serializers, before
# / wrap validators that raise, extra members allowed, a subclass's instance or a dict or
# another model returned, inf / NaN under ``ser_json_inf_nan``; and a model whose model_dump
# and model_validate are replaced (and restored) between two requests: the answer of each.

_MODELS_DRIVER = (
    prelude()
    + r'''
import asyncio, json, re, sys, tempfile
from pathlib import Path
from typing import Any

import httpx
from pydantic import (BaseModel, ConfigDict, Field, computed_field, field_serializer, field_validator,
                      model_serializer, model_validator)
from pydantic.alias_generators import to_camel

import mesh
from mesh import Agent, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}


def canon(text):
    return sorted_texts(parsed(scrub(text)))


class In(BaseModel):
    k: str = "k"
    n: float = 1


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)
    some_key: str = "s"
    some_number: int = 1


class CamelIn(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, validate_by_alias=True)
    some_key: str
    some_number: int = 1


class Dumped(BaseModel):
    k: str

    def model_dump(self, **kwargs):
        out = super().model_dump(**kwargs)
        out["k"] = out["k"].upper() + "-dumped"
        return out


class Validated(BaseModel):
    k: str

    @classmethod
    def model_validate(cls, obj, **kwargs):
        if isinstance(obj, dict) and "k" in obj:
            obj = {**obj, "k": "validated-" + str(obj["k"])}
        return super().model_validate(obj, **kwargs)


class Computed(BaseModel):
    a: int = 2

    @computed_field
    @property
    def double(self) -> int:
        return self.a * 2


class FieldSer(BaseModel):
    when: float = 1.5
    tags: list[str] = []

    @field_serializer("when")
    def ser_when(self, v):
        return f"at {v}"

    @field_serializer("tags")
    def ser_tags(self, v):
        return sorted(v)


class ModelSer(BaseModel):
    x: int = 1

    @model_serializer
    def ser(self):
        return {"x": self.x, "extra": "by model_serializer"}


class Checked(BaseModel):
    x: Any = None

    @field_validator("x", mode="before")
    @classmethod
    def before(cls, v):
        if v == "boom":
            raise ValueError("before boom")
        if v == "assert":
            assert False, "asserted"
        return v

    @model_validator(mode="wrap")
    @classmethod
    def wrap(cls, data, handler):
        if isinstance(data, dict) and data.get("x") == "wrap":
            raise ValueError("wrap refused")
        return handler(data)


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    k: str = "k"


class Nums(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    v: float = 0.0


class Out(BaseModel):
    k: str
    n: float = 0


class Sub(Out):
    more: str = "sub"


class Other(BaseModel):
    k: str
    n: float = 0
    other: int = 5


class Swapped(BaseModel):
    k: str


@skill
def camel(req: CamelIn) -> Camel:
    """Aliases."""
    return Camel(some_key=req.some_key, some_number=req.some_number)


@skill
def dumped(req: In) -> Dumped:
    """Its output model overrides model_dump."""
    return Dumped(k=req.k)


@skill
def validated(req: Validated) -> Out:
    """Its input model overrides model_validate."""
    return Out(k=req.k)


@skill
def validated_out(req: In) -> Validated:
    """Its output model overrides model_validate."""
    return Validated.model_construct(k=req.k)


@skill
def computed(req: In) -> Computed:
    """A computed field."""
    return Computed(a=int(req.n))


@skill
def field_ser(req: In) -> FieldSer:
    """Field serializers."""
    return FieldSer(when=req.n, tags=["b", "a"])


@skill
def model_ser(req: In) -> ModelSer:
    """A model serializer."""
    return ModelSer(x=int(req.n))


@skill
def checked(req: Checked) -> Out:
    """Validators that raise."""
    return Out(k=repr(req.x))


@skill
def loose(req: Loose) -> Loose:
    """Extra members kept."""
    return req


@skill
def nums(req: In) -> Nums:
    """inf and NaN as strings."""
    return Nums(v={1: float("inf"), 2: float("nan"), 3: float("-inf")}.get(int(req.n), req.n))


@skill
def sub(req: In) -> Out:
    """A subclass's instance, a dict, another model, by n."""
    n = int(req.n)
    if n == 1:
        return Sub(k=req.k, n=1)
    if n == 2:
        return {"k": req.k, "n": 2, "junk": 1}
    if n == 3:
        return Other(k=req.k, n=3)
    if n == 4:
        return {"k": 5}
    return Out.model_construct(k=req.k, n="many")


@skill
def swapped(req: In) -> Swapped:
    """Its models' methods replaced between requests."""
    return Swapped(k=req.k)


agent = Agent(name="s36-models", description="Models.", skills=[camel, dumped, validated, validated_out, computed,
                                                                  field_ser, model_ser, checked, loose, nums, sub, swapped])

CASES = [
    ("camel", {"someKey": "a", "someNumber": 2}), ("camel", {"some_key": "b"}), ("camel", {"someKey": "c", "some_number": 3}),
    ("camel", {"some_number": 3}),
    ("dumped", {"k": "x"}), ("validated", {"k": "x"}), ("validated", {}), ("validated_out", {"k": "x"}),
    ("computed", {"n": 3}), ("field_ser", {"n": 2.5}), ("model_ser", {"n": 4}),
    ("checked", {"x": 1}), ("checked", {"x": "boom"}), ("checked", {"x": "assert"}), ("checked", {"x": "wrap"}),
    ("loose", {"k": "a", "extra": [1, {"b": None}], "z": 1.5}),
    ("nums", {"n": 1}), ("nums", {"n": 2}), ("nums", {"n": 3}), ("nums", {"n": 4.5}),
    ("sub", {"n": 1}), ("sub", {"n": 2}), ("sub", {"n": 3}), ("sub", {"n": 4}), ("sub", {"n": 5}),
]


async def main():
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=Path(tempfile.mkdtemp()), registry=None))
    res = []
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30) as http,
    ):
        n = 0

        async def send(skill_id, data, rest=False):
            nonlocal n
            n += 1
            msg = {"role": "ROLE_USER", "messageId": f"m{n}", "parts": [{"data": data}], "metadata": {"skill": skill_id}}
            if rest:
                r = await http.post("/a2a/rest/message:send", json={"message": msg}, headers=H)
            else:
                r = await http.post("/", json={"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": msg}}, headers=H)
            return [skill_id, data, rest, r.status_code, canon(r.text)]

        if sys.argv[1] == "static":
            for skill_id, data in CASES:
                res.append(await send(skill_id, data))
                res.append(await send(skill_id, data, rest=True))
        else:  # the models' methods replaced after a first request, then restored
            res.append(await send("swapped", {"k": "a"}))

            def patched_dump(self, **kwargs):
                return {"k": "patched-dump"}

            Swapped.model_dump = patched_dump
            res.append(await send("swapped", {"k": "b"}))
            del Swapped.model_dump
            res.append(await send("swapped", {"k": "c"}))

            @classmethod
            def patched_validate(cls, obj, **kwargs):
                return BaseModel.model_validate.__func__(cls, {**obj, "k": "patched-validate"}, **kwargs)

            In.model_validate = patched_validate
            res.append(await send("swapped", {"k": "d"}))
            del In.model_validate
            res.append(await send("swapped", {"k": "e"}))
    print(json.dumps({"mesh": mesh.__file__, "res": res}))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_skills_models_with_overrides_aliases_and_serializers_answer_as_the_tree_before(
    trees: Trees,
) -> None:
    """2520401's direct validator / serializer calls, decided once per model: aliases,
    overrides, computed fields, serializers, raising validators, extras, inf / NaN, other
    models returned, and methods replaced between requests."""
    now, before = _both(trees, _MODELS_DRIVER, "static")
    _same(now, before)


@pytest.mark.integration
def test_a_models_methods_replaced_between_requests_are_called_as_before(trees: Trees) -> None:
    """A model's model_dump replaced (then removed) after a first request, then the input
    model's model_validate: each request's answer. Broken by 2520401 (decided once per
    model), fixed in session 37 (decided on each call)."""
    now, before = _both(trees, _MODELS_DRIVER, "patched")
    _same(now, before)


@pytest.mark.integration
def test_tasks_under_a_wrong_clock_are_stored_as_the_tree_before(trees: Trees) -> None:
    """s34's tasks under a wall clock in the year 2200 (a status time's seconds past 2**32:
    five bytes of varint) and before the epoch (negative): answers and stored rows."""
    runs = [
        (side, s34._CLOCK_DRIVER, (clock,))
        for clock in ("y2200", "before_epoch")
        for side in ("now", "before")
    ]
    outs = _all(trees, runs)  # type: ignore[arg-type]
    for now, before in zip(outs[::2], outs[1::2], strict=True):
        assert len(now["rows"]) == 3
        _same(now, before)


# --- helper D: values a skill itself produces, in the stored task's bytes ---------------------
#
# Skills that make what a request cannot carry: progress texts and answers with lone
# surrogates, control characters, 2 MB, empty; answers with ints past 2**53 and 10**30, -0.0,
# subnormals, deep nesting; attachments named oddly. Each answer; GetTask of each task; then a
# new node on the same database: GetTask again (the stored bytes) and the rows parsed.

_PRODUCED_DRIVER = (
    prelude()
    + r'''
import asyncio, json, re, sqlite3, sys, tempfile
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

import mesh
from mesh import Agent, SkillContext, skill
from mesh._node import Node
from mesh._settings import NodeSettings
from tests.support import free_port, uvicorn_serving

H = {"A2A-Version": "1.0"}


def canon(text):
    return sort(parsed(scrub(counted_runs(text))))


def sort(value):
    if isinstance(value, dict):
        return {k: sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sort(v) for v in value]
    return value


class In(BaseModel):
    i: int


class Out(BaseModel):
    v: Any = None


TEXTS = ["", "\ud800", "a\x00b\x7f", "\u2028\U0001f642", "p" * 2_200_000, "x" * 127, "x" * 128, "x" * 16383, "x" * 16384]
VALUES = [2**53 + 1, 10**30, -(2**63), 2**64, -0.0, 5e-324, 1e308, [[[[[[]]]]]], {"": {"": {}}}, "\ud800", "a\x00",
          {"k" * 200: 1}, [1.5] * 1000, True, None]
NAMES = ["", "\ud800", "n" * 300, "answer", "s36-produced"]


@skill
async def talks(req: In, ctx: SkillContext) -> Out:
    """Reports progress TEXTS[i], answers with it."""
    await ctx.progress(TEXTS[req.i])
    return Out(v=TEXTS[req.i][:10])


@skill
def values(req: In) -> Out:
    """Answers VALUES[i]."""
    return Out(v=VALUES[req.i])


@skill
def names(req: In, ctx: SkillContext) -> Out:
    """Attaches a note named NAMES[i]."""
    ctx.attach({"n": req.i}, "note", name=NAMES[req.i])
    return Out(v=req.i)


agent = Agent(name="s36-produced", description="Produces.", skills=[talks, values, names])
CASES = ([("talks", i) for i in range(len(TEXTS))] + [("values", i) for i in range(len(VALUES))]
         + [("names", i) for i in range(len(NAMES))])


async def serve(data, steps):
    port = free_port()
    node = Node(agent, NodeSettings(port=port, data_dir=data, registry=None))
    async with (
        uvicorn_serving(node.app, port, log_level="warning"),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=60) as http,
    ):
        return await steps(http)


async def get(http, tid):
    r = await http.post("/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": tid}}, headers=H)
    return canon(r.text)


async def main():
    data = Path(tempfile.mkdtemp())
    ids = []

    async def first(http):
        res = []
        for n, (skill_id, i) in enumerate(CASES):
            msg = {"role": "ROLE_USER", "messageId": f"m{n}", "parts": [{"data": {"i": i}}], "metadata": {"skill": skill_id}}
            r = await http.post("/", json={"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": msg}}, headers=H)
            body = r.json()
            tid = ((body.get("result") or {}).get("task") or {}).get("id")
            ids.append(tid)
            res.append([skill_id, i, r.status_code, canon(r.text), await get(http, tid) if tid else None])
        return res

    out = {"mesh": mesh.__file__, "first": await serve(data, first)}

    async def second(http):
        return [await get(http, tid) if tid else None for tid in ids]

    out["restart"] = await serve(data, second)
    from a2a.types import Task
    from google.protobuf.json_format import MessageToJson

    conn = sqlite3.connect(data / "node.db")
    out["rows"] = sorted(json.dumps(canon(MessageToJson(Task.FromString(blob)))) for (blob,) in conn.execute("select data from a2a_tasks"))
    conn.close()
    print(json.dumps(out))


asyncio.run(main())
'''
)


@pytest.mark.integration
def test_values_a_skill_produces_are_answered_and_stored_as_the_tree_before(trees: Trees) -> None:
    """Progress texts, answers and attachment names a skill makes (lone surrogates, NUL,
    2 MB, lengths at the varint's 128 and 16384 edges, ints past 2**53, -0.0, subnormals,
    nesting): each answer, GetTask, GetTask after a restart, the stored rows parsed."""
    now, before = _both(trees, _PRODUCED_DRIVER)
    _same(now, before)
