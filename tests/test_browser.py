"""The operator page in a real headless Chromium: list, search, agent page with schemas."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.registry_support import instances, registry, start_node
from tests.support import ROOT, Proc, free_port, wait_for, wait_until_ok

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# Read at import: tests/conftest.py takes every MESH_* variable away before a test runs.
CHROMIUM_OVERRIDE = os.environ.get("MESH_CHROMIUM")
ARTIFACTS = ROOT / "tests" / "artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def find_chromium(override: str | None = CHROMIUM_OVERRIDE, path: str | None = None) -> str:
    """The Chromium to drive: ``MESH_CHROMIUM`` if set, else ``chromium`` or
    ``chromium-browser`` on ``path`` (default ``PATH``); skips the test, saying what to do, if
    there is none."""
    if override:
        found = shutil.which(override, path=path)
        if found is None:
            pytest.skip(f"MESH_CHROMIUM={override!r} is not an executable: set it to Chromium's")
        return found
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name, path=path)
        if found is not None:
            return found
    pytest.skip(
        "needs Chromium: install it (apt-get install chromium; .ci/system-deps installs every "
        "program the tests drive) or set MESH_CHROMIUM=/path/to/chromium"
    )


@pytest.fixture
def page() -> Iterator[Any]:
    chromium = find_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1366, "height": 900})
            yield context.new_page()
            context.close()
        finally:
            browser.close()


def test_operator_page_lists_searches_and_shows_schemas(page: Any, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with registry(tmp_path) as reg:
        bureau = start_node(tmp_path, reg.url, name="credit-bureau", extra=[
            "--skill", "score", "--description", "Scores loan applicants."])  # fmt: skip
        verifier = start_node(tmp_path, reg.url, name="income-verifier", extra=[
            "--skill", "verify", "--description", "Verifies declared income."])  # fmt: skip
        with bureau.proc, verifier.proc:
            wait_for(lambda: len(instances(reg.url)) == 2, what="both nodes passing")

            page.goto(reg.url + "/")
            rows = page.locator("#agents tbody tr")
            assert rows.count() == 2
            assert (
                page.locator("tr[data-agent='credit-bureau']").inner_text().split("\t")[-1].strip()
                == "1/1 up"
            )
            assert "Verifies declared income." in page.content()
            page.screenshot(path=str(ARTIFACTS / "registry-index.png"), full_page=True)

            # Search by skill text: the form submits ?q= and the server filters.
            page.fill("input[name=q]", "score")
            page.press("input[name=q]", "Enter")
            page.wait_for_url("**/?q=score")
            assert page.locator("#agents tbody tr").count() == 1
            assert page.locator("tr[data-agent='credit-bureau']").count() == 1

            page.fill("input[name=q]", "no-such-thing")
            page.press("input[name=q]", "Enter")
            page.wait_for_selector("text=No agent matches.")

            # The agent page: instances and the typed skill's fields.
            page.goto(reg.url + "/")
            page.click("a[href='/agents/credit-bureau']")
            page.wait_for_url("**/agents/credit-bureau")
            instance = page.locator(f"tr[data-instance] a[href='{bureau.url}']")
            assert instance.count() == 1
            row = page.locator("#instances tbody tr").first.inner_text()
            assert "passing" in row
            links = page.locator("#instances a").evaluate_all("els => els.map(e => e.href)")
            assert f"{bureau.url}/introspect" in links
            assert f"{bureau.url}/metrics" in links
            fields = page.locator("#skill-score table.fields").first
            cells = fields.locator("tbody tr").first.locator("td").all_inner_texts()
            assert cells == ["text", "string", "yes", "What to echo back."]
            assert "integer, >= 1" in fields.inner_text()
            page.screenshot(path=str(ARTIFACTS / "registry-agent.png"), full_page=True)

            # The page keeps itself current: the instance dies, the open page shows it.
            bureau.proc.kill()
            page.wait_for_selector("#instances .badge.critical", timeout=15_000)
            page.screenshot(path=str(ARTIFACTS / "registry-agent-critical.png"), full_page=True)


# Closes an attribute (either quote) and any element, then runs script two ways.
HOSTILE = """"'></pre></code><img src=x onerror="window.__xss=1"><script>window.__xss=2</script>"""


