"""Every prompt is read back from its token ids as the reward worker reads it, before Ray."""

from __future__ import annotations

import json
import pathlib

import pytest

from rltrain.algorithms import encode_prompts
from rltrain.config.schema import ModelConfig, TaskConfig
from rltrain.errors import ConfigError
from rltrain.tasks import build_task, build_tokenizer


def _jsonl(path: pathlib.Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _read_back(tok, prompt: str) -> str:
    ids, _ = encode_prompts(tok, [prompt])
    return tok.batch_decode(ids.tolist(), skip_special_tokens=True)[0]


def test_a_prompt_past_the_first_rows_that_reads_back_differently_is_found(tmp_path):
    # the built-in alphabet has no '?': row 513 reads back as '7+1=' (the <unk> is skipped)
    tok = build_tokenizer(ModelConfig())
    rows = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(512)]
    rows.append({"prompt": "7+1=?", "answer": "8"})
    task = build_task(TaskConfig(name="jsonl", path=_jsonl(tmp_path / "d.jsonl", rows)), tok)
    back = _read_back(tok, "7+1=?")
    assert back == "7+1="
    assert task.answer(back) == "8" and task.reward(back, "8") == 1.0


def test_prompts_that_read_back_the_same_with_different_answers_are_refused(tmp_path):
    tok = build_tokenizer(ModelConfig())
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "7+1=?", "answer": "8"}]
    rows.append({"prompt": "7+1=!", "answer": "9"})
    path = _jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ConfigError) as info:
        build_task(TaskConfig(name="jsonl", path=path), tok)
    (problem,) = info.value.problems
    assert "line 2 and" in problem and "line 3: the prompts differ" in problem
    assert "read back from their token ids as '7+1='" in problem
    assert "answers differ ('8' and '9')" in problem and "model.vocab_chars" in problem


def test_a_prompt_reading_back_as_another_prompt_with_its_own_answer_is_refused(tmp_path):
    tok = build_tokenizer(ModelConfig())
    train = _jsonl(tmp_path / "t.jsonl", [{"prompt": "7+1=", "answer": "8"}])
    evals = _jsonl(tmp_path / "e.jsonl", [{"prompt": "7+1=?", "answer": "9"}])
    with pytest.raises(ConfigError, match=r"task.eval_path=.* line 1: the prompts differ"):
        build_task(TaskConfig(name="jsonl", path=train, eval_path=evals), tok)


def test_prompts_that_read_back_the_same_with_one_answer_share_it(tmp_path):
    tok = build_tokenizer(ModelConfig())
    rows = [{"prompt": "7+1=?", "answer": "8"}, {"prompt": "7+1=!", "answer": "8"}]
    task = build_task(TaskConfig(name="jsonl", path=_jsonl(tmp_path / "d.jsonl", rows)), tok)
    assert task.reward("7+1=", "8") == 1.0 and len(task.train) == 2
