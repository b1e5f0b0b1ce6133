"""Built-in arithmetic task and the file task: data, splits, data order, rewards, errors."""

from __future__ import annotations

import json
import pathlib
import pickle
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rltrain.config.schema import ModelConfig, TaskConfig
from rltrain.errors import ConfigError
from rltrain.tasks import Example, build_task, build_tokenizer, exact_match


def test_arithmetic_prompts_and_answers():
    task = build_task(TaskConfig(name="arithmetic", max_operand=4))
    assert len(task.train) == 25 and task.eval == task.train and task.eval_is_train
    assert Example("3+4=", "7") in task.train and Example("0+0=", "0") in task.train
    assert task.reward("3+4=", "7") == 1.0 and task.reward("3+4=", " 7 ") == 1.0
    assert task.reward("3+4=", "77") == 0.0 and task.reward("3+4=", "") == 0.0
    with pytest.raises(KeyError):
        task.reward("9+9=", "18")


def test_task_pickles_for_workers():
    task = build_task(TaskConfig(max_operand=3))
    again = pickle.loads(pickle.dumps(task))
    assert again == task and again.reward("1+2=", "3") == 1.0


def test_held_out_split_is_disjoint_and_seeded():
    a = build_task(TaskConfig(max_operand=4, num_eval=5, seed=3))
    assert len(a.train) == 20 and len(a.eval) == 5 and not a.eval_is_train
    assert not set(a.train) & set(a.eval)
    assert a.eval == build_task(TaskConfig(max_operand=4, num_eval=5, seed=3)).eval
    assert a.eval != build_task(TaskConfig(max_operand=4, num_eval=5, seed=4)).eval
    assert len(build_task(TaskConfig(max_operand=4, num_eval=5, num_train=7)).train) == 7
    with pytest.raises(ConfigError, match="task.num_eval=25"):
        build_task(TaskConfig(max_operand=4, num_eval=25))


def test_data_order_walks_epochs_and_depends_only_on_the_step():
    task = build_task(TaskConfig(max_operand=4, seed=0))
    epoch = [ex for step in range(5) for ex in task.sample_batch(step, 5)]
    assert sorted(epoch, key=lambda e: e.prompt) == sorted(task.train, key=lambda e: e.prompt)
    again = build_task(TaskConfig(max_operand=4, seed=0))
    assert again.sample_batch(7, 5) == task.sample_batch(7, 5)  # a resumed run sees the same
    other = build_task(TaskConfig(max_operand=4, seed=1))
    assert other.sample_batch(0, 25) != task.sample_batch(0, 25)


def test_jsonl_task_reads_records(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    rows = [{"q": f"{i}*2=", "a": str(2 * i)} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = build_task(
        TaskConfig(name="jsonl", path=str(path), prompt_key="q", answer_key="a", num_eval=2)
    )
    assert len(task.train) == 4 and len(task.eval) == 2
    assert task.reward("3*2=", "6") == 1.0


def test_jsonl_missing_field_names_line_and_field(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(ConfigError) as info:
        build_task(TaskConfig(name="jsonl", path=str(path)))
    text = str(info.value)
    assert "line 2" in text and "'answer'" in text and "task.answer_key" in text


def test_jsonl_bad_json_conflicts_and_missing_file(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n')
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        build_task(TaskConfig(name="jsonl", path=str(path)))
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "1+1=", "answer": "3"}\n')
    with pytest.raises(ConfigError, match="'1\\+1=' appears with answers"):
        build_task(TaskConfig(name="jsonl", path=str(path)))
    with pytest.raises(ConfigError, match="task.path='/nope.jsonl' does not exist"):
        build_task(TaskConfig(name="jsonl", path="/nope.jsonl"))


def test_parquet_task(tmp_path: pathlib.Path):
    table = pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]})
    pq.write_table(table, str(tmp_path / "d.parquet"))
    task = build_task(TaskConfig(name="jsonl", path=str(tmp_path / "d.parquet")))
    assert task.train == (Example("1+1=", "2"), Example("2+2=", "4"))


def test_reward_fn_is_imported_from_a_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def close_enough(prompt, response, answer):
                try:
                    return 1.0 if abs(float(response) - float(answer)) < 0.5 else 0.0
                except ValueError:
                    return 0.0
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = build_task(TaskConfig(max_operand=2, reward_fn="my_rewards:close_enough"))
    assert task.reward("1+2=", "3.2") == 1.0 and task.reward("1+2=", "x") == 0.0
    with pytest.raises(ConfigError, match="task.reward_fn='no_such_mod:f'.*cannot import"):
        build_task(TaskConfig(reward_fn="no_such_mod:f"))
    with pytest.raises(ConfigError, match="has no callable 'missing'"):
        build_task(TaskConfig(reward_fn="my_rewards:missing"))
    with pytest.raises(ConfigError, match="must look like"):
        build_task(TaskConfig(reward_fn="my_rewards.close_enough"))


def test_answers_the_tokenizer_cannot_spell_are_refused(tmp_path: pathlib.Path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "capital of France?", "answer": "Paris"}\n')
    with pytest.raises(ConfigError, match="model.vocab_chars"):
        build_task(TaskConfig(name="jsonl", path=str(path)), build_tokenizer(ModelConfig()))
    letters = ModelConfig(vocab_chars="abcdefghijklmnopqrstuvwxyzPF ?")
    assert build_task(TaskConfig(name="jsonl", path=str(path)), build_tokenizer(letters))


def test_unknown_task_and_default_reward():
    with pytest.raises(ConfigError, match="task.name='gym' is not a reasoning task"):
        build_task(TaskConfig(name="gym"))
    assert exact_match("p", " 12\n", "12") == 1.0
