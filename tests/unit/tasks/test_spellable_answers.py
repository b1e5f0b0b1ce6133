"""The spelling check reads what the reward compares: a math reward's final answer, not the
reference solution's prose."""

from __future__ import annotations

import json
import pathlib

import pytest

from rltrain.config.schema import ModelConfig, TaskConfig
from rltrain.errors import ConfigError
from rltrain.rewards.math import gsm8k
from rltrain.tasks import build_task, build_tokenizer

SOLUTION = "Tom has 3 + 4 = 7.\n#### 7"


def _task(tmp_path: pathlib.Path, answer: str, reward_fn: str | None) -> TaskConfig:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "3+4=", "answer": answer}) + "\n")
    return TaskConfig(name="jsonl", path=str(path), reward_fn=reward_fn)


def test_a_gsm8k_solution_needs_only_its_final_answer_spelled(tmp_path):
    tok = build_tokenizer(ModelConfig(vocab_chars="0123456789+-*/=(). #"))
    assert gsm8k("", "#### 7", SOLUTION) == 1.0  # the letters are never generated
    cfg = _task(tmp_path, SOLUTION, "rltrain.rewards.math:gsm8k")
    assert build_task(cfg, tok).answer("3+4=") == SOLUTION
    # ',' is not in the alphabet either: the reward compares 1,200 as the value 1200
    cfg = _task(tmp_path, "so #### 1,200", "rltrain.rewards.math:gsm8k_with_format")
    assert build_task(cfg, tok)


def test_the_final_answer_or_its_marker_unspellable_is_refused(tmp_path):
    tok = build_tokenizer(ModelConfig(vocab_chars="0123456789+-*/=(). "))  # no '#'
    cfg = _task(tmp_path, SOLUTION, "rltrain.rewards.math:gsm8k")
    with pytest.raises(
        ConfigError,
        match=r"line 1: answer .* \(task.reward_fn=\S+:gsm8k pays for '#### 7'\) .* \('#'\)",
    ):
        build_task(cfg, tok)
    # exact match compares the whole answer: every character of it must be spellable
    with pytest.raises(ConfigError, match=r"line 1: answer 'Tom has .* has characters"):
        build_task(_task(tmp_path, SOLUTION, None), tok)


def test_an_answer_with_blank_lines_is_spellable_when_its_characters_are(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "3+0=", "answer": "3\n\n3"}) + "\n")
    cfg = TaskConfig(name="jsonl", path=str(path))
    assert build_task(cfg, build_tokenizer(ModelConfig(vocab_chars="0123456789+=\n")))
    with pytest.raises(
        ConfigError,
        match=r"line 1: answer '3\\n\\n3' has characters the "
        r"tokenizer does not know \('\\n'\)",
    ):
        build_task(cfg, build_tokenizer(ModelConfig(vocab_chars="0123456789+=")))
