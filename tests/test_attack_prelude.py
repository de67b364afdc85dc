"""tests/attack_prelude.py's helpers canonicalise and keep log lines exactly as each driver's
own copy did before (``BASE``, d67a51c: the drivers of tests/test_attack_s34.py to s37 each with
its own ``IDS`` / ``TIMES`` / ``TRACES``, ``canon`` and ``Logs``).

Each driver's helpers are taken from its source, before and now (the module level's stdlib
imports, ``re.compile`` constants, plain functions, ``Logs`` / ``Names`` classes: not its
skills, servers or ``main``), and run side by side on texts real drivers canonicalised and on
texts made of what the patterns look for (hypothesis): the same values, the same log lines, the
same records left out.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import test_attack_s34 as s34
from tests import test_attack_s35 as s35
from tests import test_attack_s36 as s36
from tests import test_attack_s37 as s37
from tests.attack_prelude import prelude, quieted
from tests.support import ROOT

BASE = "d67a51c"
_MODULES = {"s34": s34, "s35": s35, "s36": s36, "s37": s37}

#: The drivers that open with the prelude: (module, name, whether an earlier session's driver
#: is run quieted, as s36 and s37 run s34's and s35's).
DRIVERS = [
    ("s34", "_TYPED_DRIVER", False),
    ("s34", "_REMOTE_DRIVER", False),
    ("s34", "_REMOTE_DRIVER", True),
    ("s34", "_HELD_DRIVER", False),
    ("s34", "_SHAPES_DRIVER", False),
    ("s34", "_PROGRESS_DRIVER", False),
    ("s34", "_COORDINATOR_DRIVER", False),
    ("s34", "_CLOCK_DRIVER", False),
    ("s35", "_STORE_DRIVER", False),
    ("s35", "_AFTER_DRIVER", False),
    ("s35", "_AFTER_DRIVER", True),
    ("s35", "_LINE_DRIVER", False),
    ("s35", "_WRITE_NOW_DRIVER", False),
    ("s36", "_ANSWERS_DRIVER", False),
    ("s36", "_SKILLS_DRIVER", False),
    ("s36", "_MODELS_DRIVER", False),
    ("s36", "_PRODUCED_DRIVER", False),
    ("s37", "_BODIES_DRIVER", False),
    ("s37", "_HISTORY_DRIVER", False),
    ("s37", "_TURN_DRIVER", False),
    ("s37", "_PIECES_DRIVER", False),
    ("s37", "_SECONDS_DRIVER", False),
]
_IDS = [f"{m}.{n}{' quieted' if q else ''}" for m, n, q in DRIVERS]
_CLASSES = {"Logs", "GoingLogs", "Names"}


@functools.cache
def _base_module(module: str) -> ast.Module:
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BASE}:tests/test_attack_{module}.py"],
        capture_output=True,
        check=False,
    )
    if shown.returncode != 0:
        pytest.skip(f"no {BASE} in this clone: {shown.stderr.decode()[:200]}")
    return ast.parse(shown.stdout.decode())


def _base_driver(module: str, name: str, quiet: bool) -> str:
    for node in _base_module(module).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [name]:
            source: str = ast.literal_eval(node.value)
            break
    else:
        raise LookupError(name)
    if quiet:  # s36's _quiet at BASE
        loud = 'if record.name.startswith("mesh"):'
        assert source.count(loud) == 1
        source = source.replace(
            loud, 'if record.name.startswith("mesh") and record.name != "mesh.sqlite":'
        )
    return source


def _plain(value: ast.expr) -> bool:
    """A constant, a ``re.compile`` of one or a log handler (``LOGS = Logs()``): no name but
    ``re`` and those classes (not ``sys.argv``, not the driver's own functions)."""
    names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    calls = {ast.unparse(n.func) for n in ast.walk(value) if isinstance(n, ast.Call)}
    return names <= {"re", *_CLASSES} and calls <= {"re.compile", *_CLASSES}


def _helpers(source: str) -> dict[str, Any]:
    """The driver's helpers (module level): stdlib imports, constants and ``LOGS`` (``_plain``),
    plain functions, the ``Logs`` / ``GoingLogs`` / ``Names`` classes, in its order."""
    kept: list[ast.stmt] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if all((n or "").split(".")[0] in sys.stdlib_module_names for n in names):
                kept.append(node)
        elif isinstance(node, ast.Assign):
            if all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets) and _plain(
                node.value
            ):
                kept.append(node)
        elif isinstance(node, ast.FunctionDef):
            if not node.decorator_list:  # not a skill
                kept.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in _CLASSES:
            kept.append(node)
    cancelled: list[str] = []
    namespace: dict[str, Any] = {"__name__": "driver", "CANCELLED": cancelled}
    for node in kept:
        code = compile(ast.Module(body=[node], type_ignores=[]), "<driver>", "exec")
        try:
            exec(code, namespace)
        except NameError:  # a function whose defaults are the driver's data: not a helper
            if not isinstance(node, ast.FunctionDef):
                raise
    # The turn driver's hook: what a "still running after" line sets and cancels.
    namespace["GONE"] = SimpleNamespace(set=lambda: cancelled.append("gone"))
    namespace["CANCEL"] = [SimpleNamespace(cancel=lambda: cancelled.append("cancel"))]
    return namespace


