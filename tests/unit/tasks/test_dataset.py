"""Dataset files through Hugging Face datasets: every format, and a clear error for each fault."""

from __future__ import annotations

import json
import pathlib
import sys

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rltrain.errors import ConfigError
from rltrain.tasks import read_rows
from rltrain.tasks.dataset import load_table

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": 4}]


def _jsonl(path: pathlib.Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_every_format_reads_the_same_rows(tmp_path: pathlib.Path):
    jsonl = _jsonl(tmp_path / "d.jsonl", [json.dumps(r) for r in ROWS])
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    pq.write_table(
        pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}), tmp_path / "d.parquet"
    )
    datasets.Dataset.from_list(
        [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    ).save_to_disk(str(tmp_path / "saved"))
    for path in (jsonl, tmp_path / "d.json", tmp_path / "d.parquet", tmp_path / "saved"):
        rows = read_rows(str(path))
        assert rows.prompts == ["1+1=", "2+2="] and rows.answers == ["2", "4"], path


def test_message_prompts_nested_fields_and_numeric_answers(tmp_path: pathlib.Path):
    # verl's GSM8K layout: prompt = messages, answer nested under reward_model.ground_truth
    row = {
        "prompt": [{"role": "user", "content": "What is 6*7?"}],
        "reward_model": {"ground_truth": "42", "style": "rule"},
        "n": 42.0,
    }
    path = _jsonl(tmp_path / "v.jsonl", [json.dumps(row)])
    rows = read_rows(path, "prompt", "reward_model.ground_truth")
    assert rows.prompts == [[{"role": "user", "content": "What is 6*7?"}]]
    assert rows.answers == ["42"]
    assert read_rows(path, "prompt", "n").answers == ["42"]  # a float column's 42.0 is 42


def test_dataset_dict_directories_pick_the_split_by_key(tmp_path: pathlib.Path):
    part = {
        k: datasets.Dataset.from_list([{"prompt": k, "answer": "1"}]) for k in ("train", "test")
    }
    datasets.DatasetDict(part).save_to_disk(str(tmp_path / "dd"))
    assert read_rows(str(tmp_path / "dd")).prompts == ["train"]
    assert read_rows(str(tmp_path / "dd"), key="task.eval_path").prompts == ["test"]
    odd = {k: datasets.Dataset.from_list([{"prompt": k, "answer": "1"}]) for k in ("a", "b")}
    datasets.DatasetDict(odd).save_to_disk(str(tmp_path / "odd"))
    with pytest.raises(ConfigError, match=r"splits \['a', 'b'\].*save the split you mean"):
        read_rows(str(tmp_path / "odd"))


def test_a_dataset_dict_of_only_train_is_no_eval_set(tmp_path: pathlib.Path):
    only = {"train": datasets.Dataset.from_list([{"prompt": "1+1=", "answer": "2"}])}
    datasets.DatasetDict(only).save_to_disk(str(tmp_path / "dd"))
    assert read_rows(str(tmp_path / "dd")).prompts == ["1+1="]
    with pytest.raises(
        ConfigError,
        match=r"task.eval_path=.* only split is 'train', not held-out rows: .* task.num_eval",
    ):
        read_rows(str(tmp_path / "dd"), key="task.eval_path")
    odd = {"heldout": datasets.Dataset.from_list([{"prompt": "2+2=", "answer": "4"}])}
    datasets.DatasetDict(odd).save_to_disk(str(tmp_path / "odd"))
    assert read_rows(str(tmp_path / "odd"), key="task.eval_path").prompts == ["2+2="]


@pytest.mark.parametrize(
    "name, content, want",
    [
        ("empty.jsonl", b"", "is empty: it holds no rows"),
        ("blank.jsonl", b"\n  \n", "holds only whitespace"),
        ("bad.jsonl", b'{"prompt": "a", "answer": "1"}\n{"prompt": \n', r"line 2: not valid JSON"),
        (
            "list.jsonl",
            b'{"prompt": "a", "answer": "1"}\n[1, 2]\n',
            "line 2: expected a JSON object",
        ),
        ("bin.jsonl", bytes(range(256)) * 4, r"not UTF-8 text \(byte 0x80 at offset 128\).*binary"),
        ("nul.json", b'{"prompt": "a\x00"}', "NUL bytes"),
        (
            "bad.json",
            b'[{"prompt": "a", "answer": "1"},\n {"prompt": }]',
            r"line 2: not valid JSON",
        ),
        (
            "d.csv",
            b"prompt,answer\na,1\n",
            r"\.csv is not a supported dataset type; use \.jsonl, \.json",
        ),
        ("d.parquet", b"PAR1 not really", "is not a readable Parquet file"),
    ],
)
def test_bad_files_get_a_clear_message(tmp_path: pathlib.Path, name, content, want):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=want) as info:
        read_rows(str(path))
    assert f"task.path='{path}'" in str(info.value)
    assert "UnicodeDecodeError" not in str(info.value)


