"""A JSON answer that is a number is read with the file's own digits, never rounded."""

from __future__ import annotations

import pathlib

import pytest

from rltrain.tasks.dataset import read_rows


def _write(tmp_path: pathlib.Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("answers", "want"),
    [
        # over int64: Arrow would read it as a double, 12345678901234567168
        (["12345678901234567890"], ["12345678901234567890"]),
        (["123456789012345678901234567890"], ["123456789012345678901234567890"]),
        # beside a float the column is float64, and 2**53 + 1 would become 2**53
        (["9007199254740993", "0.5"], ["9007199254740993", "0.5"]),
        # an integral float is its integer, as a float64 column's 72.0 always was
        (["72.0", "1e3", "1.50"], ["72", "1000", "1.50"]),
    ],
)
def test_json_lines_numbers_are_exact(tmp_path, answers, want):
    text = "".join(f'{{"prompt": "q{i}", "answer": {a}}}\n' for i, a in enumerate(answers))
    assert read_rows(_write(tmp_path, "d.jsonl", text)).answers == want


def test_a_json_array_and_a_nested_field_are_exact_too(tmp_path):
    path = _write(tmp_path, "d.json", '[{"prompt": "q", "out": {"n": 12345678901234567890}}]')
    assert read_rows(path, answer_key="out.n").answers == ["12345678901234567890"]