@functools.cache
def _pair(module: str, name: str, quiet: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    source = getattr(_MODULES[module], name)
    if quiet:
        source = quieted(source)
    return _helpers(_base_driver(module, name, quiet)), _helpers(source)


def _outcome(call: Any) -> Any:
    try:
        return ["value", call()]
    except Exception as exc:  # the same error on both sides is the same behaviour
        return ["raised", type(exc).__name__, str(exc)]


def _canon(helpers: dict[str, Any], text: str) -> Any:
    if "Names" in helpers:  # s35's store driver: JSON values, its tasks named
        names = helpers["Names"]({"made-1": "0" * 32, "made-2": "ab" * 16})
        value = {"text": text, "list": [text, {"inner": text}], "id": "0" * 32}
        return _outcome(lambda: names.canon(value))
    canon = helpers["canon"]
    if canon.__code__.co_argcount == 2:  # (status, text)
        return _outcome(lambda: canon(200, text))
    return _outcome(lambda: canon(text))


_LOGGERS = ["mesh", "mesh.sqlite", "mesh.node", "mesh.sqlite.batch", "meshy", "uvicorn.error"]


def _logged(helpers: dict[str, Any], texts: list[str]) -> Any:
    logs: Any = helpers.get("LOGS")
    if not isinstance(logs, logging.Handler):
        logs = helpers["Logs"]()
    logs.lines = []
    del helpers["CANCELLED"][:]
    for i, text in enumerate(texts):
        for name in _LOGGERS:
            message, args = (text, ()) if i % 2 else ("%s after %s", (text, i))
            record = logging.LogRecord(name, logging.INFO + i % 3, "x.py", 1, message, args, None)
            logs.handle(record)
    return [logs.lines, list(helpers["CANCELLED"])]


# Texts drivers canonicalised in real runs (s34's remote and typed drivers, s35's after driver,
# s37's history driver, session 38's tree): log lines, requests sent, answers, stored tasks.
_RUN = [
    "task agent=s34-bureau skill=score task=c8199ae5-6cff-4cfb-8c33-2b7d88e1d7e2 outcome=completed duration_ms=6.7 traceparent=00-96a7c131f6d4b07c2cfb9c374ffb95f6-e40828a224064253-01",
    '{"applicant_id": "c-11", "note": null, "ratio": 3.6666666666666665, "score": 11, "tags": ["a", "\\u00e9\\ud83d\\ude42"]}',
    "delegation caller=s34-coordinator peer=s34-bureau skill=score outcome=ok attempts=1 target=http://127.0.0.1:56823 task=38cf3ca8-0d23-4325-9a64-b7b9cddafd4d duration_ms=34.6 trace_id=389c44434d7076bfea3eb96ce7a7f3fd",
    '{"method":"SendMessage","params":{"message":{"messageId":"1570757179d2e4060716df3701c114c4","role":"ROLE_USER","parts":[{"data":{"applicant_id":"a-2","amount":2},"mediaType":"application/json"}],"metadata":{"traceparent":"00-12121212121212121212121212121212-968ddba3cc5f5c0d-01","deadline":1796286245.535278,"caller":"s34-coordinator","callerTask":"t-1","skill":"score"}},"configuration":{"historyLength":0}},"id":55,"jsonrpc":"2.0"}',
    '{"result":{"task":{"id":"3b7c9237-b0d3-43d6-b7d0-aa3bfc80999a","contextId":"59129e51-e444-4918-850f-98fa165cf602","status":{"state":"TASK_STATE_REJECTED","message":{"messageId":"4cfff197-640d-4131-81fd-b8fbe54643ca","contextId":"59129e51-e444-4918-850f-98fa165cf602","taskId":"3b7c9237-b0d3-43d6-b7d0-aa3bfc80999a","role":"ROLE_AGENT","parts":[{"text":"deadline exceeded"}]},"timestamp":"2026-12-03T08:24:11.546675Z"},"metadata":{"traceparent":"00-73e6fec6217c2db99c0dbd658e552f86-e06848adc7f8711d-01","skill":"meta","error":{"message":"deadline exceeded","reason":"deadline"}}}},"id":111,"jsonrpc":"2.0"}',
    '{"task":{"id":"aef9c9da-c3fb-4b89-9504-73ae25d17993","contextId":"6f08932b-3987-482f-b7d7-2e719feaa8f6","status":{"state":"TASK_STATE_REJECTED","message":{"messageId":"5c959fa7-9b26-4bc4-86e5-5c503edb0cd1","contextId":"6f08932b-3987-482f-b7d7-2e719feaa8f6","taskId":"aef9c9da-c3fb-4b89-9504-73ae25d17993","role":"ROLE_AGENT","parts":[{"text":"deadline exceeded"}]},"timestamp":"2026-12-03T08:24:11.551822Z"},"metadata":{"traceparent":"00-bd3966e4561a45d0457498828816adf3-b022dc558fad19a0-01","skill":"meta","error":{"message":"deadline exceeded","reason":"deadline"}}}}',
    "task agent=s35-after skill=work task=6e7f2560-39d0-40ff-8f8b-1ac20f7d142d outcome=failed duration_ms=2.6 traceparent=00-1c20aa7ac6428b731cb36f669a711375-81cb327a7a7518ab-01",
    '{"result":{"message":{"messageId":"61cce8491589471d9320992e8314d7c8","contextId":"351aa015-f634-40fb-8e97-464fbb0e094a","role":"ROLE_AGENT","parts":[{"data":{"pad":"","i":3.0},"mediaType":"application/json"},{"text":"{\\"i\\":3,\\"pad\\":\\"\\"}","mediaType":"text/plain"}],"metadata":{"skill":"direct","traceparent":"00-12b0f5c2990888d6766f69d66d5cab6e-da9ba9d2e5f3be86-01"}}},"id":1,"jsonrpc":"2.0"}',
    "s35-after 0.1.0 serving at http://127.0.0.1:39233 (data /tmp/tmpyp7oq5_k, store sqlite)",
    '{"error":{"code":-32004,"message":"Task 1ac80640-877c-44f0-8add-15fad3317cf8 is in terminal state: TASK_STATE_FAILED","data":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"UNSUPPORTED_OPERATION","domain":"a2a-protocol.org","metadata":{}}]},"id":1,"jsonrpc":"2.0"}',
    '{"result":{"task":{"id":"2aa2f06e-ceff-442f-8542-1c5451dec345","contextId":"15ae884d-b278-4820-a9bd-7df7ef4847ce","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-12-03T08:24:56.972355Z"},"artifacts":[{"artifactId":"answer-2aa2f06e-ceff-442f-8542-1c5451dec345","name":"talk","parts":[{"data":{"n":1.0,"last":"\u2028\u2029\\u0000\\u001f\x7f"},"mediaType":"application/json"},{"text":"{\\"n\\":1,\\"last\\":\\"\u2028\u2029\\\\u0000\\\\u001f\x7f\\"}","mediaType":"text/plain"}]}],"metadata":{"childrenUsage":{},"usage":{"totalTokens":0.0,"inputTokens":0.0,"thinkingTokens":0.0,"outputTokens":0.0,"cachedTokens":0.0},"traceparent":"00-cf2531a00a54c82e337fe75768bb505a-c07dc3080845f907-01","skill":"talk"}}},"id":63,"jsonrpc":"2.0"}',
    '{"task":{"id":"a3134a21-c097-4631-82bb-5a1faa0d4098","contextId":"ctx-%s-64","status":{"state":"TASK_STATE_COMPLETED","timestamp":"2026-12-03T08:24:56.975713Z"},"artifacts":[{"artifactId":"answer-a3134a21-c097-4631-82bb-5a1faa0d4098","name":"talk","parts":[{"data":{"n":1.0,"last":"\u2028\u2029\\u0000\\u001f\x7f"},"mediaType":"application/json"},{"text":"{\\"n\\":1,\\"last\\":\\"\u2028\u2029\\\\u0000\\\\u001f\x7f\\"}","mediaType":"text/plain"}]}],"metadata":{"childrenUsage":{},"usage":{"totalTokens":0.0,"inputTokens":0.0,"thinkingTokens":0.0,"outputTokens":0.0,"cachedTokens":0.0},"traceparent":"00-08383d47a705f3b556557dc8c1a1e2e9-7962a1c098e53b03-01","skill":"talk"}}}',
]
# And texts written to what the patterns look for, and near misses.
SEEN = [
    *_RUN,
    '{"id":"5b7e0c0a-3f1e-4c41-9f59-2d1b6a3f4e10","contextId":"ctx-1","status":{"state":'
    '"TASK_STATE_COMPLETED","timestamp":"2026-12-03T08:07:12.123456Z"}}',
    "task=6f1c2b7d9e0a4b3c8d7e6f5a4b3c2d1e skill=score state=completed duration_ms=1.42 "
    "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "call score at http://127.0.0.1:41234 failed after 0.5 s: ReadTimeout (request 1a2b3c4d5e6f7a8b)",
    'POST / HTTP/1.1\r\nContent-Length: 312\r\n\r\n{"deadline":1764748032.512,"id":3}',
    '{"jsonrpc": "2.0", "id": 1, "error": {"code": -32700, "message": "Parse error: Expecting '
    'value: line 1 column 9 (char 8)"}}',
    '{"answer": "q-1a2b3c4d", "question": "Proceed?", "at": 1764748032.5, "durationMs": 3.25}',
    '{"status": {"timestamp": "20260-01-01T00:00:00Z"}, "nextPageToken": "eyJvIjo0fQ=="}',
    '{"text": "' + "y" * 100 + '", "data": "{\\"b\\": 1, \\"a\\": {\\"d\\": 2, \\"c\\": 3}}"}',
    "slow batch: 3 statements in 2.4 ms on the loop at /tmp/tmpab12cd/tasks.db 0x7f3a2b1c",
    "HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 08:07:12 GMT\r\nserver: uvicorn\r\n\r\n{}",
    "2026-12-03 08:07:12,345 INFO mesh.remote call=score peer=127.0.0.1:8080 ok, 0.25,",
    "still running after 5.0 s: delegation to score goes long",
    "not json at all {",
    "",
]

_PIECES = [
    "5b7e0c0a-3f1e-4c41-9f59-2d1b6a3f4e10",
    "4bf92f3577b34da6a3ce929d0e0e4736",
    "00f067aa0ba902b7",
    "q-1a2b3c4d",
    "q-1A2B3C4D",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    "00-cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02",
    "2026-12-03T08:07:12Z",
    "2026-12-03T08:07:12.123456Z",
    '"2200-01-01T00:00:00.5Z"',
    '"20260-01-01T00:00:00Z"',
    "2026-12-03 08:07:12,345",
    "127.0.0.1:8080",
    "duration_ms=1.25",
    "0.5 s",
    "12.5ms",
    "3.0s",
    "/tmp/tmpab_12/x.db",
    '"deadline": 1764748032.5',
    '"deadline":17',
    "Content-Length: 123",
    '"id":5',
    '"id": 7',
    '"durationMs": 12.5',
    '"at": 1.5e9',
    '"created_at":1',
    '"nextPageToken": "abc"',
    "a" * 64,
    "b" * 63,
    "c" * 130,
    "0x7f3a",
    ", 0.25,",
    ", 1.5e-05,",
    "date: Thu, 03 Dec 2026",
    "Date: x\r\n",
    "still running after",
    "0" * 32,
    "ab" * 16,
    "made-1",
]
_JSON_LEAF = st.one_of(
    st.sampled_from(_PIECES),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
)


def _texts() -> st.SearchStrategy[str]:
    joined = st.lists(
        st.one_of(st.sampled_from(_PIECES), st.text('0123456789abcdef-{}[]":, .\nxq', max_size=12)),
        max_size=8,
    ).map("".join)
    strings = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=4).map(" ".join)
    values = st.recursive(
        st.one_of(_JSON_LEAF, strings),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.sampled_from(["id", "at", "text", "data", "deadline", "b", "a"]),
                inner,
                max_size=4,
            ),
        ),
        max_leaves=12,
    )
    dumped = st.tuples(values, st.booleans()).map(
        lambda v: json.dumps(v[0], separators=(",", ":") if v[1] else None)
    )
    # A JSON object held in a text: some canons sort its keys.
    held = values.map(lambda v: json.dumps({"text": json.dumps(v)}))
    return st.one_of(joined, dumped, held)


