"""Every code block in the README and docs/ that is meant to run, runs as written.

``tests/snippets.py`` says what runs and how (Python blocks as scripts, shell commands with
servers in the background, ``# file:`` blocks saved into the document's workspace, ports
replaced by free ones). Blocks marked ``<!-- not-run: REASON -->`` are skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.snippets import Block, DocRun, blocks_of
from tests.support import ROOT

pytestmark = pytest.mark.integration

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [block for doc in DOCS for block in blocks_of(doc)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DocRun]]:
    started: dict[str, DocRun] = {}
    yield started
    for run in started.values():
        run.stop()


def _run_of(runs: dict[str, DocRun], block: Block, tmp: Path) -> DocRun:
    if block.doc not in runs:
        runs[block.doc] = DocRun(block.doc, [b for b in BLOCKS if b.doc == block.doc], tmp)
    return runs[block.doc]


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b, id=b.id, marks=[pytest.mark.skip(reason=f"{b.id}: {b.skip}")] if b.skip else []
        )
        for b in BLOCKS
    ],
)
def test_block_runs_as_written(
    block: Block, runs: dict[str, DocRun], tmp_path_factory: pytest.TempPathFactory
) -> None:
    run = _run_of(runs, block, tmp_path_factory.mktemp(Path(block.doc).stem))
    run.run_through(block)


def test_the_docs_have_runnable_blocks() -> None:
    # The extraction itself: a fence the parser misses would silently test nothing.
    ids = {b.id for b in BLOCKS}
    assert any(i.startswith("README.md:") for i in ids)
    assert any(i.startswith("docs/guide.md:") for i in ids)
    assert all(b.skip is None or b.skip.strip() for b in BLOCKS)
