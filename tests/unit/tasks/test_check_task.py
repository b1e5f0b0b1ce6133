"""check_task: every problem of a run's task before Ray starts, all in one list."""

from __future__ import annotations

import json
import pathlib

from rltrain.config.schema import RunConfig
from rltrain.tasks import check_task


def _run(**task) -> RunConfig:
    run = RunConfig()
    for k, v in task.items():
        setattr(run.task, k, v)
    return run


def test_a_good_task_has_no_problems_and_gym_is_not_checked_here(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    assert check_task(_run(name="jsonl", path=str(path))) == []
    assert check_task(_run()) == []  # the built-in arithmetic task
    embodied = _run(name="gym")
    embodied.runner = "embodied"
    assert check_task(embodied) == []


def test_every_problem_is_reported_at_once(tmp_path: pathlib.Path):
    train = tmp_path / "train.jsonl"
    lines = [
        {"prompt": "1+2=", "answer": "3"},
        {"prompt": "2+2="},
        {"prompt": "x=", "answer": "Paris"},
    ]
    train.write_text("".join(json.dumps(r) + "\n" for r in lines))
    evals = tmp_path / "eval.csv"
    evals.write_text("prompt,answer\n")
    run = _run(
        name="jsonl",
        path=str(train),
        eval_path=str(evals),
        reward_fn="no_such_module_q:f",
        num_eval=3,
    )
    problems = check_task(run)
    text = "\n".join(problems)
    assert "task.reward_fn='no_such_module_q:f'" in text
    assert "line 2: missing field 'answer'" in text
    assert "task.eval_path=" in text and ".csv is not a supported dataset type" in text
    assert "task.num_eval=3 with task.eval_path=" in text
    assert len(problems) == 4  # the answer 'Paris' is checked once the rows read cleanly


def test_answers_the_tokenizer_cannot_spell_and_long_prompts(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "answer": "Paris"}, {"prompt": "1+" * 40 + "1=", "answer": "41"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = check_task(_run(name="jsonl", path=str(path), max_prompt_length=20))
    assert len(problems) == 2
    assert (
        "line 2: the prompt is 82 tokens (chat template applied), over task.max_prompt_length=20"
        in problems[0]
    )
    assert "line 1: answer 'Paris' has characters the tokenizer does not know" in problems[1]
    assert "model.vocab_chars" in problems[1]


def test_a_tokenizer_that_cannot_load_still_lets_the_files_be_checked(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    path.write_text("{not json\n")
    run = _run(name="jsonl", path=str(path))
    run.model.tokenizer_path = str(tmp_path / "no_tokenizer")
    problems = check_task(run)
    assert any("model.tokenizer_path=" in p for p in problems)
    assert any("line 1: not valid JSON" in p for p in problems)


def test_generation_settings_are_checked_before_anything_is_written(tmp_path: pathlib.Path):
    run = _run(name="arithmetic", generate="gsm8k_tiny", path=None)
    problems = check_task(run)
    assert any("writes its data to task.path, which is not set" in p for p in problems)
    assert any("model.path, which is not set" in p for p in problems)
    assert any("task.name='jsonl' (got task.name='arithmetic')" in p for p in problems)
    assert check_task(_run(generate="gsm9k")) == [
        "task.generate='gsm9k' is not a generator rltrain has: choose one of ['gsm8k_tiny', "
        "'calc_tool'], "
        "or null to read existing files"
    ]
    assert list(tmp_path.iterdir()) == []


def test_task_params_without_a_generator_refuse_only_keys_no_generator_has(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n' * 3)
    path = str(tmp_path / "t.jsonl")
    # a preset's generator settings kept with task.generate=null are not read, and let through
    assert check_task(_run(name="jsonl", path=path, params={"sft_steps": 5, "num_terms": 2})) == []
    problems = check_task(_run(name="jsonl", path=path, params={"sft_stepz": 5}))
    assert problems == [
        "task.params.sft_stepz=5 is not a setting of any task.generate (settings: ['data_dir', "
        "'digits', 'max_number', 'num_eval', 'num_terms', 'num_train', 'sft_batch_size', "
        "'sft_lr', 'sft_steps', 'tool', 'vocab_size']); with task.generate=null task.params is "
        "not read: fix the key or drop it"
    ]