@pytest.mark.parametrize(("module", "name", "quiet"), DRIVERS, ids=_IDS)
def test_the_drivers_seen_texts_canonicalise_and_log_as_before(
    module: str, name: str, quiet: bool
) -> None:
    before, now = _pair(module, name, quiet)
    for text in SEEN:
        assert _canon(now, text) == _canon(before, text), text
    if "Logs" in before:  # else the driver keeps no records (``Logs`` unused: test_unused_logs)
        assert _logged(now, SEEN) == _logged(before, SEEN)


@pytest.mark.parametrize(("module", "name", "quiet"), DRIVERS, ids=_IDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(_texts(), min_size=1, max_size=3))
def test_made_texts_canonicalise_and_log_as_before(
    module: str, name: str, quiet: bool, texts: list[str]
) -> None:
    before, now = _pair(module, name, quiet)
    for text in texts:
        assert _canon(now, text) == _canon(before, text), text
    if "Logs" in before:
        assert _logged(now, texts) == _logged(before, texts)


@pytest.mark.parametrize(("module", "name", "quiet"), DRIVERS, ids=_IDS)
def test_unused_logs(module: str, name: str, quiet: bool) -> None:
    """A driver that kept no log records before keeps none now: the prelude's ``Logs`` is
    there, not used."""
    before, _ = _pair(module, name, quiet)
    if "Logs" not in before:
        own = getattr(_MODULES[module], name)[len(prelude()) :]
        assert "Logs" not in own
        assert "LOGS" not in own


