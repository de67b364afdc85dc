"""The embedded registry at fleet scale (issue 21; docs/performance.md, "The registry at fleet
scale").

    python -m tests.bench.registry_scale                      # 100, 1,000 and 10,000 instances
    python -m tests.bench.registry_scale --sizes 100,1000 --steady 20
    make bench-registry

For each size N: a real registry (``python -m registry``, default intervals: probes every 5 s,
2 s deadline, TTL 30 s) and ONE ``tests.bench.fleet`` process serving every instance on one
port (``/i/<n>``: a card, a ``/health`` naming its instance id, answered at once, without the
console's stats unless ``--stats``). Phases:

1. registration: N registrations through the API, 32 at once (the registry's fetch slots);
   registrations per second and p99;
2. steady state for ``--steady`` seconds: every instance heartbeats every 5 s (a node's
   default; from its registration on), spread evenly, over 32 raw keep-alive connections (a cheap client, so the bench
   measures the registry, not httpx), while one client looks an agent up in a loop
   (``GET /v1/instances?agent=``): heartbeats sustained vs needed, lookup p50/p99, the
   registry's CPU per second and RSS, the last probe round's duration, whether the registry
   said it was behind, and how many live instances were ever not passing (false alarms);
3. with the heartbeats still running: Prometheus SD (``/v1/prometheus/targets``) and the
   operator page (``/``), median of 3; one more instance on a fleet process of its own is
   killed (-9) and stops heartbeating: seconds until the registry lists it critical;
4. the database's size (``registry.db`` and its WAL);
5. the console's gathering (what the probes bring back for ``/topology``; with ``--stats``
   each answer carries a node's window stats, as a mesh node's does): the bytes of one
   ``/health?stats=1`` answer (mean over the agents) times the instances a round probes, the
   registry's CPU per probe interval (the steady state's, heartbeats included: compare a run
   without ``--stats``), the instances the gathering holds stats for, and ``GET /v1/topology``
   over the whole fleet (median of 3).

Prints one table (a column per size) and writes every figure to
``bench-results/registry_scale.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.bench.procstat import cpu_seconds, rss_bytes
from tests.support import ROOT, Proc, clean_env, free_port, wait_until_ok

HEARTBEAT_S = 5.0
PROBE_INTERVAL_S = 5.0  # the registry's default, which the bench runs it at
AGENTS = 100
CONNECTIONS = 32
DEFAULT_JSON = ROOT / "bench-results" / "registry_scale.json"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def _fleet(tmp: Path, *, stats: bool, name: str = "fleet") -> Iterator[tuple[Proc, str]]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.bench.fleet", "--port", str(port),
            "--agents", str(AGENTS), *([] if stats else ["--no-stats"])]  # fmt: skip
    with Proc.start(argv, name=f"{name}-{port}", tmp=tmp, env=clean_env()) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until_ok(f"{url}/ready", proc=proc)
        yield proc, url


class RawHttp:
    """One keep-alive HTTP/1.1 connection with hand-written requests: a heartbeat costs the
    client a few microseconds, so the client never limits what the registry is asked."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, target: str, headers: str = "") -> int:
        (status,) = await self.pipeline([(method, target, headers)])
        return status

    async def pipeline(self, requests: list[tuple[str, str, str]]) -> list[int]:
        """Send every request at once (HTTP/1.1 pipelining), then read their answers' statuses:
        a client that keeps a server busy at a fraction of the server's cost per request."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._writer.write(
            b"".join(
                f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n"
                f"{headers}\r\n".encode()
                for method, target, headers in requests
            )
        )
        return [await self._answer() for _ in requests]

    async def _answer(self) -> int:
        assert self._reader is not None
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        await self._reader.readexactly(length)
        return status

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


async def _register(
    reg: str, fleet: str, ids: list[int], prefix: str, secrets: dict[str, str] | None = None
) -> tuple[dict[str, str], list[float]]:
    secrets = {} if secrets is None else secrets
    took: list[float] = []
    retried: list[int] = []
    slots = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as http:

        async def one(n: int) -> None:
            body = {"instance_id": f"{prefix}-{n}", "agent": f"agent-{n % AGENTS}",
                    "url": f"{fleet}/i/{n}", "version": "1"}  # fmt: skip
            async with slots:
                for _ in range(100):
                    started = time.perf_counter()
                    r = await http.post(f"{reg}/v1/instances", json=body)
                    if r.status_code == 201:
                        took.append(time.perf_counter() - started)
                        secrets[body["instance_id"]] = r.json()["secret"]
                        return
                    # 503 registry_busy: its fetch slots are full; 422 invalid_card "within
                    # 5s": the card fetch timed out on a starved machine. A node's Registrar
                    # retries both; so does the bench (and says so).
                    timed_out = r.status_code == 422 and "within" in r.text
                    if r.status_code != 503 and not timed_out:
                        raise AssertionError(f"registering {n}: {r.status_code} {r.text}")
                    retried.append(r.status_code)
                    await asyncio.sleep(0.05)
                raise AssertionError(f"registering {n}: still busy")

        await asyncio.gather(*(one(n) for n in ids))
    if retried:
        print(f"registrations retried: {len(retried)} ({retried.count(503)} registry_busy, "
              f"{retried.count(422)} card fetch timed out)", file=sys.stderr)  # fmt: skip
    return secrets, took


class _Heartbeats:
    """Every instance heartbeats once per ``HEARTBEAT_S``, spread evenly, until stopped; an
    instance from its registration on (``secrets`` grows as they register), as nodes do."""

    def __init__(self, port: int, secrets: dict[str, str]) -> None:
        self._port = port
        self._secrets = secrets
        self.sent = self.ok = self.failed = 0
        self.late: list[float] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for k in range(CONNECTIONS):
            self._tasks.append(asyncio.create_task(self._lane(k)))

    async def _lane(self, k: int) -> None:
        raw = RawHttp(self._port)
        items: list[tuple[str, str]] = []
        gap = due = 0.0
        i = 0
        try:
            while not self._stop.is_set():
                if i >= len(items):  # a new pass, over the instances registered by now
                    items, i = list(self._secrets.items())[k::CONNECTIONS], 0
                    if not items:
                        await asyncio.sleep(0.1)
                        continue
                    gap = HEARTBEAT_S / len(items)
                    due = max(due, time.monotonic())
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    self.late.append(-delay)
                iid, secret = items[i]
                self.sent += 1
                try:
                    status = await asyncio.wait_for(
                        raw.request(
                            "PUT",
                            f"/v1/instances/{iid}/heartbeat",
                            f"Mesh-Instance-Secret: {secret}\r\n",
                        ),
                        timeout=10,
                    )
                except (TimeoutError, OSError, asyncio.IncompleteReadError):
                    raw.close()
                    raw = RawHttp(self._port)
                    status = 0
                if status == 200:
                    self.ok += 1
                else:
                    self.failed += 1
                i += 1
                due += gap
        finally:
            raw.close()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


async def _lookups(port: int, stop: asyncio.Event, took: list[float]) -> None:
    raw = RawHttp(port)
    k = 0
    try:
        while not stop.is_set():
            started = time.perf_counter()
            status = await raw.request("GET", f"/v1/instances?agent=agent-{k % AGENTS}")
            took.append(time.perf_counter() - started)
            assert status == 200, status
            k += 1
            await asyncio.sleep(0.01)
    finally:
        raw.close()


async def _watch(reg: str, stop: asyncio.Event, seen: dict[str, Any]) -> None:
    """Every 2 s: the prober's last round, whether the registry says it is behind, and the
    live instances not passing (each a false alarm: every instance here is alive)."""
    async with httpx.AsyncClient(timeout=30) as http:
        while not stop.is_set():
            doc = (await http.get(f"{reg}/introspect")).json()
            prober, counts = doc["prober"], doc["instances"]
            seen["round_s"] = max(seen.get("round_s", 0.0), prober["last_round"]["duration_s"])
            seen["rounds"] = prober["last_round"]["rounds"]
            seen["probed"] = prober["last_round"].get("probed", 0)
            seen["unknown"] = max(seen.get("unknown", 0), prober["last_round"].get("unknown", 0))
            # Missed TTLs held back because the registry was saturated (the two-TTL rule).
            seen["deferred"] = max(seen.get("deferred", 0), prober["last_round"].get("deferred", 0))
            seen["behind"] = seen.get("behind", False) or bool(prober.get("behind"))
            for why in prober.get("behind") or ():  # e.g. "event loop busy 97% of the last 3s"
                whys = seen.setdefault("why_behind", [])
                if " ".join(why.split()[:3]) not in whys:
                    whys.append(" ".join(why.split()[:3]))
            bad = counts["warning"] + counts["critical"]
            seen["not_passing"] = max(seen.get("not_passing", 0), bad)
            with_timeout = asyncio.create_task(asyncio.sleep(2.0))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({with_timeout, stopped}, return_when=asyncio.FIRST_COMPLETED)
            with_timeout.cancel()
            stopped.cancel()


def _answer_bytes(fleet: str, instances: int) -> float:
    """The mean body of ``/health?stats=1`` over the first instances (one per agent: each agent's
    stats differ), what the registry reads per probe."""
    sizes = [
        len(httpx.get(f"{fleet}/i/{k}/health", params={"stats": "1"}, timeout=30).content)
        for k in range(instances)
    ]
    return statistics.fmean(sizes)


def _median_ms(url: str) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        r = httpx.get(url, timeout=120)
        times.append(time.perf_counter() - started)
        assert r.status_code == 200, (url, r.status_code)
    return statistics.median(times) * 1000


async def _dead_marked(reg: str, tmp: Path, stats: bool, heartbeats_port: int) -> float:
    """Seconds from kill -9 of a heartbeating instance's process until it is listed critical."""
    with _fleet(tmp, stats=stats, name="doomed") as (proc, url):
        secrets, _ = await _register(reg, url, [0], "doomed")
        raw = RawHttp(heartbeats_port)
        ((iid, secret),) = secrets.items()
        await raw.request("PUT", f"/v1/instances/{iid}/heartbeat",
                          f"Mesh-Instance-Secret: {secret}\r\n")  # fmt: skip
        raw.close()
        proc.kill()
        killed = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() - killed < 120:
            r = await http.get(
                f"{reg}/v1/instances", params={"agent": "agent-0", "status": "critical"}
            )
            if any(i["instance_id"] == iid for i in r.json()["instances"]):
                return time.monotonic() - killed
            await asyncio.sleep(0.1)
    return float("inf")


