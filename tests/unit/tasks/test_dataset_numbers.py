"""A JSON answer that is a number is read with the file's own digits, never rounded."""

from __future__ import annotations

import pathlib

import pytest

from rltrain.errors import ConfigError
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
        # a fraction or exponent as written, never re-spelt as Decimal's "1E-7"
        (["1e-7", "0.0000001", "2.5E-3", "-0.0"], ["1e-7", "0.0000001", "2.5E-3", "0"]),
    ],
)
def test_json_lines_numbers_are_exact(tmp_path, answers, want):
    text = "".join(f'{{"prompt": "q{i}", "answer": {a}}}\n' for i, a in enumerate(answers))
    assert read_rows(_write(tmp_path, "d.jsonl", text)).answers == want


def test_a_json_array_and_a_nested_field_are_exact_too(tmp_path):
    path = _write(tmp_path, "d.json", '[{"prompt": "q", "out": {"n": 12345678901234567890}}]')
    assert read_rows(path, answer_key="out.n").answers == ["12345678901234567890"]


def test_a_number_beyond_a_float64_is_read_or_refused_as_such(tmp_path):
    # a JSON array's loader gives null for it: the file's digits are the answer
    path = _write(tmp_path, "d.json", '[{"prompt": "q", "answer": 1e400}]')
    assert read_rows(path).answers == ["1" + "0" * 400]
    # the JSON-lines loader cannot read the file at all: the message names the line and field
    lines = '{"prompt": "q", "answer": 1}\n{"prompt": "r", "answer": 1e400}\n'
    path = _write(tmp_path, "d.jsonl", lines)
    with pytest.raises(
        ConfigError,
        match=r"line 2: field 'answer' holds a number beyond a float64's range, which the loader "
        r"cannot read: quote it",
    ):
        read_rows(path)
    path = _write(tmp_path, "big.json", f'[{{"prompt": "q", "answer": {2**70}}}]')
    with pytest.raises(ConfigError, match=r"row 0: field 'answer' holds a 71-bit integer"):
        read_rows(path)


def test_numbers_are_read_beside_a_line_separator_in_a_string_and_after_a_bom(tmp_path):
    # U+2028 is legal raw inside a JSON string (json.dumps(ensure_ascii=False) writes it);
    # a byte-order mark the loader accepts too
    text = '{"prompt": "a\u2028b", "answer": 1}\n{"prompt": "c", "answer": 2.50}\n'
    assert read_rows(_write(tmp_path, "sep.jsonl", text)).answers == ["1", "2.50"]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "q", "answer": 2.50}\n')
    assert read_rows(str(path)).answers == ["2.50"]  # the file's digits, not the loader's 2.5


@pytest.mark.parametrize("answer", ["true", "false"])
def test_a_boolean_answer_is_refused(tmp_path, answer):
    # Python would spell it True, which no response in the file's spelling (true) matches
    path = _write(tmp_path, "d.jsonl", f'{{"prompt": "q", "answer": {answer}}}\n')
    with pytest.raises(ConfigError, match="holds a boolean, neither text nor a number"):
        read_rows(path)
    quoted = _write(tmp_path, "q.jsonl", f'{{"prompt": "q", "answer": "{answer}"}}\n')
    assert read_rows(quoted).answers == [answer]


def test_a_nan_answer_is_a_missing_one(tmp_path):
    path = _write(tmp_path, "d.jsonl", '{"prompt": "q", "answer": NaN}\n')
    with pytest.raises(ConfigError, match="missing field 'answer'"):
        read_rows(path)


def test_a_byte_that_is_not_utf8_inside_a_string_is_named_at_its_file_offset(tmp_path):
    # the loader keeps the bytes unchecked until a row is read; with or without a byte-order
    # mark the offset is the byte's own in the file
    for bom, offset in ((b"", 28), (b"\xef\xbb\xbf", 31)):
        path = tmp_path / "d.jsonl"
        path.write_bytes(bom + b'{"prompt": "q", "answer": "a\xff"}\n')
        with pytest.raises(
            ConfigError, match=rf"is not UTF-8 text \(byte 0xff at offset {offset}\)"
        ):
            read_rows(str(path))


def test_a_file_with_carriage_return_line_ends_is_diagnosed_at_the_right_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "q", "answer": "a"}\r{"prompt": "r", "answer": "b" oops}\r')
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        read_rows(str(path))
