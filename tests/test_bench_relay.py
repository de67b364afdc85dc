"""The hop floor's relay (``tests.bench.servers.fastapi_relay``) answers through its upstream,
on one kept-alive connection it opens again when the upstream went away."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from tests.support import free_port, running

BODY = {"applicant_id": "a-1001", "amount": 25000}


def _echo(port: int) -> list[str]:
    return [sys.executable, "-m", "tests.bench.servers.fastapi_echo", "--port", str(port)]


def test_the_relay_answers_through_the_echo_and_reconnects(tmp_path: Path) -> None:
    up, relay = free_port(), free_port()
    relay_argv = [
        sys.executable,
        "-m",
        "tests.bench.servers.fastapi_relay",
        "--port",
        str(relay),
        "--upstream",
        f"http://127.0.0.1:{up}/echo",
    ]
    url = f"http://127.0.0.1:{relay}/echo"
    health = f"http://127.0.0.1:{relay}/health"
    with running(relay_argv, name="relay", tmp=tmp_path, health=health):
        with running(_echo(up), name="echo", tmp=tmp_path, health=f"http://127.0.0.1:{up}/health"):
            for n in range(3):
                answer = httpx.post(url, json={**BODY, "n": n}, timeout=10)
                assert answer.status_code == 200, answer.text
                assert answer.json() == {**BODY, "n": n}
        # Back on the same port, the relay's connection closed under it: one call opens another.
        with running(
            _echo(up), name="echo-again", tmp=tmp_path, health=f"http://127.0.0.1:{up}/health"
        ):
            answer = httpx.post(url, json=BODY, timeout=10)
            assert answer.status_code == 200, answer.text
            assert answer.json() == BODY
        # The upstream is gone: the relay does not answer by itself.
        assert httpx.post(url, json=BODY, timeout=10).status_code == 500
