"""Every registered benchmark measure runs in --quick mode, and the harness's arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rltrain.bench import harness
from rltrain.bench.harness import Case, Measure, Suite


@pytest.mark.spread  # each measure in a process of its own: either test process may start it
@pytest.mark.parametrize("name", sorted(harness.discover()))
def test_measure_runs_quick(name, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rltrain.bench", name, "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    (result,) = data["measures"]
    assert result["name"] == name and result["quick"] is True
    assert all(c["median"] > 0 for c in result["cases"])
    assert f"`{name}`" in (tmp_path / "results.md").read_text()


def test_unknown_measure_is_refused(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "rltrain.bench", "no_such_measure", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "no_such_measure" in out.stderr


class FakeClock:
    """Each call to fn advances time by the next scripted duration."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations = durations

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.durations.pop(0)


def test_median_spread_ratio_and_scaling_by_hand():
    # warm-up calls are untimed; then 3 timed calls per case
    clock = FakeClock([0, 1.0, 3.0, 2.0, 0, 4.0, 8.0, 6.0])
    suite = Suite(
        cases=(Case("n=1", clock.step, size=1), Case("n=2", clock.step, size=2)),
        baseline="n=1",
        warmup=1,
        repeats=3,
    )
    r = harness.run_measure(Measure("toy", "a toy", lambda quick: suite), clock=clock)
    base, big = r.cases
    assert base.samples == (1.0, 3.0, 2.0) and base.median == 2.0
    assert (base.min, base.max, base.iqr) == (1.0, 3.0, 1.0)  # quartiles 1.5 and 2.5
    assert big.median == 6.0 and big.ratio == 3.0
    assert big.per_size_ratio == 1.5  # (6 / 2) / (2 / 1)
    assert r.scaling_exponent == pytest.approx(1.5849625, rel=1e-6)  # log2(3)


def test_scaling_exponent_of_linear_data_is_one():
    assert harness.scaling_exponent([(8, 0.1), (16, 0.2), (1024, 12.8)]) == pytest.approx(1.0)
    assert harness.scaling_exponent([(8, 0.1)]) is None


def test_bad_baseline_is_refused():
    suite = Suite(cases=(Case("a", lambda: None),), baseline="b")
    with pytest.raises(ValueError, match="baseline 'b'"):
        harness.run_measure(Measure("toy", "", lambda quick: suite))


def test_update_doc_replaces_only_its_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n\n<!-- bench:other -->\nkeep\n<!-- /bench:other -->\n")
    r = harness.MeasureResult("toy", "d", "a", True, (), None)
    harness.update_doc([r], str(doc))
    harness.update_doc([r], str(doc))  # idempotent: replaced, not appended twice
    text = doc.read_text()
    assert text.count("<!-- bench:toy -->") == 1 and "keep" in text and "intro" in text


def test_results_read_back_equal_what_was_written():
    """``python -m rltrain.bench a b`` runs each measure in its own process and reads the
    results back: the round trip through ``results.json`` keeps every field."""
    clock = FakeClock([0, 1.0, 3.0, 2.0])
    suite = Suite(cases=(Case("n=1", clock.step, size=1),), baseline="n=1", warmup=1, repeats=3)
    r = harness.run_measure(Measure("toy", "a toy", lambda quick: suite), clock=clock)
    assert harness.result_from_dict(json.loads(json.dumps(r.to_dict()))) == r