def test_each_driver_of_the_four_sessions_that_canonicalises_is_compared_here() -> None:
    """A driver that defines ``canon`` or ``Logs`` and opens with the prelude is in DRIVERS
    (a new one, or one moved onto it, is compared too)."""
    opening = prelude().splitlines()[1]
    with_prelude = {
        (module, name)
        for module, mod in _MODULES.items()
        for name, value in vars(mod).items()
        if name.endswith("_DRIVER") and isinstance(value, str)
        if value.splitlines()[1:2] == [opening]
    }
    assert with_prelude == {(m, n) for m, n, _ in DRIVERS}


@pytest.mark.parametrize("ids", [(), ("[0-9a-f]{16}",), ("q-[0-9a-f]{8}",)])
@pytest.mark.parametrize("traces", [True, False])
@pytest.mark.parametrize("times", [True, False])
def test_the_prelude_scrubs_traces_times_then_ids(
    ids: tuple[str, ...], traces: bool, times: bool
) -> None:
    """Each combination (not only the drivers'): traces before ids (a trace id is 32 hex
    digits), times before ids, nothing it was not asked for."""
    helpers = _helpers(prelude(*ids, traces=traces, times=times))
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    text = f"{trace} 2026-12-03T08:07:12.5Z 00f067aa0ba902b7 q-1a2b3c4d " + "a" * 32
    scrubbed = helpers["scrub"](text)
    assert scrubbed.startswith("<trace> " if traces else "00-<id>-")
    assert ("<time>" in scrubbed) is times
    assert ("00f067aa0ba902b7" in scrubbed) is (ids != ("[0-9a-f]{16}",))
    assert ("q-1a2b3c4d" in scrubbed) is (ids != ("q-[0-9a-f]{8}",))
    assert scrubbed.endswith(" <id>")
