"""docs/benchmarks.md is bench.benchmarks_doc's output, never hand-kept; bench/results/INDEX.md links every
result file, so the index stays complete as results are added."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bench.benchmarks_doc

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PLOTS = ("speedup-vs-budget.png", "speedup-vs-concurrency.png")


@pytest.fixture(scope="module")
def benchmarks_doc():
    return bench.benchmarks_doc


def test_the_committed_page_is_the_scripts_output(benchmarks_doc, tmp_path):
    page = benchmarks_doc.main(tmp_path)
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page.read_text() == committed, "docs/benchmarks.md is stale: run python -m bench.benchmarks_doc"
    for name in PLOTS:
        # Pixels depend on the installed fonts, so only their presence is checked (the page links to them).
        assert (tmp_path / "img" / name).stat().st_size > 0
        assert (ROOT / "docs" / "img" / name).stat().st_size > 0


def test_the_index_links_every_result_file():
    index = RESULTS / "INDEX.md"
    links = set(re.findall(r"\]\(([^)\s]+)\)", index.read_text()))
    files = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and p != index}
    assert sorted(files - links) == [], "add an entry for each to bench/results/INDEX.md"
    assert sorted(link for link in links if not (RESULTS / link).exists()) == []
