"""Hostile input to a real node: numbers JSON-RPC cannot carry, deep nesting, random data parts
(a property test), oversized text turns and many large bodies at once. Every answer is a JSON-RPC
error or a finished task naming what was wrong: never a 500, never a half-written task. The
typed fast path (``MESH_FASTPATH=1``) and the SDK path are checked alike."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import clean_env, free_port, running

pytestmark = pytest.mark.integration

HEADERS = {"A2A-Version": "1.0", "Content-Type": "application/json"}


def _serve(tmp: Path, name: str, **env: str) -> Any:
    port = free_port()
    argv = ["mesh", "serve", "tests.input_agents:agent", "--port", str(port)]
    argv += ["--data-dir", str(tmp / name), "--no-register"]
    url = f"http://127.0.0.1:{port}"
    return url, running(argv, name=name, tmp=tmp, health=f"{url}/health", env=clean_env(**env))


@pytest.fixture(scope="module", params=["fast", "sdk"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same agent with the typed fast path on, and off."""
    tmp = tmp_path_factory.mktemp(f"input-{request.param}")
    url, proc = _serve(
        tmp,
        request.param,
        MESH_FASTPATH="1" if request.param == "fast" else "0",
        MESH_MAX_TEXT_BYTES="4096",
    )
    with proc as running_node:
        _LOGS[url] = running_node
        yield url


_LOGS: dict[str, Any] = {}


def _send_body(data_json: str, *, skill: str = "echo", request_id: int = 7) -> str:
    """A SendMessage request whose data part is the JSON text ``data_json``, written by hand so
    it can hold what ``json.dumps`` cannot write (``1e400``)."""
    message = (
        f'{{"messageId":"{uuid.uuid4().hex}","role":"ROLE_USER",'
        f'"parts":[{{"data":{data_json},"mediaType":"application/json"}}],'
        f'"metadata":{{"skill":"{skill}"}}}}'
    )
    return (
        f'{{"jsonrpc":"2.0","id":{request_id},"method":"SendMessage",'
        f'"params":{{"message":{message}}}}}'
    )


def _post(url: str, body: str | bytes) -> httpx.Response:
    return httpx.post(url + "/", content=body, headers=HEADERS, timeout=30, trust_env=False)


def _task_count(url: str) -> int:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 1}}
    r = httpx.post(url + "/", json=rpc, headers=HEADERS, timeout=10, trust_env=False)
    return int(r.json()["result"].get("totalSize", 0))


