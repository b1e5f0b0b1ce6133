"""``--update-docs``: generated blocks only, never hand-written text, never ``--quick`` figures."""

from __future__ import annotations

import pytest

from rltrain.bench import harness
from rltrain.bench.harness import CaseResult, MeasureResult
from rltrain.errors import ConfigError


def result(name: str = "toy", note: str = "a note") -> MeasureResult:
    case = CaseResult("a", (1.0,), 1.0, 1.0, 1.0, 0.0, 1.0)
    return MeasureResult(name, "what is timed", "a", False, (case,), None, note, "2026-11-28")


def doc_with(body: str) -> str:
    return f"# Benchmarks\n\nintro\n\n<!-- bench:toy -->\n{body}\n<!-- /bench:toy -->\n\nafter\n"


def test_what_the_harness_renders_is_generated_and_stays_replaceable(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(doc_with(""))
    harness.update_doc([result()], str(doc))
    block = harness.doc_blocks(doc.read_text())["toy"]
    assert harness.is_generated("toy", block)
    harness.update_doc([result(note="another note")], str(doc))
    text = doc.read_text()
    assert "another note" in text and "a note\n" not in text
    assert text.startswith("# Benchmarks\n\nintro\n") and text.endswith("\n\nafter\n")


@pytest.mark.parametrize(
    "hand",
    [
        "A multi-run table by hand:\n\n| run | s |\n|---|---|\n| 1 | 2 |",
        "Analysis wrapped over\ntwo lines.",
    ],
)
def test_a_block_holding_hand_written_text_is_refused_and_kept(tmp_path, hand):
    doc = tmp_path / "benchmarks.md"
    generated = harness.markdown([result()])
    doc.write_text(doc_with(f"{generated}\n{hand}\n"))
    before = doc.read_text()
    assert not harness.is_generated("toy", harness.doc_blocks(before)["toy"])
    with pytest.raises(ConfigError, match=r"block of toy holds text .* below <!-- /bench:toy -->"):
        harness.update_doc([result()], str(doc))
    assert doc.read_text() == before


def test_a_heading_of_another_measure_is_not_generated():
    block = harness.markdown([result("other")])
    assert harness.is_generated("other", block) and not harness.is_generated("toy", block)


def run_main(tmp_path, monkeypatch, *argv: str) -> list[str]:
    from rltrain.bench import __main__ as bench_main

    ran: list[str] = []
    monkeypatch.setattr(bench_main, "_run", lambda reg, names, quick: ran.extend(names))
    monkeypatch.setattr(bench_main, "_run_apart", lambda names, quick: ran.extend(names))
    assert bench_main.main([*argv, "--out", str(tmp_path / "out")]) == 2
    return ran


def test_quick_with_update_docs_is_refused_before_any_measure(tmp_path, capsys, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    ran = run_main(tmp_path, monkeypatch, "plan_scale", "--quick", "--update-docs", str(doc))
    assert ran == [] and doc.read_text() == "# Benchmarks\n"
    err = capsys.readouterr().err
    assert f"--update-docs {doc} with --quick" in err and "Leave out --quick" in err


def test_a_hand_written_block_is_refused_before_any_measure(tmp_path, capsys, monkeypatch):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "<!-- bench:plan_scale -->\nMy analysis\nof the figures.\n<!-- /bench:plan_scale -->\n"
    )
    ran = run_main(tmp_path, monkeypatch, "plan_scale", "--update-docs", str(doc))
    assert ran == []
    assert "the block of plan_scale holds text the bench does not write" in capsys.readouterr().err
