"""Files without rows and prompts that are not text get messages that say so."""

from __future__ import annotations

import pytest

from rltrain.errors import ConfigError
from rltrain.tasks.dataset import read_rows


def test_a_parquet_file_without_rows_says_it_holds_none(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": []}), path)
    with pytest.raises(ConfigError, match=r"d.parquet' holds no rows"):
        read_rows(str(path))


def test_an_empty_json_array_says_it_holds_no_rows(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("[]")
    with pytest.raises(ConfigError, match=r"d.json' is an empty JSON array: it holds no rows"):
        read_rows(str(path))


def test_a_number_as_prompt_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": 5, "answer": "5"}\n{"prompt": 6, "answer": "6"}\n')
    with pytest.raises(ConfigError) as info:
        read_rows(str(path))
    first, second = info.value.problems
    assert first.endswith(
        "line 1: the prompt field 'prompt' holds a number (first of these rows): a prompt must "
        "be a string or a list of {role, content} messages; quote it"
    )
    assert "line 2:" in second


def test_a_list_of_strings_as_prompt_is_not_called_empty(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": ["1+1=", "x"], "answer": "2"}\n')
    with pytest.raises(ConfigError) as info:
        read_rows(str(path))
    [problem] = info.value.problems
    assert problem.endswith(
        "line 1: the prompt field 'prompt' is a list but not of {role, content} messages with "
        'string values: give a string, or messages such as [{"role": "user", "content": "..."}]'
    )
