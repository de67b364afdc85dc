"""What a request meets before any route: the write token before the body, a bounded body, the
refusal to listen beyond loopback without a token, 405 with ``Allow``, one log line format.
Against real registry processes, with a raw socket client so the test sees WHEN the answer
comes relative to the bytes it has sent."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.registry_support import registry
from tests.support import ROOT, clean_env, free_port, wait_for
from tests.test_one_write import _read_to_close

pytestmark = pytest.mark.integration

CHUNK = 64 * 1024
HUGE = 200 * 1024 * 1024


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


@dataclass
class Answer:
    status: int
    head: str
    sent: int  # body bytes written before the answer was seen


async def _stream(
    port: int, path: str, *, headers: dict[str, str], total: int = HUGE, chunked: bool = True
) -> Answer:
    """POST ``total`` bytes to ``path``, reading the answer concurrently; stop sending as soon
    as an answer arrives (or the server closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    else:
        lines.append(f"Content-Length: {total}")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())

    async def read_head() -> bytes:
        return await reader.readuntil(b"\r\n\r\n")

    answer = asyncio.create_task(read_head())
    sent = 0
    payload = b"x" * CHUNK
    frame = f"{CHUNK:x}\r\n".encode() + payload + b"\r\n" if chunked else payload
    try:
        # Bounded: at most total / CHUNK writes.
        while sent < total and not answer.done():
            writer.write(frame)
            await asyncio.wait_for(writer.drain(), timeout=10)
            sent += CHUNK
            await asyncio.sleep(0)
    except (ConnectionError, TimeoutError):
        pass  # the server closed (or stopped reading) after answering: see below
    try:
        head = (await asyncio.wait_for(answer, timeout=10)).decode()
    finally:
        writer.close()
    status = int(head.split(" ", 2)[1])
    return Answer(status, head, sent)


def test_a_huge_chunked_body_is_refused_while_it_is_still_being_sent(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        before = _rss_kb(reg.proc.pid)
        answer = asyncio.run(_stream(reg.port, "/v1/instances", headers={}))
        assert answer.status == 413, answer.head
        assert "connection: close" in answer.head.lower()
        # The answer came long before 200 MB were sent (socket buffers hold a few MB at most).
        assert answer.sent < HUGE // 4, answer.sent
        assert _rss_kb(reg.proc.pid) - before < 20_000, "the registry buffered the body"
        # Still serving.
        assert httpx.get(f"{reg.url}/health").status_code == 200


def test_a_declared_length_over_the_limit_is_refused_before_any_body(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        answer = asyncio.run(
            _stream(reg.port, "/v1/instances", headers={}, total=HUGE, chunked=False)
        )
        assert answer.status == 413
        assert answer.sent < HUGE // 4
        r = httpx.post(f"{reg.url}/v1/instances", content=b"x" * (64 * 1024 + 1))
        assert r.status_code == 413
        assert r.json()["error"] == "body_too_large"
        assert "65536 bytes" in r.json()["message"]


def test_a_client_sending_a_whole_refused_body_reads_the_413(tmp_path: Path) -> None:
    """Most clients send a request's whole body before they read. The registry answers 413 at
    the head; closed at once, the body's unread bytes made the kernel reset the connection, and
    the client's send failed (broken pipe) instead of it reading the 413: the cause of this
    file's test above failing now and then under load. The connection lingers instead
    (mesh/_one_write.py); the rest of the body is dropped, not parsed as a request."""
    with registry(tmp_path) as reg:
        total = 8 * 1024 * 1024  # far more than the socket buffers hold
        head = f"POST /v1/instances HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", reg.port), timeout=10) as sock:
            sock.sendall(head.encode())
            assert sock.recv(1, socket.MSG_PEEK)  # answered before the body was sent
            sock.sendall(b"x" * total)
            answer = _read_to_close(sock)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
        assert b"body_too_large" in answer
        assert httpx.get(f"{reg.url}/v1/instances").json()["instances"] == []


def test_the_token_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    with registry(tmp_path, token="s3cret") as reg:
        before = _rss_kb(reg.proc.pid)
        answer = asyncio.run(_stream(reg.port, "/v1/instances", headers={}))
        assert answer.status == 401, answer.head
        assert answer.sent < HUGE // 4, answer.sent
        wrong = asyncio.run(
            _stream(reg.port, "/v1/instances", headers={"Authorization": "Bearer nope"})
        )
        assert wrong.status == 403
        assert wrong.sent < HUGE // 4
        assert _rss_kb(reg.proc.pid) - before < 20_000
        # With the token, the body limit still holds.
        ok = asyncio.run(
            _stream(reg.port, "/v1/instances", headers={"Authorization": "bearer s3cret"})
        )
        assert ok.status == 413
        metrics = httpx.get(f"{reg.url}/metrics").text
        assert 'mesh_registry_requests_total{route="gate",status="401"} 1.0' in metrics


def test_a_non_ascii_token_is_compared_as_the_bytes_sent(tmp_path: Path) -> None:
    # The same bytes as the node's gate compares: the token's UTF-8, as a client sends it.
    with registry(tmp_path, token="sécret") as reg:
        headers = {"Authorization": "Bearer sécret"}  # _stream writes the head as UTF-8
        right = asyncio.run(_stream(reg.port, "/v1/instances", headers=headers, total=2 * CHUNK))
        assert right.status == 413, right.head  # past the token check, stopped by the size
        headers = {"Authorization": "Bearer secret"}
        wrong = asyncio.run(_stream(reg.port, "/v1/instances", headers=headers, total=2 * CHUNK))
        assert wrong.status == 403, wrong.head


def _mesh_registry(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mesh", "registry", *args],
        capture_output=True, text=True, timeout=timeout, env=env or clean_env(), cwd=ROOT,
    )  # fmt: skip


def test_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    # Refused before binding anything: the test never listens beyond loopback.
    result = _mesh_registry(
        "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(tmp_path)
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "beyond loopback" in lines[0]
    assert "MESH_REGISTRY_TOKEN" in lines[0]
    assert not (tmp_path / "registry.db").exists()


@pytest.mark.parametrize(
    ("token", "flags", "said"),
    [
        (" ", (), "is blank"),
        ("\t ", (), "is blank"),
        (" s3cret", (), "spaces at either end"),
        (None, ("--token", "  "), "is blank"),
        (None, ("--max-instances", "0"), "--max-instances 0"),
    ],
)
def test_a_token_nobody_could_send_or_no_room_refuses_to_start(
    tmp_path: Path, token: str | None, flags: tuple[str, ...], said: str
) -> None:
    """A blank write token used to be taken (beyond loopback too), after which every write was
    refused: one line at start-up instead, on loopback as anywhere."""
    env = clean_env(**({"MESH_REGISTRY_TOKEN": token} if token is not None else {}))
    result = _mesh_registry(
        "--port", str(free_port()), "--data-dir", str(tmp_path), *flags, env=env, timeout=15
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert said in lines[0]
    assert not (tmp_path / "registry.db").exists()


def test_405_carries_allow_and_the_log_has_one_line_format(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        r = httpx.patch(f"{reg.url}/v1/instances")
        assert r.status_code == 405
        assert r.json()["error"] == "method_not_allowed"
        assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
        wait_for(lambda: "Application startup complete" in reg.proc.output(), what="startup")
        reg.proc.terminate()
    line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")
    lines = [x for x in reg.proc.output().splitlines() if x.strip()]
    assert lines
    assert [x for x in lines if not line.match(x)] == []
