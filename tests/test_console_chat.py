"""The console's chat on the real loan desk (registry with a write token and a mesh token,
bureau, verifier, underwriter, officer), in real headless Chromium: a turn streams the
delegations' progress before the answer, the next turn keeps the context, a question asked
mid-chat is answered in the chat box; a chat without the operator's credential is refused and
nothing reaches the node; the bounds (message size, streams at once) are clear refusals."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from mesh._a2a.client import A2APeer
from registry.chat import MAX_MESSAGE_CHARS, MAX_STREAMS
from tests.support import clean_env, free_port, running, wait_for
from tests.test_browser import page  # noqa: F401 - page is the Chromium fixture
from tests.test_console import shot
from tests.test_console_tasks import MESH, WRITE, Desk, desk, run  # noqa: F401 - desk: fixture
from tests.test_delegation_e2e import QUESTION
from tests.test_loan_desk_underwriter import BIG

pytestmark = pytest.mark.integration


async def _officer_tasks(at: Desk) -> set[str]:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, at.urls["loan-officer"], headers={"Authorization": f"Bearer {MESH}"})
        try:
            listed = await peer.list_tasks(page_size=100, include_artifacts=False)
            return {t.task_id for t in listed.tasks}
        finally:
            await peer.aclose()


async def _context_tasks(at: Desk, context_id: str) -> list[str]:
    async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
        peer = A2APeer(http, at.urls["loan-officer"], headers={"Authorization": f"Bearer {MESH}"})
        try:
            listed = await peer.list_tasks(context_id=context_id, include_artifacts=False)
            return [t.task_id for t in listed.tasks]
        finally:
            await peer.aclose()


def _sign_in(page: Any, desk: Desk) -> None:  # noqa: F811
    page.goto(desk.registry + "/agents/loan-officer")
    page.click("#chat-link")
    page.wait_for_url("**/agents/loan-officer/chat")
    # Chatting is a write: the operator's, after signing in.
    assert page.locator("#say").count() == 0
    page.fill("#chat-sign-in input[name=token]", WRITE)
    page.click("#chat-sign-in button")
    page.wait_for_url("**/agents/loan-officer/chat")


def _say(page: Any, text: str, answers: int) -> None:  # noqa: F811
    page.fill("#say textarea", text)
    page.click("#say button")
    page.wait_for_function(
        f"document.querySelectorAll('#chat-log .msg.agent').length >= {answers}"
        " && !document.querySelector('#say button').disabled",
        timeout=60_000,
    )


def _log(page: Any) -> list[tuple[str, str]]:  # noqa: F811
    return [
        (str(m.get_attribute("class")), m.inner_text())
        for m in page.locator("#chat-log .msg").all()
    ]


@pytest.mark.browser
def test_a_chat_turn_streams_progress_then_answers_and_keeps_its_context(
    desk: Desk,  # noqa: F811
    page: Any,  # noqa: F811
) -> None:
    _sign_in(page, desk)
    _say(page, QUESTION, answers=1)
    log = _log(page)
    kinds = [kind for kind, _ in log]
    answer = kinds.index("msg agent")
    progress = [text for kind, text in log[:answer] if kind == "msg progress"]
    # The officer's calls and its specialists' own progress, relayed up, before the answer.
    assert any("calling credit_bureau_score" in line for line in progress), log
    for specialist in ("credit-bureau", "income-verifier"):  # a hop down: indented, named
        assert any(line.startswith(f"    … {specialist}: ") for line in progress), log
    assert "Recommendation for" in log[answer][1], log
    assert "APP-612" in log[answer][1], log
    assert "48 months" in log[answer][1], log
    context = page.locator("#chat-context").get_attribute("data-context")
    assert context
    shot(page, "chat.png")

    # A follow-up that names no applicant: only the context says which one.
    _say(page, "and over 36 months?", answers=2)
    second = [text for kind, text in _log(page) if kind == "msg agent"][1]
    assert "APP-612" in second, second
    assert "36 months" in second, second
    assert page.locator("#chat-context").get_attribute("data-context") == context
    assert len(run(_context_tasks(desk, context))) == 2


@pytest.mark.browser
def test_a_question_mid_chat_is_answered_in_the_chat_box(desk: Desk, page: Any) -> None:  # noqa: F811
    _sign_in(page, desk)
    page.fill("#say textarea", BIG)
    page.click("#say button")
    page.wait_for_selector("#chat-log .msg.question", timeout=60_000)
    page.wait_for_function("!document.querySelector('#say button').disabled")
    questions = page.locator("#chat-log .msg.question").all_inner_texts()
    assert any(
        "underwriter (via loan-officer) asks: Approve APP-738 for 600,000" in q for q in questions
    ), questions
    # Not the JSON the question asks for: said why, not sent; the question still waits.
    page.fill("#say textarea", "yes please")
    page.click("#say button")
    page.wait_for_selector("#chat-log .msg.problem", timeout=30_000)
    page.wait_for_function("!document.querySelector('#say button').disabled")
    _say(page, '{"decision": "approve", "note": "collateral checked"}', answers=1)
    answer = page.locator("#chat-log .msg.agent").last.inner_text()
    assert "Underwriter: APPROVE (collateral checked)" in answer, _log(page)


def test_chat_without_the_operators_credential_is_refused_and_sends_nothing(desk: Desk) -> None:  # noqa: F811
    before = run(_officer_tasks(desk))
    form = {"agent": "loan-officer", "text": QUESTION}
    with httpx.Client(base_url=desk.registry, timeout=30) as http:
        r = http.post("/console/chat", data={**form, "csrf": "guess"})
        assert r.status_code == 403
        assert "sign in" in r.json()["message"]
        # The JSON API's bearer token is not a console session.
        r = http.post("/console/chat", data={**form, "csrf": "guess"}, headers=_bearer())
        assert r.status_code == 403
        assert http.post("/console/login", data={"token": WRITE}).status_code == 303
        r = http.post("/console/chat", data={**form, "csrf": "guess"})
        assert r.status_code == 403
        assert "CSRF" in r.json()["message"]
        csrf = _csrf(http.get("/agents/loan-officer/chat").text)
        r = http.post(
            "/console/chat", data={**form, "csrf": csrf}, headers={"Origin": "http://127.0.0.1:1"}
        )
        assert r.status_code == 403
        assert "another site" in r.json()["message"]
        # A turn posted by this session streams for it alone, and once.
        r = http.post("/console/chat", data={**form, "csrf": csrf})
        assert r.status_code == 200, r.text
        stream = r.json()["stream"]
        with httpx.Client(base_url=desk.registry, timeout=30) as stranger:
            assert stranger.get(stream).status_code == 404
            assert http.post("/console/logout", data={"csrf": csrf}).status_code == 303
            # Signed out: the turn posted before is not streamed (so never sent) either.
            assert http.get(stream).status_code == 404
        assert http.get("/console/chat/made-up").status_code == 404
    assert run(_officer_tasks(desk)) == before


def test_a_chat_is_bounded(desk: Desk) -> None:  # noqa: F811
    with httpx.Client(base_url=desk.registry, timeout=30) as http:
        assert http.post("/console/login", data={"token": WRITE}).status_code == 303
        csrf = _csrf(http.get("/agents/loan-officer/chat").text)
        form = {"agent": "loan-officer", "csrf": csrf}
        r = http.post("/console/chat", data={**form, "text": "x" * (MAX_MESSAGE_CHARS + 1)})
        assert r.status_code == 413
        assert f"at most {MAX_MESSAGE_CHARS}" in r.json()["message"]
        r = http.post("/console/chat", data={**form, "text": "  "})
        assert r.status_code == 422
        r = http.post("/console/chat", data={**form, "agent": "nobody", "text": "hi"})
        assert r.status_code == 404
        assert "no agent named 'nobody'" in r.json()["message"]
        # One turn streamed: its events in full, the end last.
        r = http.post("/console/chat", data={**form, "text": QUESTION})
        r = http.get(r.json()["stream"])
        assert r.headers["content-type"].startswith("text/event-stream")
        events = re.findall(r"^event: (\w+)$", r.text, re.M)
        assert events[-1] == "end", r.text
        assert "answer" in events, r.text
        # The officer's model text came as the answer's artifact chunks, forwarded as written.
        assert events.index("text") < events.index("answer"), r.text
        assert events.index("progress") < events.index("text"), r.text
        http.post("/console/logout", data={"csrf": csrf})


def test_chat_streams_at_once_are_capped(desk: Desk, tmp_path: Path) -> None:  # noqa: F811
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(MESH_REGISTRY=desk.registry, MESH_REGISTRY_TOKEN=WRITE, MESH_TOKEN=MESH)
    argv = [
        "mesh", "serve", "tests.node_agents:agent", "--port", str(port),
        "--data-dir", str(tmp_path / "worker"), "--registry", desk.registry, "--grace", "1",
    ]  # fmt: skip
    with running(argv, name="worker", tmp=tmp_path, env=env, health=f"{url}/health"):
        wait_for(
            lambda: httpx.get(f"{desk.registry}/v1/agents/test-worker", timeout=5).is_success,
            what="test-worker registered",
        )
        run(_fill_the_streams(desk))


async def _fill_the_streams(at: Desk) -> None:
    async with httpx.AsyncClient(base_url=at.registry, timeout=30) as http:
        assert (await http.post("/console/login", data={"token": WRITE})).status_code == 303
        csrf = _csrf((await http.get("/agents/test-worker/chat")).text)
        # The slow skill's input as JSON text: each turn holds its stream this long.
        form = {"agent": "test-worker", "csrf": csrf, "text": '{"seconds": 20}'}

        async def post() -> httpx.Response:
            return await http.post("/console/chat", data=form)

        turns = [(await post()).json()["stream"] for _ in range(MAX_STREAMS + 1)]
        async with contextlib.AsyncExitStack() as streams:
            for turn in turns[:MAX_STREAMS]:
                opened = await streams.enter_async_context(http.stream("GET", turn))
                assert opened.status_code == 200
            # Full: a new turn is refused when posted (each stream counts once it runs).
            refused = None
            for _ in range(50):
                r = await post()
                if r.status_code == 429:
                    refused = r
                    break
                await asyncio.sleep(0.1)
            assert refused is not None, "the cap never refused a turn"
            assert f"{MAX_STREAMS} chats are streaming" in refused.json()["message"]
            # ... and one posted before the streams filled up is told so, and sends nothing.
            late = await http.get(turns[-1])
            assert re.findall(r"^event: (\w+)$", late.text, re.M) == ["problem", "end"]
            assert "streaming already" in late.text
        # The page went away: its streams close and their slots are free again.
        for _ in range(50):
            r = await post()
            if r.status_code == 200:
                break
            await asyncio.sleep(0.1)
        assert r.status_code == 200, r.text


def _bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {WRITE}"}


def _csrf(html: str) -> str:
    return html.split('name="csrf" value="', 1)[1].split('"', 1)[0]
