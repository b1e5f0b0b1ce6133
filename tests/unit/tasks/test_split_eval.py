"""task.num_eval holds prompts out by distinct prompt: no held-out prompt is trained on."""

from __future__ import annotations

import json

import pytest

from rltrain.config.schema import TaskConfig
from rltrain.errors import ConfigError
from rltrain.tasks import build_task
from rltrain.tasks.base import Example, split_eval

ROWS = [Example(p, a) for p, a in zip("abacbd", "121324", strict=True)]  # a and b twice


@pytest.mark.parametrize("seed", range(12))
def test_a_prompt_given_twice_is_held_out_on_all_its_rows_or_none(seed):
    train, evals, same = split_eval(ROWS, 2, 0, seed)
    held = {e.prompt for e in evals}
    assert not same and len(evals) == 2 and len(held) == 2  # two distinct prompts, once each
    assert not held & {e.prompt for e in train}
    # every row of a prompt not held out is trained on, duplicates included
    assert list(train) == [e for e in ROWS if e.prompt not in held]


def test_counts_are_of_distinct_prompts_and_of_training_rows():
    with pytest.raises(ConfigError, match="holds out every one of the task's 4 distinct prompts"):
        split_eval(ROWS, 4, 0, 0)
    train, evals, _ = split_eval(ROWS, 3, 0, 0)
    assert len(evals) == 3 and len({e.prompt for e in train}) == 1
    with pytest.raises(ConfigError, match=f"task.num_train=3 is more than the {len(train)} "):
        split_eval(ROWS, 3, 3, 0)


def test_a_jsonl_file_with_a_repeated_prompt_keeps_it_out_of_training(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)] * 2
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for seed in range(6):
        task = build_task(TaskConfig(name="jsonl", path=str(path), num_eval=2, seed=seed), None)
        held = {e.prompt for e in task.eval}
        assert len(held) == 2 and not held & {e.prompt for e in task.train}
        assert len(task.train) == 8  # the 4 other prompts, twice each


def test_an_eval_file_sharing_training_prompts_is_reported_once(tmp_path, caplog):
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows[4:] + [rows[0] | {"prompt": "x"}]))
    cfg = TaskConfig(name="jsonl", path=str(train), eval_path=str(evals), num_eval=0)
    with caplog.at_level("WARNING", logger="rltrain.tasks.build"):
        build_task(cfg, None)
        build_task(cfg, None)  # the same files again in this process: not repeated
    notes = [r.getMessage() for r in caplog.records if "not held-out" in r.getMessage()]
    assert len(notes) == 1 and "2 of its 3 prompts are also training prompts" in notes[0]
    assert f"task.eval_path={str(evals)!r}" in notes[0]