def _answer(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer; fails on a 5xx or a body that is not JSON."""
    assert r.status_code < 500, (r.status_code, r.text[:300])
    answer = r.json()
    assert isinstance(answer, dict), answer
    return answer


@pytest.mark.parametrize(
    ("literal", "code", "said"),
    [
        ("NaN", -32700, "NaN at params.message.parts[0].data.extra"),
        ("Infinity", -32700, "Infinity at params.message.parts[0].data.extra"),
        ("-Infinity", -32700, "-Infinity at params.message.parts[0].data.extra"),
        ("1e400", -32602, "params.message.parts[0].data.extra: 1e400 is out of the range"),
        ("-1e400", -32602, "params.message.parts[0].data.extra: -1e400 is out of the range"),
        ("1" + "0" * 5000, -32602, "params.message.parts[0].data.extra: the integer"),
    ],
)
def test_numbers_no_double_holds_are_refused_naming_the_field(
    node: str, literal: str, code: int, said: str
) -> None:
    before = _task_count(node)
    answer = _answer(_post(node, _send_body(f'{{"key":"k","n":1,"extra":{literal}}}')))
    assert answer["error"]["code"] == code, answer
    assert said in answer["error"]["message"]
    # -32700: the id could not be trusted (the body is not JSON); -32602: it is the caller's.
    assert answer["id"] == (None if code == -32700 else 7)
    assert _task_count(node) == before  # nothing half-written


@pytest.mark.parametrize("depth", [1000, 5000])
def test_json_nested_too_deeply_is_a_parse_error(node: str, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    answer = _answer(_post(node, _send_body(f'{{"key":"k","n":1,"extra":{nested}}}')))
    assert answer["error"]["code"] == -32700
    assert "nested too deeply" in answer["error"]["message"]


def test_a_body_that_is_not_utf8_json_is_a_parse_error(node: str) -> None:
    answer = _answer(_post(node, b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}'))
    assert answer["error"]["code"] == -32700


_GET = '"method":"GetTask","params":{"id":"t-1"}'


@pytest.mark.parametrize(
    ("body", "code", "said", "answer_id"),
    [
        ('{"jsonrpc":"2.0","id":{"a":1},' + _GET + "}", -32600, "'id' must be", None),
        ('{"jsonrpc":"2.0","id":1.5,' + _GET + "}", -32600, "got a number written with", None),
        ('{"jsonrpc":"2.0","id":true,' + _GET + "}", -32600, "'id' must be", None),
        ('{"jsonrpc":"2.0","id":[1],' + _GET + "}", -32600, "'id' must be", None),
        ("[]", -32600, "is an object, got an array (batches", None),
        ('"GetTask"', -32600, "is an object, got a string", None),
        ('{"jsonrpc":"1.0","id":3,' + _GET + "}", -32600, "'jsonrpc' must be", 3),
        ('{"id":3,' + _GET + "}", -32600, "'jsonrpc' must be", 3),
        ('{"jsonrpc":"2.0","id":"a","params":{}}', -32600, "'method' must be", "a"),
        ('{"jsonrpc":"2.0","id":3,"method":5}', -32600, "'method' must be", 3),
        ('{"jsonrpc":"2.0","id":3,"method":"GetTask","params":[1]}', -32602, "'params'", 3),
        ('{"jsonrpc":"2.0","id":3,"method":"GetTask","params":null}', -32602, "'params'", 3),
        # Params the SDK itself cannot parse: its answer, without its ERROR traceback.
        ('{"jsonrpc":"2.0","id":3,"method":"SendMessage","params":{"message":5}}', -32602, "", 3),
        ('{"jsonrpc":"2.0","id":3,"method":"GetTask","params":{"id":{"a":1}}}', -32602, "", 3),
    ],
)
def test_a_body_that_is_not_one_json_rpc_request_is_refused_by_the_gate(
    node: str, body: str, code: int, said: str, answer_id: Any
) -> None:
    """JSON-RPC 2.0: one object, ``jsonrpc`` "2.0", a ``method`` string, an ``id`` that is a
    string, a number or null. The SDK answered these too, but logged an ERROR with a traceback
    for each."""
    log = _LOGS[node]
    before = log.output().count("Traceback")
    answer = _answer(_post(node, body))
    assert answer["error"]["code"] == code, answer
    assert said in answer["error"]["message"], answer
    assert answer["id"] == answer_id
    ok = _answer(_post(node, '{"jsonrpc":"2.0","id":"x",' + _GET + "}"))  # flushes the log
    assert ok["error"]["code"] == -32001  # task not found: an ordinary answer
    assert log.output().count("Traceback") == before, log.output()[-2000:]


# Values a data part may hold as far as a sender's JSON encoder is concerned: every float
# (non-finite ones too, and often: Python writes NaN/Infinity), integers beyond a double, any
# text, nesting, empty keys.
_leaf = (
    st.none()
    | st.booleans()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([math.nan, math.inf, -math.inf])
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.text(max_size=20)
)
_values = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=100,
    deadline=5000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(value=_values, wrapped=st.booleans())
def test_random_data_parts_never_get_a_500(node: str, value: Any, wrapped: bool) -> None:
    data = {"key": "k", "n": 1, "extra": value} if wrapped else value
    answer = _answer(_post(node, _send_body(json.dumps(data, allow_nan=True))))
    if "error" in answer:
        assert answer["error"]["code"] in (-32700, -32600, -32602), answer
        return
    state = answer["result"]["task"]["status"]["state"]
    assert state in ("TASK_STATE_COMPLETED", "TASK_STATE_REJECTED"), answer
    if wrapped and state == "TASK_STATE_COMPLETED":
        assert _finite(value)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


@pytest.fixture(scope="module")
def small_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A node that holds at most 3 MB of request bodies at once."""
    tmp = tmp_path_factory.mktemp("inflight")
    url, proc = _serve(tmp, "small", MESH_MAX_INFLIGHT_BYTES=str(3_000_000))
    with proc:
        yield url


async def test_bodies_in_flight_are_bounded_and_the_rest_told_to_retry(small_node: str) -> None:
    pad = "x" * 1_400_000
    body = _send_body(json.dumps({"seconds": 1.5, "pad": pad}), skill="pause")
    async with httpx.AsyncClient(timeout=30, headers=HEADERS, trust_env=False) as http:
        answers = await asyncio.gather(
            *(http.post(small_node + "/", content=body) for _ in range(6))
        )
        codes = sorted(r.status_code for r in answers)
        # Two 1.4 MB bodies fit in 3 MB; the others are refused as their bytes pass the bound.
        assert codes.count(200) >= 2, codes
        assert codes.count(503) >= 1, codes
        assert set(codes) <= {200, 503}, codes
        for r in answers:
            if r.status_code == 200:
                assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            else:
                assert r.headers["retry-after"] == "1"
                assert "MESH_MAX_INFLIGHT_BYTES" in r.json()["error"]
        # Once they are answered their bytes are free again: a retry goes through.
        retry = await http.post(small_node + "/", content=body.replace("1.5", "0.01"))
        assert retry.status_code == 200, retry.text


@pytest.fixture(scope="module")
def prompt_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A node with the default body and in-flight bounds (10 and 16 MiB) whose request bodies
    must arrive within 2 s."""
    tmp = tmp_path_factory.mktemp("body-timeout")
    url, proc = _serve(tmp, "prompt", MESH_BODY_TIMEOUT="2")
    with proc as running_node:
        _LOGS[url] = running_node
        yield url


async def _declare(
    url: str, length: int, first: bytes = b"{"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST / declaring ``length`` body bytes, of which only ``first`` is sent now (as
    /tmp/attack-scripts/inflight_hold.py did)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    writer.write(head.encode() + first)
    await writer.drain()
    return reader, writer


async def test_idle_connections_declaring_big_bodies_hold_nothing(prompt_node: str) -> None:
    """Two connections that declare 10 and 6 MiB and send one byte each held the node's whole
    in-flight budget (16 MiB): every other call got 503 for as long as they stayed open."""
    idle = [await _declare(prompt_node, 10 * 1024 * 1024), await _declare(prompt_node, 6 << 20)]
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=10, headers=HEADERS, trust_env=False) as http:
            for _ in range(3):  # bounded: the idle connections are in before the later ones
                r = await http.post(prompt_node + "/", content=_send_body('{"key":"k"}'))
                assert r.status_code == 200, r.text
                assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        # And they do not stay: 408 once their bodies are 2 s late, then the connection closes
        # (read() returns at the close).
        for reader, _ in idle:
            answer = await asyncio.wait_for(reader.read(), timeout=10)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"connection: close" in answer.lower()
            assert b"MESH_BODY_TIMEOUT" in answer
        assert 1.9 < time.monotonic() - started < 8
    finally:
        for _, writer in idle:
            writer.close()


async def test_a_trickling_body_is_cut_at_the_deadline(prompt_node: str) -> None:
    host, port = prompt_node.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = _send_body('{"key":"k"}').encode()
    writer.write(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"A2A-Version: 1.0\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    started = time.monotonic()
    answer = asyncio.create_task(reader.read())
    try:
        for byte in body:  # bounded: one byte every 0.1 s would take far longer than 2 s
            if answer.done():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)
        head = await asyncio.wait_for(answer, timeout=10)
    except ConnectionError:
        head = await asyncio.wait_for(answer, timeout=10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 408 "), head[:200]
    assert 1.9 < time.monotonic() - started < 5
    assert _counted(prompt_node, "body_timeout") >= 1


def _counted(url: str, method: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mesh_requests_total{") and f'method="{method}"' in line
    )


async def test_a_declared_length_over_the_body_limit_is_refused_at_once(
    prompt_node: str,
) -> None:
    reader, writer = await _declare(prompt_node, 10 * 1024 * 1024 + 1)
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=1.5)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 413 "), head


async def test_a_delegation_s_refused_body_is_told_as_the_413(prompt_node: str) -> None:
    """A coordinator's pool (``DirectPool``, what a remote tool posts with) writes the whole
    body, then reads; the node answers 413 at the head. The caller must read that 413 (naming
    the limit), not a write error (which a remote call retries as a transient failure). Before
    the lingering close (mesh/_one_write.py) that was a race between the client's read of the
    answer and the reset the node's close made; the raw-socket form of it is
    tests/test_one_write.py's."""
    from mesh._pool import DirectPool

    pool = DirectPool(None, max_connections=4, keepalive_expiry=5)
    body = b"x" * (10 * 1024 * 1024 + 1)
    try:
        for _ in range(3):
            status, answer = await pool.post(
                httpx.URL(prompt_node + "/"),
                list(HEADERS.items()),
                body,
                timeout=30,
                connect_timeout=5,
                max_bytes=1 << 20,
                too_large=lambda: AssertionError("too large"),
            )
            assert status == 413, answer
            assert b"MESH_MAX_BODY_BYTES" in answer, answer
    finally:
        await pool.aclose()


async def test_one_request_alone_is_let_in_whatever_the_in_flight_bound(tmp_path: Path) -> None:
    url, proc = _serve(tmp_path, "tiny", MESH_MAX_INFLIGHT_BYTES="1000")
    with proc:
        body = _send_body(json.dumps({"key": "k", "n": 1, "pad": "y" * 50_000}))
        async with httpx.AsyncClient(timeout=30, headers=HEADERS, trust_env=False) as http:
            r = await http.post(url + "/", content=body)
    assert r.status_code == 200
    assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


def _chat(url: str, text: str, *, skill: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": text}] if skill is None else [{"data": {"text": text}}],
    }
    if skill is not None:
        message["metadata"] = {"skill": skill}
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    r = httpx.post(url + "/", json=rpc, headers=HEADERS, timeout=30, trust_env=False)
    task: dict[str, Any] = _answer(r)["result"]["task"]
    return task


def _model_calls(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mesh_model_calls_total{")
    )


@pytest.mark.parametrize(
    ("text", "skill"),
    [
        ("a" * 4097, None),  # chat, one byte over MESH_MAX_TEXT_BYTES=4096
        ("é" * 2049, None),  # 4098 bytes in UTF-8, 2049 characters
        ("a" * 5000, "summarize"),  # an LLM skill: its turn is the input as JSON
    ],
)
def test_a_text_turn_over_the_limit_is_rejected_before_the_model(
    node: str, text: str, skill: str | None
) -> None:
    calls = _model_calls(node)
    task = _chat(node, text, skill=skill)
    assert task["status"]["state"] == "TASK_STATE_REJECTED", task
    said = task["status"]["message"]["parts"][0]["text"]
    assert "4096 bytes (MESH_MAX_TEXT_BYTES)" in said, said
    assert _model_calls(node) == calls  # no model work


def test_a_text_turn_within_the_limit_is_answered(node: str) -> None:
    assert _chat(node, "a" * 4000)["status"]["state"] == "TASK_STATE_COMPLETED"
    assert _chat(node, "é" * 2000)["status"]["state"] == "TASK_STATE_COMPLETED"
    task = _chat(node, "a" * 3000, skill="summarize")
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task


def test_a_skill_id_that_cannot_be_one_is_rejected(node: str) -> None:
    before = _task_count(node)
    body = _send_body('{"key":"k"}', skill="s" * 5000)
    task = _answer(_post(node, body))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_REJECTED"
    assert "at most 128 characters" in task["status"]["message"]["parts"][0]["text"]
    assert _task_count(node) == before + 1


def _with_deadline(deadline: Any) -> str:
    body = json.loads(_send_body('{"key":"k"}'))
    body["params"]["message"]["metadata"]["deadline"] = deadline
    return json.dumps(body)


@pytest.mark.parametrize(
    "deadline", ["nan", "NaN", "inf", "-Infinity", "1e999", "soon", {"at": 5}, True, [1.0]]
)
def test_a_deadline_that_is_not_a_finite_number_is_rejected_naming_it(
    node: str, deadline: Any
) -> None:
    """``"nan"`` ended FAILED "internal error" (the skill's timer cannot take NaN) and ``"inf"``
    ran with no deadline: float() takes both strings."""
    task = _answer(_post(node, _with_deadline(deadline)))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_REJECTED", task
    said = task["status"]["message"]["parts"][0]["text"]
    assert "metadata field 'deadline' must be epoch seconds (a finite number)" in said, said
    assert task["metadata"]["error"]["reason"] == "rejected"


@pytest.mark.parametrize("ahead", [60, "60"])
def test_a_deadline_as_a_number_or_a_numeric_string_is_kept(node: str, ahead: Any) -> None:
    deadline = time.time() + 60 if ahead == 60 else str(time.time() + 60)
    task = _answer(_post(node, _with_deadline(deadline)))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    past = _answer(_post(node, _with_deadline(str(time.time() - 1))))["result"]["task"]
    assert past["status"]["state"] == "TASK_STATE_REJECTED"
    assert past["metadata"]["error"]["reason"] == "deadline"


def test_the_answer_does_not_echo_a_large_input(node: str) -> None:
    """A blocking send's answer leaves out the caller's own message unless historyLength asks
    for it; the task keeps it (GetTask)."""
    pad = "z" * 1_000_000
    body = _send_body(json.dumps({"key": "k", "n": 1, "pad": pad}))
    r = _post(node, body)
    task = _answer(r)["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert len(r.content) < 10_000, len(r.content)
    assert all(m["role"] == "ROLE_AGENT" for m in task.get("history", []))
    rpc = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task["id"]}}
    stored = httpx.post(node + "/", json=rpc, headers=HEADERS, timeout=30, trust_env=False)
    history = stored.json()["result"]["history"]
    assert history[0]["role"] == "ROLE_USER"
    assert history[0]["parts"][0]["data"]["pad"] == pad
    # Asked for, it is there (A2A: historyLength is the most the answer may hold).
    asked = json.loads(_send_body(json.dumps({"key": "k", "n": 1})))
    asked["params"]["configuration"] = {"historyLength": 5}
    task = _answer(_post(node, json.dumps(asked)))["result"]["task"]
    assert [m["role"] for m in task["history"]] == ["ROLE_USER", "ROLE_AGENT"]


@pytest.mark.parametrize(
    "body",
    [
        '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"a":NaN x}}',
        "NaN{}",
        '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"a":[1e400,}}',
        '{"a":' + "1" * 5000 + ",,}",
        '{"a":Infinity,"b":' + "[" * 5000 + "]" * 4999 + "}",
    ],
)
def test_a_number_no_double_holds_before_a_syntax_error_is_a_parse_error(
    node: str, body: str
) -> None:
    """The strict parse stops at the number (its hook runs first); the body is still not
    JSON further on, or too deep: a parse error, not a 500 with a traceback."""
    log = _LOGS[node]
    before = log.output().count("Traceback")
    r = _post(node, body)
    assert r.status_code == 200, r.text
    answer = _answer(r)
    assert answer["error"]["code"] == -32700, answer
    assert answer["error"]["message"].startswith("Parse error: "), answer
    assert answer["id"] is None
    ok = _answer(_post(node, '{"jsonrpc":"2.0","id":"x",' + _GET + "}"))  # flushes the log
    assert ok["error"]["code"] == -32001
    assert log.output().count("Traceback") == before, log.output()[-2000:]