@contextmanager
def _py_spy(pid: int, out: Path | None, seconds: float) -> Iterator[None]:
    """``py-spy record`` of the registry over the steady state, when ``out`` is given (the
    ``--profile`` option): collapsed stacks, one line per stack with its sample count."""
    if out is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
            "--duration", str(int(seconds)), "--rate", "200", "--nonblocking",
            "--format", "raw", "--output", str(out)]  # fmt: skip
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.wait(timeout=seconds + 60)


async def measure(
    n: int, *, steady_s: float, stats: bool, profile: Path | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="registry-scale-") as tmp_dir:
        tmp = Path(tmp_dir)
        data = tmp / "reg"
        port = free_port()
        reg = f"http://127.0.0.1:{port}"
        reg_argv = [sys.executable, "-m", "registry", "--port", str(port), "--data-dir",
                    str(data), "--max-instances", str(n + 10), "--log-level", "warning"]  # fmt: skip
        with (
            _fleet(tmp, stats=stats) as (_, fleet),
            Proc.start(reg_argv, name="registry", tmp=tmp, env=clean_env()) as reg_proc,
        ):
            wait_until_ok(f"{reg}/health", proc=reg_proc)
            secrets: dict[str, str] = {}
            beats = _Heartbeats(port, secrets)
            beats.start()  # each instance heartbeats from its registration on
            stop = asyncio.Event()
            seen: dict[str, Any] = {}
            watch = asyncio.create_task(_watch(reg, stop, seen))  # false alarms from the start
            started = time.perf_counter()
            _, took = await _register(reg, fleet, list(range(n)), "fleet", secrets)
            register_s = time.perf_counter() - started
            # One heartbeat period for the last registered to be heartbeating, then measure.
            await asyncio.sleep(HEARTBEAT_S)
            lookups: list[float] = []
            cpu0, clock0 = cpu_seconds(reg_proc.pid), time.perf_counter()
            sent0, ok0, failed0 = beats.sent, beats.ok, beats.failed
            beats.late.clear()
            side = [asyncio.create_task(_lookups(port, stop, lookups)), watch]
            with _py_spy(reg_proc.pid, profile and profile / f"registry-{n}.txt", steady_s):
                await asyncio.sleep(steady_s)
            cpu = (cpu_seconds(reg_proc.pid) - cpu0) / (time.perf_counter() - clock0)
            sent, ok, failed = beats.sent - sent0, beats.ok - ok0, beats.failed - failed0
            stop.set()
            await asyncio.gather(*side)
            sd_ms = await asyncio.to_thread(_median_ms, f"{reg}/v1/prometheus/targets")
            page_ms = await asyncio.to_thread(_median_ms, f"{reg}/")
            dead_s = await _dead_marked(reg, tmp, stats, port)
            rss = rss_bytes(reg_proc.pid)
            gathering = (
                await asyncio.to_thread(httpx.get, f"{reg}/introspect", timeout=30)
            ).json()["gathering"]
            topology_ms = await asyncio.to_thread(_median_ms, f"{reg}/v1/topology")
            answer_bytes = await asyncio.to_thread(_answer_bytes, fleet, min(n, AGENTS))
            await beats.stop()
        db = sum(p.stat().st_size for p in data.glob("registry.db*"))
    return {
        "instances": n,
        "register_per_s": n / register_s,
        "register_p99_ms": _pct(took, 0.99) * 1000,
        "heartbeats_needed_per_s": n / HEARTBEAT_S,
        "heartbeats_sent_per_s": sent / steady_s,
        "heartbeats_ok_per_s": ok / steady_s,
        "heartbeats_failed": failed,
        "heartbeats_late_p99_s": _pct(beats.late, 0.99) if beats.late else 0.0,
        "lookup_p50_ms": _pct(lookups, 0.5) * 1000,
        "lookup_p99_ms": _pct(lookups, 0.99) * 1000,
        "prometheus_sd_ms": sd_ms,
        "page_ms": page_ms,
        "probe_round_s": seen.get("round_s", float("nan")),
        "probe_rounds": seen.get("rounds", 0),
        "probed_per_round": seen.get("probed", 0),
        "unknown_probes_max": seen.get("unknown", 0),
        "deferred_max": seen.get("deferred", 0),
        "why_behind": seen.get("why_behind", []),
        "behind": seen.get("behind", False),
        "false_alarms_max": seen.get("not_passing", 0),
        "dead_marked_s": dead_s,
        "registry_cpu": cpu,
        "registry_rss_mb": rss / 2**20,
        "stats": stats,
        "health_answer_bytes": answer_bytes,
        "gathered_bytes_per_round": answer_bytes * seen.get("probed", 0),
        "registry_cpu_ms_per_interval": cpu * PROBE_INTERVAL_S * 1000,
        "instances_with_stats": gathering["instances_with_stats"],
        "topology_ms": topology_ms,
        "db_mb": db / 2**20,
    }


ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("registrations/s (p99 ms)", lambda r: f"{r['register_per_s']:.0f} ({r['register_p99_ms']:.0f})"),
    ("heartbeats/s ok / needed", lambda r: f"{r['heartbeats_ok_per_s']:.0f} / {r['heartbeats_needed_per_s']:.0f}"),
    ("heartbeats failed", lambda r: str(r["heartbeats_failed"])),
    ("lookup p50 / p99 ms", lambda r: f"{r['lookup_p50_ms']:.2f} / {r['lookup_p99_ms']:.1f}"),
    ("Prometheus SD ms", lambda r: f"{r['prometheus_sd_ms']:.0f}"),
    ("operator page ms", lambda r: f"{r['page_ms']:.0f}"),
    ("probe round s, longest (probed)", lambda r: f"{r['probe_round_s']:.2f} ({r['probed_per_round']})"),
    ("behind / unknown probes / deferred", lambda r: f"{'yes' if r['behind'] else 'no'} / {r['unknown_probes_max']} / {r.get('deferred_max', 0)}"),
    ("false alarms (not passing)", lambda r: str(r["false_alarms_max"])),
    ("killed instance critical after s", lambda r: f"{r['dead_marked_s']:.1f}"),
    ("registry CPU (cores)", lambda r: f"{r['registry_cpu']:.2f}"),
    ("registry RSS MB", lambda r: f"{r['registry_rss_mb']:.0f}"),
    ("database MB", lambda r: f"{r['db_mb']:.1f}"),
    ("/health?stats=1 answer bytes (stats?)", lambda r: f"{r['health_answer_bytes']:,.0f} ({'yes' if r['stats'] else 'no'})"),
    ("gathered per round KB", lambda r: f"{r['gathered_bytes_per_round'] / 1000:,.0f}"),
    ("registry CPU ms per 5 s interval", lambda r: f"{r['registry_cpu_ms_per_interval']:,.0f}"),
    ("instances with stats", lambda r: f"{r['instances_with_stats']:,}"),
    ("GET /v1/topology ms", lambda r: f"{r['topology_ms']:.0f}"),
]  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    head = "| | " + " | ".join(f"{r['instances']:,}" for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    lines += [
        "| " + name + " | " + " | ".join(cell(r) for r in results) + " |" for name, cell in ROWS
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.registry_scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes", default="100,1000,10000", help="instance counts (comma-separated)"
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds of heartbeats per size (default 30)",
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="answer /health?stats=1 with a node's stats, as mesh nodes do",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        help=f"where to write the figures (default {DEFAULT_JSON.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record the registry with py-spy over each steady state into DIR "
        "(registry-<n>.txt, collapsed stacks; py-spy is in the bench extra)",
    )
    args = parser.parse_args(argv)  # fmt: skip
    results = []
    for n in (int(s) for s in args.sizes.split(",")):
        print(f"{n} instances ...", file=sys.stderr, flush=True)
        results.append(
            asyncio.run(measure(n, steady_s=args.steady, stats=args.stats, profile=args.profile))
        )
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(table(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
