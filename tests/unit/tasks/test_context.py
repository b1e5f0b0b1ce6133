"""The longest prompt plus the response budget must fit the model's context, before Ray."""

from __future__ import annotations

import json
import pathlib

from rltrain.config.schema import RunConfig
from rltrain.placement.memory import ModelDims, response_budget, sequence_length
from rltrain.tasks import check_task
from rltrain.tasks.context import longest_prompt
from rltrain.tasks.tokenizer import build_char_tokenizer


def _jsonl(tmp_path: pathlib.Path, prompts: list[str]) -> str:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return str(path)


def _run(path: str, context: int, new: int) -> RunConfig:
    run = RunConfig()
    run.task.name, run.task.path = "jsonl", path
    run.model.max_position_embeddings, run.rollout.max_new_tokens = context, new
    return run


def test_the_longest_prompt_plus_the_budget_over_the_context_is_refused(tmp_path):
    # the char tokenizer: one token per character, no special token on a prompt
    path = _jsonl(tmp_path, ["1+1=", "1+2+3+4+5+6="])
    assert check_task(_run(path, context=64, new=52)) == []  # 12 + 52 = 64 fits exactly
    (problem,) = check_task(_run(path, context=64, new=53))
    assert "the longest prompt is 12 tokens" in problem
    assert "with rollout.max_new_tokens=53 a sequence reaches 65 tokens" in problem
    assert "context of 64 (model.max_position_embeddings)" in problem
    assert "lower the response budget to at most 52" in problem


def test_a_budget_as_long_as_the_context_leaves_no_room(tmp_path):
    (problem,) = check_task(_run(_jsonl(tmp_path, ["1+1="]), context=64, new=64))
    assert "rollout.max_new_tokens=64 leaves no room for a prompt" in problem


def test_multi_turn_budget_is_the_episode_total_or_turns_times_turn_budget():
    run = RunConfig()
    assert response_budget(run) == (4, "rollout.max_new_tokens=4")
    run.task.env = "rltrain.tasks.calc_tool:CalculatorEnv"
    run.rollout.max_turns, run.rollout.max_new_tokens = 3, 24
    assert response_budget(run)[0] == 72  # tool results uncounted
    run.rollout.max_total_tokens = 64
    assert response_budget(run) == (64, "rollout.max_total_tokens=64")


def test_the_plan_sizes_a_multi_turn_sequence_by_the_episode_total():
    run = RunConfig()
    run.task.env, run.task.max_prompt_length = "rltrain.tasks.calc_tool:CalculatorEnv", 32
    run.rollout.max_new_tokens, run.rollout.max_total_tokens = 24, 64
    dims = ModelDims(64, 128, 2, 4, 4, 40, 96, "float32", False, False)
    assert sequence_length(run, dims) == 96  # 32 + 64, not 32 + 24
    run.task.env = None
    assert sequence_length(run, dims) == 56


def test_only_prompts_that_could_be_over_are_measured():
    tok = build_char_tokenizer("0123456789+=")
    prompts = ["1=", "12+34=", "1+2="]
    assert longest_prompt(prompts, tok, room=20) is None
    assert longest_prompt(prompts, tok, room=5) == (6, "12+34=")
