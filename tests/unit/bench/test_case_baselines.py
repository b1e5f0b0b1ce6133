"""Ratios against the baseline of the same workload size, and the result table's header."""

from __future__ import annotations

import pytest

from rltrain.bench import harness
from rltrain.bench.harness import Case, Measure, Suite
from rltrain.errors import ConfigError


class StepClock:
    """A fake clock: each case call advances it by that case's duration."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def taking(self, seconds: float):
        def call() -> None:
            self.t += seconds

        return call


def two_sizes(clock: StepClock) -> Suite:
    # size 1: baseline 1 s, ours 2 s; size 4: baseline 8 s, ours 4 s
    return Suite(
        cases=(
            Case("base n=1", clock.taking(1.0), size=1),
            Case("ours n=1", clock.taking(2.0), size=1),
            Case("base n=4", clock.taking(8.0), size=4),
            Case("ours n=4", clock.taking(4.0), size=4, baseline="base n=4"),
        ),
        baseline="base n=1",
        warmup=0,
        repeats=1,
    )


def test_a_case_of_another_size_is_compared_with_its_own_baseline():
    clock = StepClock()
    r = harness.run_measure(Measure("toy", "", lambda quick: two_sizes(clock)), clock=clock)
    ratios = {c.name: (c.ratio, c.per_size_ratio) for c in r.cases}
    assert ratios["ours n=1"] == (2.0, 2.0)
    assert ratios["base n=4"] == (1.0, 1.0)  # named as a baseline: its size's, its own
    assert ratios["ours n=4"] == (0.5, 0.5)  # 4 s against base n=4's 8 s, not base n=1's 1 s
    md = harness.markdown([r])
    assert "| base n=1 (baseline) |" in md and "| base n=4 (baseline) |" in md
    assert "| ours n=4 |" in md


def test_a_case_baseline_naming_no_case_is_refused():
    suite = Suite(cases=(Case("a", lambda: None, baseline="b"),), baseline="a")
    with pytest.raises(ConfigError, match="baseline 'b' is not a case of"):
        harness.run_measure(Measure("toy", "", lambda quick: suite))


def test_a_result_read_back_keeps_each_cases_baseline():
    clock = StepClock()
    r = harness.run_measure(Measure("toy", "", lambda quick: two_sizes(clock)), clock=clock)
    back = harness.result_from_dict(r.to_dict())
    assert back == r and back.cases[3].baseline == "base n=4"


def block(header: str, earlier: bool = False) -> str:
    mark = f"{harness.EARLIER_FORMAT}\n" if earlier else ""
    columns = header.count("|") - 1
    row = "| a (baseline) |" + " 1 |" * (columns - 1)
    return f"### `toy` (2026-11-28, 2 CPUs)\n\n{mark}{header}\n|{'---|' * columns}\n{row}\n"


def test_a_block_under_the_header_the_harness_prints_is_generated():
    case = harness.CaseResult("a", (1.0,), 1.0, 1.0, 1.0, 0.0, 1.0)
    rendered = harness.markdown([harness.MeasureResult("toy", "", "a", False, (case,))])
    assert harness.table_header() in rendered.split("\n")
    assert harness.is_generated("toy", block(harness.table_header()))


def test_a_block_under_a_stale_header_is_refused_unless_marked_earlier():
    assert harness.EARLIER_HEADER == (
        "| case | median s | min s | max s | IQR s | ratio vs baseline | per-size ratio "
        "| throughput |"
    )
    assert not harness.is_generated("toy", block(harness.EARLIER_HEADER))
    assert harness.is_generated("toy", block(harness.EARLIER_HEADER, earlier=True))
    # the mark does not excuse today's header, nor any other
    assert not harness.is_generated("toy", block(harness.table_header(), earlier=True))
    other = harness.table_header().replace("| throughput |", "| tokens/s |")
    assert not harness.is_generated("toy", block(other))


def test_an_unmarked_earlier_table_outside_the_blocks_is_found_by_its_section():
    marked = f"## B\n\n{harness.EARLIER_FORMAT}\n\n{harness.EARLIER_HEADER}\n|---|\n"
    unmarked = f"## C\n\ntext\n\n{harness.EARLIER_HEADER}\n|---|\n"
    current = f"## D\n\n{harness.table_header()}\n|---|\n"
    text = f"# A\n\n{marked}\n{unmarked}\n{current}"
    assert harness.unmarked_earlier_tables(text) == ["## C"]