def hostile_card() -> dict[str, Any]:
    """An A2A card whose every free-text field is ``HOSTILE``: what an attacker who can run
    an agent publishes, for every operator who opens the registry's page."""
    field = "f" + HOSTILE
    schema = {
        "type": "object",
        "properties": {field: {"type": "string", "description": HOSTILE, "pattern": HOSTILE}},
        "required": [field],
    }
    return {
        "name": "evil",
        "description": "Evil " + HOSTILE,
        "version": "1" + HOSTILE,
        "supportedInterfaces": [
            {
                "url": "http://127.0.0.1:1/" + HOSTILE,
                "protocolBinding": "JSONRPC" + HOSTILE,
                "protocolVersion": "1.0" + HOSTILE,
            }
        ],
        "capabilities": {
            "extensions": [
                {
                    "uri": "urn:mesh:skill-schemas:v1",
                    "params": {
                        "tags": ["tag" + HOSTILE],
                        "skills": {"s" + HOSTILE: {"input": schema, "output": schema}},
                    },
                }
            ]
        },
        "defaultInputModes": ["text/plain" + HOSTILE],
        "defaultOutputModes": ["application/json" + HOSTILE],
        "skills": [
            {
                "id": "s" + HOSTILE,
                "name": "Name " + HOSTILE,
                "description": HOSTILE,
                "tags": ["t" + HOSTILE],
            }
        ],
    }


def static_card_server(tmp: Path, card: dict[str, Any]) -> tuple[Proc, str]:
    """A plain HTTP server (``python -m http.server``) serving ``card`` and a /health."""
    root = tmp / "static"
    (root / ".well-known").mkdir(parents=True)
    (root / ".well-known" / "agent-card.json").write_text(json.dumps(card))
    (root / "health").write_text("ok")
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
            "--directory", str(root)]  # fmt: skip
    proc = Proc.start(argv, name=f"static-{port}", tmp=tmp)
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", proc=proc)
    return proc, url


def test_a_hostile_card_is_shown_as_text_and_runs_nothing(page: Any, tmp_path: Path) -> None:
    with registry(tmp_path) as reg:
        proc, url = static_card_server(tmp_path, hostile_card())
        with proc:
            body = {"instance_id": "evil-1", "agent": "evil", "url": url, "version": HOSTILE}
            r = httpx.post(f"{reg.url}/v1/instances", json=body, timeout=10)
            assert r.status_code == 201, r.text
            pages = [
                "/",
                "/?" + "&".join(f"{k}={quote(HOSTILE)}" for k in ("q", "skill", "tag")),
                "/?q=" + quote("Evil"),
                "/agents/evil",
                # A path segment holds no "/": the same markup without its closing tags.
                "/agents/" + quote('"><img src=x onerror="window.__xss=3">', safe=""),
            ]
            for path in pages:
                html = httpx.get(reg.url + path, timeout=10).text
                # The markup arrives as text: no tag of it survives, its text does.
                assert "<img" not in html, path
                assert "<script>window" not in html, path
                assert "</pre></code>" not in html, path
                assert "&lt;img src=x onerror=" in html, path
                page.goto(reg.url + path)
                assert page.evaluate("() => window.__xss") is None, path
            # The agent page shows each field as the text the card has.
            page.goto(reg.url + "/agents/evil")
            skill = page.locator("div.card.skill")
            assert skill.locator("h3").inner_text().startswith("Name " + HOSTILE)
            assert skill.locator("p").first.inner_text() == HOSTILE
            fields = skill.locator("table.fields tbody tr").first.locator("td")
            assert fields.first.inner_text() == "f" + HOSTILE
            assert page.locator("#instances tbody tr td").nth(1).inner_text() == HOSTILE
            card = json.loads(page.locator("details pre").text_content() or "")
            assert card["description"] == "Evil " + HOSTILE
