"""A registering instance's card is fetched with one total deadline and a byte cap: a card served
at a trickle fails the registration at the card timeout, a huge card does not grow the registry.
Against a real registry process and a raw server playing the hostile instance."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.raw_http import chunked, raw_server, trickle
from tests.registry_support import registry

pytestmark = pytest.mark.integration

CARD_TIMEOUT_S = 5.0  # RegistrySettings.card_timeout_s


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def _body(url: str) -> dict[str, str]:
    return {"instance_id": "hostile-1", "agent": "echo", "url": url}


async def test_a_trickling_card_fails_the_registration_at_the_card_timeout(
    tmp_path: Path,
) -> None:
    # One byte every 0.5 s for up to 40 s: under a per-read timeout this never times out.
    with registry(tmp_path) as reg:
        async with raw_server(trickle(0.5, 80)) as srv, httpx.AsyncClient(timeout=60) as http:
            started = time.monotonic()
            r = await http.post(f"{reg.url}/v1/instances", json=_body(srv.url))
            took = time.monotonic() - started
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_card"
    assert CARD_TIMEOUT_S - 0.5 < took < CARD_TIMEOUT_S + 3, took


async def test_a_huge_card_does_not_grow_the_registry(tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        async with httpx.AsyncClient(timeout=60) as http:
            # Warm the registration path so the baseline includes what it imports and caches.
            await http.post(f"{reg.url}/v1/instances", json=_body("http://127.0.0.1:9"))
            before = _rss_kb(reg.proc.pid)
            # 300 MB, chunked: no Content-Length to refuse up front, the cap must hold mid-read.
            async with raw_server(chunked(300 << 20)) as srv:
                r = await http.post(f"{reg.url}/v1/instances", json=_body(srv.url))
            after = _rss_kb(reg.proc.pid)
    assert r.status_code == 422
    assert r.json()["error"] == "invalid_card"
    assert after - before < 30_000, f"RSS grew {before} -> {after} kB"
