"""docs/benchmarks.md: its generated blocks are what the bench writes, its figures are dated and
placed, and its deterministic figures are what the code gives."""

from __future__ import annotations

import pathlib
import re

import pytest

from rltrain.bench.harness import doc_blocks, is_generated

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "benchmarks.md"
MACHINE = re.compile(r"CPU VM|CPUs|GPU|H100|H200")


def test_every_marker_block_is_what_the_bench_writes():
    """``--update-docs`` replaces a block whole: hand-written text belongs outside the markers."""
    text = DOC.read_text()
    blocks = doc_blocks(text)
    assert len(blocks) == text.count("<!-- bench:") == text.count("<!-- /bench:")
    foreign = [name for name, block in blocks.items() if not is_generated(name, block)]
    assert foreign == []


def test_every_dated_heading_names_its_machine():
    dated = [
        line for line in DOC.read_text().splitlines() if re.match(r"#+ .*\d{4}-\d\d-\d\d", line)
    ]
    assert dated
    assert [h for h in dated if not MACHINE.search(h)] == []


@pytest.mark.slow  # the simulator fits three published setups: ~4 CPU-s
def test_whatif_published_figures_are_what_the_simulator_gives():
    from rltrain.bench.measures.whatif import papers
    from rltrain.whatif.papers import FIGURES

    rows = {
        cells[0]: cells
        for line in DOC.read_text().splitlines()
        if line.startswith("| ")
        and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 4
    }
    got = papers()
    for f in FIGURES:
        error = got[f"paper/{f.name}/error_pct"]
        assert rows[f.name][3].strip("*") == f"{error:+.1f} %", f.name
    within = sum(abs(got[f"paper/{f.name}/error_pct"]) <= 20 for f in FIGURES)
    assert f"{within} of {len(FIGURES)} (below)" in DOC.read_text()


def test_every_result_table_has_todays_header_or_is_marked_as_the_earlier_format():
    """A table of the earlier format (before ``samples``) is kept only where marked as such."""
    from rltrain.bench.harness import unmarked_earlier_tables

    assert unmarked_earlier_tables(DOC.read_text()) == []
