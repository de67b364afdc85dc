"""The operator page in a real headless Chromium: list, search, agent page with schemas."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.registry_support import instances, registry, start_node
from tests.support import ROOT, wait_for

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
