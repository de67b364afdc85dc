"""The console's views of tasks on the real loan desk (registry, bureau, verifier, underwriter,
officer; a write token and a mesh token): one request's path, an agent's recent tasks, the
approval inbox answered from the page, in real headless Chromium; the writes refused without
the operator's credential or from another site; the mesh token never sent to an instance the
registry has no reason to trust."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from mesh._a2a.client import A2APeer
from mesh._a2a.results import TaskResult
from mesh._discovery.base import Status
from mesh._tracing import trace_id_of
from registry.reach import Reach
from registry.settings import RegistrySettings
from registry.store import InstanceRecord
from tests.registry_support import start_node
from tests.support import clean_env, free_port, running, wait_for, wait_until_ok
from tests.test_browser import page  # noqa: F401 - page is the Chromium fixture
from tests.test_console import shot
from tests.test_delegation_e2e import QUESTION
from tests.test_loan_desk_underwriter import BIG

pytestmark = pytest.mark.integration

WRITE = "console-write-token-0123456789abcdef"
MESH = "console-mesh-token-0123456789abcdef"
T = TypeVar("T")
OPERATOR = {"Authorization": f"Bearer {WRITE}"}


@dataclass
class Desk:
    registry: str
    urls: dict[str, str] = field(default_factory=dict)  # agent -> its node's URL


def _start(stack: contextlib.ExitStack, tmp: Path, env: dict[str, str], desk: Desk) -> None:
    for name, module in (
        ("credit-bureau", "agents.credit_bureau:agent"),
        ("income-verifier", "agents.income_verifier:agent"),
        ("underwriter", "agents.underwriter:agent"),
        ("loan-officer", "agents.loan_officer:agent"),
    ):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [
            "mesh", "serve", module, "--port", str(port), "--data-dir", str(tmp / name),
            "--registry", desk.registry, "--grace", "2",
        ]  # fmt: skip
        stack.enter_context(running(argv, name=name, tmp=tmp, env=env, health=f"{url}/health"))
        desk.urls[name] = url


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desk]:
    tmp = tmp_path_factory.mktemp("console-tasks")
    port = free_port()
    desk = Desk(f"http://127.0.0.1:{port}")
    env = clean_env(
        MESH_REGISTRY=desk.registry,
        MESH_REGISTRY_TOKEN=WRITE,
        MESH_TOKEN=MESH,
        LOAN_DESK_DEADLINE_S="15",
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            running(
                [
                    "mesh", "registry", "--port", str(port), "--data-dir", str(tmp / "reg"),
                    "--probe-interval", "0.5", "--probe-timeout", "0.4",
                ],
                name="registry", tmp=tmp, health=f"{desk.registry}/health", env=env,
            )
        )  # fmt: skip
        _start(stack, tmp, env, desk)
        wait_for(
            lambda: (
                len(httpx.get(f"{desk.registry}/v1/instances", timeout=5).json()["instances"]) == 4
            ),
            what="the four nodes registered",
            timeout=30,
        )
        yield desk


async def _send(url: str, text: str) -> TaskResult:
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        peer = A2APeer(http, url, headers={"Authorization": f"Bearer {MESH}"})
        try:
            return await peer.send(text, timeout=60)
        finally:
            await peer.aclose()


async def _get(url: str, task_id: str) -> TaskResult:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, url, headers={"Authorization": f"Bearer {MESH}"})
        try:
            return await peer.get_task(task_id)
        finally:
            await peer.aclose()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run to its end in a thread of its own: Playwright's sync API keeps an event loop
    running in the test's thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def trace_of(task: TaskResult) -> str:
    trace = trace_id_of(str(task.metadata.get("traceparent") or ""))
    assert trace, task.metadata
    return trace


# -- one request's path ---------------------------------------------------------------------
def test_the_path_of_a_loan_request_has_both_hops_with_durations(desk: Desk) -> None:
    task = run(_send(desk.urls["loan-officer"], QUESTION))
    assert task.state == "completed", task.text
    url = f"{desk.registry}/v1/paths/{trace_of(task)}"
    # The registry holds the mesh token: the tasks are its operator's to see.
    anonymous = httpx.get(url, timeout=30)
    assert anonymous.status_code == 401
    assert "registry write token" in anonymous.json()["message"]
    r = httpx.get(url, timeout=30, headers=OPERATOR)
    assert r.status_code == 200, r.text
    path = r.json()
    assert path["not_asked"] == []
    assert path["unreachable"] == {}
    hops = path["hops"]
    (top,) = [h for h in hops if h["depth"] == 0]
    assert (top["agent"], top["task_id"], top["state"]) == (
        "loan-officer",
        task.task_id,
        "completed",
    )
    below = {h["agent"]: h for h in hops if h["depth"] == 1}
    assert set(below) == {"credit-bureau", "income-verifier"}
    for hop in below.values():
        assert hop["caller"] == "loan-officer"
        assert hop["caller_task"] == task.task_id
        assert hop["state"] == "completed"
        assert 0 < hop["duration_s"] < top["duration_s"]
        assert (hop["attempt"], hop["attempts"]) == (1, 1)
        assert hop["url"] == desk.urls[hop["agent"]]
    assert below["credit-bureau"]["skill"] == "score"
    # Time order: children start after the top did.
    assert all(h["started_at"] >= top["started_at"] for h in below.values())
    # Tokens: the officer's (offline) model; rolled up over its subtree.
    assert top["tokens"]["input"] > 0
    assert top["tokens_rolled"]["input"] >= top["tokens"]["input"]
    assert path["tokens"]["input"] == sum(h["tokens"]["input"] for h in hops)
    # What the node shows only with the mesh token stays there: tool names, not arguments;
    # no inputs or answers.
    assert {c["name"] for c in top["tool_calls"]} >= {
        "credit_bureau_score",
        "income_verifier_verify",
    }
    assert all(set(c) == {"name", "ok", "at"} for c in top["tool_calls"])
    assert not [h for h in hops if {"input", "answer_text", "answer_data"} & set(h)]


def test_a_trace_id_that_is_not_one_is_a_clear_422(desk: Desk) -> None:
    r = httpx.get(f"{desk.registry}/v1/paths/not-a-trace", timeout=10, headers=OPERATOR)
    assert r.status_code == 422
    assert "32 lowercase hex digits" in r.json()["message"]


# -- who gets the mesh token ----------------------------------------------------------------
def _instance(heartbeat_at: float, status: Status = "passing") -> InstanceRecord:
    return InstanceRecord(
        "i-1", "bureau", "http://127.0.0.1:9", "1", status=status, last_heartbeat_at=heartbeat_at
    )


async def test_the_mesh_token_goes_only_to_registrations_made_with_the_write_token() -> None:
    started = 1000.0
    fresh, stale = _instance(started + 1), _instance(started - 1)

    async def verdict(settings: RegistrySettings, inst: InstanceRecord) -> str | None:
        reach = Reach(settings, started_at=started)
        try:
            return reach.refusal(inst)
        finally:
            await reach.aclose()

    trusted = RegistrySettings(token=WRITE, mesh_token=MESH)
    assert await verdict(trusted, fresh) is None
    # A row from before this process started (a run without the token) is not vouched for.
    assert "since the registry started" in str(await verdict(trusted, stale))
    # An open registry: anyone could have registered the URL.
    assert "writes are open" in str(await verdict(RegistrySettings(mesh_token=MESH), fresh))
    consul = RegistrySettings(token=WRITE, mesh_token=MESH, backend="consul://127.0.0.1:8500")
    assert "Consul" in str(await verdict(consul, fresh))
    assert "critical" in str(await verdict(trusted, _instance(started + 1, "critical")))
    # No mesh token: nothing secret is sent, every live instance may be asked.
    assert await verdict(RegistrySettings(), fresh) is None


def test_an_open_registry_asks_no_node_with_the_mesh_token(tmp_path: Path) -> None:
    port = free_port()
    reg = f"http://127.0.0.1:{port}"
    env = clean_env(MESH_TOKEN=MESH)  # the mesh token, but open writes
    argv = ["mesh", "registry", "--port", str(port), "--data-dir", str(tmp_path / "reg")]
    with running(argv, name="registry", tmp=tmp_path, env=env, health=f"{reg}/health"):
        # Anyone may register here: an echo node stands for whoever did.
        node = start_node(tmp_path, reg, name="stranger")
        with node.proc:
            wait_until_ok(f"{node.url}/health", proc=node.proc)
            wait_for(
                lambda: httpx.get(f"{reg}/v1/instances", timeout=5).json()["instances"],
                what="the stranger registered",
            )
            r = httpx.get(f"{reg}/v1/paths/{'ab' * 16}", timeout=10)
            assert r.status_code == 200, r.text
            path = r.json()
            assert path["asked"] == 0
            (refused,) = path["not_asked"]
            assert refused["agent"] == "stranger"
            assert "writes are open" in refused["why"]
            # Its console cannot write either: no operator credential to check.
            answer = httpx.post(f"{reg}/console/answer", data={"csrf": "x"}, timeout=10)
            assert answer.status_code == 403
            assert "read-only" in answer.text
        node.proc.kill()


# -- the inbox ------------------------------------------------------------------------------
def _big_application(desk: Desk) -> TaskResult:
    task = run(_send(desk.urls["loan-officer"], BIG))
    assert task.state == "input-required", task.text
    return task


def test_writes_without_the_operators_credential_are_refused(desk: Desk) -> None:
    task = _big_application(desk)
    (question,) = task.questions
    form = {
        "agent": "loan-officer",
        "task": task.task_id,
        "question": question.id,
        "f.decision": "approve",
    }
    with httpx.Client(base_url=desk.registry, timeout=30) as http:
        # No session at all.
        r = http.post("/console/answer", data={**form, "csrf": "guess"})
        assert r.status_code == 403
        assert "sign in" in r.text
        # The JSON API's bearer token is not a console session either.
        r = http.post(
            "/console/answer",
            data={**form, "csrf": "guess"},
            headers={"Authorization": f"Bearer {WRITE}"},
        )
        assert r.status_code == 403
        # A wrong token does not sign in.
        r = http.post("/console/login", data={"token": "wrong", "next": "/inbox"})
        assert r.status_code == 403
        assert "wrong token" in r.text
        # Another site's login form is refused, even with the right token.
        r = http.post(
            "/console/login", data={"token": WRITE}, headers={"Origin": "http://evil.example"}
        )
        assert r.status_code == 403
        assert "another site" in r.text
        r = http.post("/console/login", data={"token": WRITE, "next": "/inbox"})
        assert r.status_code == 303
        assert "samesite=strict" in r.headers["set-cookie"].lower()
        assert "httponly" in r.headers["set-cookie"].lower()
        # Signed in, but the form's CSRF token is not the session's.
        r = http.post("/console/answer", data={**form, "csrf": "guess"})
        assert r.status_code == 403
        assert "CSRF" in r.text
        # Signed in with the right CSRF token, posted from another site.
        page_html = http.get("/inbox").text
        csrf = page_html.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        r = http.post(
            "/console/answer",
            data={**form, "csrf": csrf},
            headers={"Origin": "http://127.0.0.1:1"},
        )
        assert r.status_code == 403
        assert "another site" in r.text
        # Signing out ends the session: the inbox asks for the token again.
        r = http.post("/console/logout", data={"csrf": csrf})
        assert r.status_code == 303
        assert http.get("/inbox").status_code == 401
    # Nothing was sent: the task still waits with the same question.
    still = run(_get(desk.urls["loan-officer"], task.task_id))
    assert still.state == "input-required"
    assert [q.id for q in still.questions] == [question.id]


@pytest.mark.browser
def test_the_inbox_answers_a_waiting_approval_in_chromium(desk: Desk, page: Any) -> None:  # noqa: F811
    task = _big_application(desk)
    page.goto(desk.registry + "/inbox")
    # Not signed in: the registry holds the mesh token, so no task is shown before.
    assert page.locator("#login").count() == 1
    assert page.locator(".waiting").count() == 0
    page.fill("#login input[name=token]", WRITE)
    page.click("#login button")
    page.wait_for_url("**/inbox")
    card = page.locator(f".waiting[data-task='{task.task_id}']")
    assert card.count() == 1
    assert "underwriter asks" in card.locator("h3").inner_text()
    assert "Approve APP-738 for 600,000" in card.locator(".question").inner_text()
    assert card.locator("select[name='f.decision'] option").all_inner_texts() == [
        "approve",
        "decline",
    ]
    card.locator("select[name='f.decision']").select_option("approve")
    card.locator("input[name='f.note']").fill("collateral checked")
    shot(page, "inbox.png")
    card.locator("form.answer button").click()
    page.wait_for_selector("#done", timeout=60_000)
    assert f"task {task.task_id} at loan-officer: completed" in page.locator("#done").inner_text()
    done = run(_get(desk.urls["loan-officer"], task.task_id))
    assert done.state == "completed"
    assert "Underwriter: APPROVE (collateral checked)" in done.text
    assert page.locator(f".waiting[data-task='{task.task_id}']").count() == 0


# -- recent tasks and the path view in the browser --------------------------------------------
@pytest.mark.browser
def test_recent_tasks_link_to_the_path_view_in_chromium(desk: Desk, page: Any) -> None:  # noqa: F811
    task = run(_send(desk.urls["loan-officer"], QUESTION))
    assert task.state == "completed"
    page.goto(desk.registry + "/agents/loan-officer")
    assert page.locator("#recent").count() == 0  # the operator's only
    page.fill("#recent-sign-in input[name=token]", WRITE)
    page.click("#recent-sign-in button")
    page.wait_for_url("**/agents/loan-officer")
    row = page.locator(f"#recent tr[data-task='{task.task_id}']")
    assert row.count() == 1
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "completed"
    assert cells[2] == "chat"  # the officer's one skill
    assert cells[5] != "—"  # a duration
    shot(page, "recent.png")
    row.locator("a.path").click()
    page.wait_for_url("**/paths?trace=*")
    top = page.locator(f"#path tr[data-task='{task.task_id}']")
    assert top.get_attribute("data-depth") == "0"
    for agent in ("credit-bureau", "income-verifier"):
        hop = page.locator(f"#path tr[data-agent='{agent}'][data-caller='loan-officer']")
        assert hop.count() == 1
        assert hop.get_attribute("data-depth") == "1"
        assert float(hop.locator("td[data-duration]").get_attribute("data-duration") or 0) > 0
    shot(page, "path.png")
    # The same path from the task id alone.
    page.goto(f"{desk.registry}/paths?task={task.task_id}")
    assert page.locator("#path tr").count() == 1 + 3


# -- bounded ---------------------------------------------------------------------------------
def _row(task_id: str, agent: str, *, caller_task: str = "", skill: str = "s", **kw: Any) -> Any:
    from mesh._a2a.traces import TraceTaskRow

    return TraceTaskRow(
        agent=agent,
        task_id=task_id,
        context_id="c",
        skill=skill,
        state=kw.pop("state", "completed"),
        caller="top" if caller_task else "",
        caller_task=caller_task,
        **kw,
    )


def test_a_retried_call_is_attempts_of_one_hop_and_tokens_roll_up() -> None:
    from mesh._a2a.traces import TraceAnswer
    from registry.paths import assemble

    rows = [
        _row("T", "top", started_at=1.0, ended_at=9.0, usage={"inputTokens": 100}),
        # The first attempt failed at one instance, the retry went to another.
        _row(
            "A1", "child", caller_task="T", started_at=2.0, ended_at=3.0,
            state="failed", error={"message": "boom"}, usage={"input_tokens": 5},
        ),
        _row("A2", "child", caller_task="T", started_at=4.0, ended_at=5.0, usage={"inputTokens": 7}),
        _row("G", "grandchild", caller_task="A2", started_at=4.2, ended_at=4.8,
             usage={"outputTokens": 3}),
    ]  # fmt: skip
    one = InstanceRecord("i-a", "top", "http://a", "1")
    two = InstanceRecord("i-b", "child", "http://b", "1")
    answers = [
        (one, TraceAnswer(trace_id="t", agent="top", tasks=rows[:1])),
        (two, TraceAnswer(trace_id="t", agent="child", tasks=rows[1:])),
        # A replica sharing the store lists the same rows: each once, named after the first.
        (two, TraceAnswer(trace_id="t", agent="child", tasks=rows[1:])),
    ]
    path = assemble("t", answers)
    shown = [(h.depth, h.task.task_id, h.attempt, h.attempts) for h in path.hops]
    assert shown == [(0, "T", 1, 1), (1, "A1", 1, 2), (1, "A2", 2, 2), (2, "G", 1, 1)]
    top, first, retry, grandchild = path.hops
    assert first.error == "boom"
    assert first.duration_s == 1.0
    assert (retry.rolled.input, retry.rolled.output) == (7, 3)
    assert (top.rolled.input, top.rolled.output) == (112, 3)
    assert (path.tokens.input, path.tokens.output) == (112, 3)
    assert grandchild.url == "http://b"


class _Server:
    """A real uvicorn server on loopback, in a thread, serving ``app``."""

    def __init__(self, app: Any, port: int) -> None:
        import threading

        import uvicorn

        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        wait_until_ok(f"{self.url}/health")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def _misbehaving(name: str, port: int, traces: str) -> Any:
    """A registrable node whose trace route trickles forever or sends too much."""
    from a2a.server.routes import create_agent_card_routes
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from tests.echo_node import build_card

    card = build_card(name, f"http://127.0.0.1:{port}", description="Misbehaves.", skill_id="echo")

    async def forever() -> Any:
        while True:
            yield b" "
            await asyncio.sleep(0.1)

    async def huge() -> Any:
        for _ in range(64):  # 4 MiB
            yield b"x" * 65536

    async def tasks(request: Any) -> Any:
        return StreamingResponse(forever() if traces == "trickle" else huge())

    async def health(request: Any) -> Any:
        return JSONResponse({"status": "ok"})

    async def hang(request: Any) -> Any:  # every A2A call: no answer, ever
        await asyncio.Event().wait()

    return Starlette(
        routes=[
            *create_agent_card_routes(card),
            Route("/health", health),
            Route("/v1/traces/{trace_id}/tasks", tasks),
            Route("/", hang, methods=["POST"]),
        ]
    )


def test_nodes_that_trickle_or_flood_do_not_hold_the_path_up(tmp_path: Path) -> None:
    import time

    from registry.paths import DEADLINE_S, MAX_NODE_BYTES

    port = free_port()
    reg = f"http://127.0.0.1:{port}"
    argv = ["mesh", "registry", "--port", str(port), "--data-dir", str(tmp_path / "reg")]
    slow_port, huge_port = free_port(), free_port()
    with (
        running(argv, name="registry", tmp=tmp_path, env=clean_env(), health=f"{reg}/health"),
        _Server(_misbehaving("slow", slow_port, "trickle"), slow_port) as slow,
        _Server(_misbehaving("huge", huge_port, "huge"), huge_port) as flood,
    ):
        for name, server in (("slow", slow), ("huge", flood)):
            r = httpx.post(
                f"{reg}/v1/instances",
                json={"instance_id": f"{name}-1", "url": server.url, "agent": name},
                timeout=10,
            )
            assert r.status_code == 201, r.text
        began = time.monotonic()
        r = httpx.get(f"{reg}/v1/paths/{'cd' * 16}", timeout=30)
        took = time.monotonic() - began
    assert r.status_code == 200, r.text
    path = r.json()
    assert path["asked"] == 2
    assert path["hops"] == []
    assert path["unreachable"] == {
        slow.url: f"no whole answer within {DEADLINE_S:g} s",
        flood.url: f"answer over {MAX_NODE_BYTES} bytes",
    }
    assert took < DEADLINE_S + 3


async def test_a_listing_of_hanging_nodes_ends_at_its_deadline() -> None:
    """The inbox's and recent tasks' listing: one deadline for all the nodes together, past
    which the ones not done are named and the rest shown (a view of many slow nodes would
    otherwise take nodes / PARALLEL per-node deadlines)."""
    import time

    from mesh._cli.tasks import list_tasks_at

    ports = [free_port() for _ in range(3)]
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(_Server(_misbehaving(f"hang-{p}", p, "trickle"), p)) for p in ports
        ]
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            began = time.monotonic()
            listing = await list_tasks_at(
                http,
                [("hang", s.url) for s in servers],
                states=("input-required",),
                timeout_s=30,
                parallel=1,  # one at a time: without the deadline, 3 x 30 s
                deadline_s=1.0,
            )
            took = time.monotonic() - began
    assert took < 5
    assert listing.tasks == []
    assert sorted(u.url for u in listing.unreachable) == sorted(s.url for s in servers)
    assert {u.error for u in listing.unreachable} == {"not done within the listing's 1 s"}