def test_a_field_may_mix_strings_and_message_lists(tmp_path: pathlib.Path):
    messages = [{"role": "user", "content": "b"}]
    path = _jsonl(
        tmp_path / "mix.jsonl",
        [json.dumps({"prompt": "a", "answer": "1"}), json.dumps({"prompt": messages, "answer": 2})],
    )
    assert read_rows(path).prompts == ["a", messages]  # not JSON text: the objects themselves


def test_missing_fields_name_file_line_and_field(tmp_path: pathlib.Path):
    lines = [json.dumps({"prompt": "a", "answer": "1"}), "", json.dumps({"prompt": "b"})]
    lines += [json.dumps({"answer": "3"})]
    path = _jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(ConfigError) as info:
        read_rows(path)
    problems = info.value.problems
    # row 1 sits on line 3 (line 2 is blank), row 2 on line 4
    assert any("line 3: missing field 'answer' (task.answer_key='answer')" in p for p in problems)
    assert any("line 4: missing field 'prompt' (task.prompt_key='prompt')" in p for p in problems)
    assert len(problems) == 2


def test_answers_must_be_text_or_numbers(tmp_path: pathlib.Path):
    pq.write_table(
        pa.table({"prompt": ["a", "b"], "answer": [[1], [2, 3]]}), tmp_path / "d.parquet"
    )
    with pytest.raises(ConfigError, match="row 0: the answer field 'answer' holds a list"):
        read_rows(str(tmp_path / "d.parquet"))
    lines = [json.dumps({"prompt": "a", "answer": "1"}), json.dumps({"prompt": "b", "answer": [2]})]
    with pytest.raises(ConfigError, match="line 2: the answer field 'answer' holds a list"):
        read_rows(_jsonl(tmp_path / "d.jsonl", lines))
    # with gaps in the field pyarrow gives up on the mixed types: our second look names the line
    lines = [json.dumps({"prompt": "a", "answer": "1"}), "", json.dumps({"prompt": "b"})]
    lines += [json.dumps({"answer": "3"}), json.dumps({"prompt": "d", "answer": [1]})]
    with pytest.raises(
        ConfigError, match="line 5: field 'answer' holds a list here but a string on line 1"
    ):
        read_rows(_jsonl(tmp_path / "d.jsonl", lines))


def test_a_field_missing_from_every_row_lists_the_fields(tmp_path: pathlib.Path):
    path = _jsonl(tmp_path / "d.jsonl", [json.dumps({"question": "a", "answer": "1"})])
    with pytest.raises(
        ConfigError,
        match=r"no field 'prompt' \(task.prompt_key='prompt'\).*\['question', 'answer'\]",
    ):
        read_rows(path)


def test_many_bad_rows_are_counted_not_all_listed(tmp_path: pathlib.Path):
    lines = [json.dumps({"prompt": "ok", "answer": "1"})] + [json.dumps({"prompt": "x"})] * 20
    with pytest.raises(ConfigError) as info:
        read_rows(_jsonl(tmp_path / "d.jsonl", lines))
    assert len(info.value.problems) == 6 and "15 more rows like these" in info.value.problems[-1]


def test_missing_paths_and_directories_that_are_no_dataset(tmp_path: pathlib.Path):
    with pytest.raises(ConfigError, match="task.eval_path='/no/such.jsonl' does not exist"):
        read_rows("/no/such.jsonl", key="task.eval_path")
    with pytest.raises(ConfigError, match="not one written by datasets' save_to_disk"):
        read_rows(str(tmp_path))


def test_without_datasets_installed_the_fix_is_named(tmp_path: pathlib.Path, monkeypatch):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a"], "answer": ["1"]}), path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(ConfigError, match="pip install datasets pyarrow"):
        load_table(str(path))


def test_reading_leaves_no_cache_behind(tmp_path: pathlib.Path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    read_rows(_jsonl(tmp_path / "d.jsonl", [json.dumps(ROWS[0])]))
    assert [p.name for p in tmp_path.iterdir()] == ["d.jsonl"]
