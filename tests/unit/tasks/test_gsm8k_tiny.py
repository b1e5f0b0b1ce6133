"""task.generate=gsm8k_tiny: the synthetic word problems, the BPE chat tokenizer, the cache."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re

import pyarrow.parquet as pq
import pytest
import torch

from rltrain.config.schema import ModelConfig, RunConfig
from rltrain.errors import ConfigError
from rltrain.rewards.math import extract_hash_answer
from rltrain.tasks import build_task, build_tokenizer, check_task
from rltrain.tasks.chat import render_prompts
from rltrain.tasks.gsm8k_tiny import (
    TEMPLATES,
    Gsm8kTinySpec,
    ensure_gsm8k_tiny,
    solution_pieces,
    word_problems,
)
from rltrain.tasks.model import build_model
from rltrain.tasks.python_tool import evaluate
from rltrain.tasks.sft import sft_batch, sft_loss
from rltrain.tasks.tokenizer import prompt_token_ids


def _operation(question: str) -> tuple[str, int, int]:
    """The operation and operands of a problem, read back through its template's shape."""
    for op, template, _ in TEMPLATES:
        pattern = re.escape(template)
        for field, group in (
            ("{n}", r"\w+"),
            ("{x}", r"\w+"),
            ("{a}", r"(\d+)"),
            ("{b}", r"(\d+)"),
        ):
            pattern = pattern.replace(re.escape(field), group)
        found = re.fullmatch(pattern, question)
        if found:
            return op, int(found.group(1)), int(found.group(2))
    raise AssertionError(f"no template makes {question!r}")


def test_problems_are_correct_disjoint_and_seeded():
    spec = Gsm8kTinySpec(num_train=300, num_eval=50, max_number=5, seed=3)
    train, evals = word_problems(spec)
    assert len(train) == 300 and len(evals) == 50
    assert not {r["question"] for r in train} & {r["question"] for r in evals}
    assert word_problems(spec) == (train, evals)
    assert word_problems(Gsm8kTinySpec(num_train=300, num_eval=50, max_number=5, seed=4)) != (
        train,
        evals,
    )
    ops = set()
    for row in train + evals:
        op, a, b = _operation(row["question"])
        want = a + b if op == "+" else a - b
        assert want >= 0 and a <= 5 and b <= 5
        assert extract_hash_answer(row["answer"]) == str(want)
        assert f"{a} {op} {b} = {want}" in row["answer"]
        ops.add(op)
    assert ops == {"+", "-"}


def test_spec_from_params_names_the_bad_keys():
    assert Gsm8kTinySpec.from_params(
        {"num_train": 10, "data_dir": "/d"},
        5,  # the presets' paths read data_dir
    ) == Gsm8kTinySpec(num_train=10, seed=5)
    # a misspelt setting would be ignored: it is refused with the settings there are
    with pytest.raises(ConfigError) as info:
        Gsm8kTinySpec.from_params({"sft_stepz": 5, "seed": 3}, 0)
    misspelt, seed = info.value.problems
    assert misspelt.startswith("task.params.sft_stepz=5 is not a setting of task.generate=")
    assert "'gsm8k_tiny': its settings are ['num_train', 'num_eval', 'max_number'" in misspelt
    assert "'tool', 'data_dir']; fix the key or drop it" in misspelt
    assert "task.params.seed=3" in seed and "the generator's seed is task.seed" in seed
    with pytest.raises(ConfigError, match="task.params.num_eval='3' must be an integer"):
        Gsm8kTinySpec.from_params({"num_eval": "3"}, 0)
    # operands 0..1: 4 sums and 3 differences per template, 3 templates each, 10 names, 8 objects
    with pytest.raises(ConfigError, match="gives only 1680 distinct problems"):
        Gsm8kTinySpec.from_params({"max_number": 1, "num_train": 2000}, 0)
    with pytest.raises(ConfigError, match="task.params.vocab_size=100 must be >= 300"):
        Gsm8kTinySpec.from_params({"vocab_size": 100}, 0)
    assert Gsm8kTinySpec.from_params({"sft_lr": 1}, 0).sft_lr == 1.0  # an int is a float here
    with pytest.raises(ConfigError, match="sft_lr=nan must be a finite number"):
        Gsm8kTinySpec.from_params({"sft_lr": float("nan")}, 0)
    with pytest.raises(ConfigError, match=r"sft_steps=-1 must be in 0..100000"):
        Gsm8kTinySpec.from_params({"sft_steps": -1}, 0)
    assert Gsm8kTinySpec.from_params({"tool": True}, 0).tool is True
    with pytest.raises(ConfigError, match="task.params.tool=1 must be true or false"):
        Gsm8kTinySpec.from_params({"tool": 1}, 0)


def _tiny_model() -> ModelConfig:
    return ModelConfig(
        family="qwen2",
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        max_position_embeddings=128,
    )


def test_written_once_then_reused_and_rewritten_when_the_spec_changes(tmp_path: pathlib.Path):
    spec = Gsm8kTinySpec(num_train=200, num_eval=20, vocab_size=320, sft_steps=0)
    paths = (
        str(tmp_path / "d/train.parquet"),
        str(tmp_path / "d/eval.parquet"),
        str(tmp_path / "ckpt"),
    )
    model = _tiny_model()
    assert ensure_gsm8k_tiny(*paths, spec, model) is True
    assert pq.read_table(paths[0]).column_names == ["question", "answer"]
    assert pq.read_table(paths[1]).num_rows == 20
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(paths[2]))
    mtime = os.path.getmtime(paths[0])
    assert ensure_gsm8k_tiny(*paths, spec, model) is False and os.path.getmtime(paths[0]) == mtime
    smaller = Gsm8kTinySpec(num_train=100, num_eval=20, vocab_size=320, sft_steps=0)
    assert ensure_gsm8k_tiny(*paths, smaller, model)
    assert pq.read_table(paths[0]).num_rows == 100
    os.remove(paths[1])  # a missing file is rewritten
    assert ensure_gsm8k_tiny(*paths, smaller, model)
    wider = dataclasses.replace(model, hidden_size=32)  # other model fields: a new checkpoint
    assert ensure_gsm8k_tiny(*paths, smaller, wider)
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["hidden_size"] == 32
    assert ensure_gsm8k_tiny(*paths, smaller, wider, "A new system prompt.")
    assert ensure_gsm8k_tiny(*paths, smaller, wider, "A new system prompt.", chat=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "ckpt.lock", "d"]


def test_the_base_checkpoint_is_supervised_on_the_solutions(tmp_path: pathlib.Path):
    """sft_steps > 0: the saved model gives the training solutions (EOS included) a higher
    likelihood than the same model with no supervised step, through the run's own prompt
    rendering; the checkpoint loads back through model.path."""
    spec = Gsm8kTinySpec(num_train=200, num_eval=8, vocab_size=320, sft_steps=0)
    model = _tiny_model()

    def nll(ckpt: pathlib.Path) -> float:
        run = ModelConfig(path=str(ckpt))
        tok = build_tokenizer(run)
        lm = build_model(run)
        rows = pq.read_table(str(tmp_path / "train.parquet")).to_pylist()[:32]
        prompts = render_prompts([r["question"] for r in rows], tok, True, "Be brief.")
        answers = tok([r["answer"] for r in rows], add_special_tokens=False)["input_ids"]
        pairs = [
            (p, [*a, tok.eos_token_id])
            for p, a in zip(prompt_token_ids(tok, prompts), answers, strict=True)
        ]
        with torch.no_grad():
            return float(sft_loss(lm, *sft_batch(pairs, tok.pad_token_id)))

    data = (str(tmp_path / "train.parquet"), str(tmp_path / "eval.parquet"))
    ensure_gsm8k_tiny(*data, str(tmp_path / "raw"), spec, model, "Be brief.")
    trained = dataclasses.replace(spec, sft_steps=40, sft_lr=1e-2)
    ensure_gsm8k_tiny(*data, str(tmp_path / "sft"), trained, model, "Be brief.")
    assert nll(tmp_path / "sft") < 0.5 * nll(tmp_path / "raw")


def test_check_task_generates_then_the_task_builds_with_the_chat_template(tmp_path: pathlib.Path):
    run = RunConfig()
    data = tmp_path / "cache"
    for k, v in {
        "name": "jsonl",
        "generate": "gsm8k_tiny",
        "path": str(data / "train.parquet"),
        "eval_path": str(data / "eval.parquet"),
        "prompt_key": "question",
        "reward_fn": "rltrain.rewards.math:gsm8k",
        "system_prompt": "End with ####.",
        "params": {"num_train": 200, "num_eval": 10, "vocab_size": 320, "sft_steps": 2},
    }.items():
        setattr(run.task, k, v)
    run.model.path = str(data / "base_model")
    run.model.family = "qwen2"
    run.model.max_position_embeddings = 128  # a ~95-token prompt and 4 new tokens fit
    assert check_task(run) == []
    tok = build_tokenizer(run.model)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # loaded beside a Qwen2 config.json, as Qwen2's tokenizer: digits stay apart
    assert tok.convert_ids_to_tokens(tok("#### 7")["input_ids"]) == ["####", "Ġ", "7"]
    task = build_task(run.task, tok)
    assert len(task.train) == 200 and len(task.eval) == 10 and not task.eval_is_train
    ex = task.train[0]
    assert ex.prompt.startswith("<|im_start|>system\nEnd with ####.<|im_end|>\n<|im_start|>user\n")
    want = extract_hash_answer(ex.answer)
    assert task.reward(ex.prompt, f"so it is #### {want}") == 1.0
    run.model.tokenizer_path = str(tmp_path)  # the checkpoint's own tokenizer is the one
    assert any(
        "model.tokenizer_path=" in p and "set model.tokenizer_path=null" in p
        for p in check_task(run)
    )


def _fingerprint(root: pathlib.Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mtime_ns, p.read_bytes() if p.is_file() else sorted(os.listdir(p)))
    return out


def _users_files(root: pathlib.Path) -> tuple[str, str, str]:
    """A reader's checkpoint directory and Parquet files, none written by the generator."""
    import pyarrow as pa

    ckpt = root / "my-checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text('{"model_type": "qwen2"}')
    table = pa.table({"question": ["1+1?"], "answer": ["#### 2"]})
    for name in ("train.parquet", "test.parquet"):
        pq.write_table(table, root / name)
    return str(root / "train.parquet"), str(root / "test.parquet"), str(ckpt)


@pytest.mark.parametrize("dry_run", [True, False])
def test_what_the_generator_did_not_write_is_refused_before_anything_happens(tmp_path, dry_run):
    spec = Gsm8kTinySpec(num_train=50, num_eval=10, vocab_size=300, sft_steps=0)
    train, test, ckpt = _users_files(tmp_path / "mine")
    before = _fingerprint(tmp_path)
    with pytest.raises(ConfigError) as err:
        ensure_gsm8k_tiny(train, test, ckpt, spec, _tiny_model(), dry_run=dry_run)
    assert len(err.value.problems) == 3
    for key, path in (("model.path", ckpt), ("task.path", train), ("task.eval_path", test)):
        assert any(p.startswith(f"{key}={path!r} exists") for p in err.value.problems)
    assert all("set task.generate=null" in p for p in err.value.problems)
    assert _fingerprint(tmp_path) == before  # nothing written, replaced or deleted; no lock
    # one path of the user's among the generator's own fresh ones: still refused, untouched
    fresh = (str(tmp_path / "new/train.parquet"), str(tmp_path / "new/eval.parquet"))
    with pytest.raises(ConfigError, match=r"model.path=.*my-checkpoint' exists") as err:
        ensure_gsm8k_tiny(*fresh, ckpt, spec, _tiny_model(), dry_run=dry_run)
    assert len(err.value.problems) == 1
    assert _fingerprint(tmp_path) == before


def test_a_plan_writes_nothing_and_a_file_the_user_put_in_place_is_refused(tmp_path):
    spec = Gsm8kTinySpec(num_train=50, num_eval=10, vocab_size=300, sft_steps=0)
    paths = (str(tmp_path / "train.parquet"), str(tmp_path / "eval.parquet"), str(tmp_path / "m"))
    assert ensure_gsm8k_tiny(*paths, spec, _tiny_model(), dry_run=True) is True
    assert list(tmp_path.iterdir()) == []
    assert ensure_gsm8k_tiny(*paths, spec, _tiny_model()) is True
    assert ensure_gsm8k_tiny(*paths, spec, _tiny_model(), dry_run=True) is False
    # the generator's own files are rewritten when stale...
    assert ensure_gsm8k_tiny(*paths, dataclasses.replace(spec, num_train=40), _tiny_model())
    # ...but a file the user copied over one of them is the user's
    _users_files(tmp_path / "mine")
    os.replace(tmp_path / "mine" / "train.parquet", paths[0])
    before = _fingerprint(tmp_path)
    with pytest.raises(ConfigError, match=r"task.path=.*train.parquet' exists") as err:
        ensure_gsm8k_tiny(*paths, spec, _tiny_model())
    assert len(err.value.problems) == 1 and _fingerprint(tmp_path) == before


def test_files_of_a_cache_written_before_files_were_marked_are_the_generators(tmp_path):
    """A version-1 cache: its stamp names the data files it wrote (they carry no mark)."""
    import pyarrow as pa

    spec = Gsm8kTinySpec(num_train=50, num_eval=10, vocab_size=300, sft_steps=0)
    paths = (str(tmp_path / "train.parquet"), str(tmp_path / "eval.parquet"), str(tmp_path / "m"))
    for p in paths[:2]:
        pq.write_table(pa.table({"question": ["q"], "answer": ["#### 1"]}), p)
    os.mkdir(paths[2])
    stamp = {"generator": "gsm8k_tiny", "version": 1, "train_path": paths[0], "eval_path": paths[1]}
    (tmp_path / "m" / "generated_by_rltrain.json").write_text(json.dumps(stamp))
    assert ensure_gsm8k_tiny(*paths, spec, _tiny_model()) is True
    assert pq.read_table(paths[0]).num_rows == 50


def test_generated_paths_that_overlap_are_refused(tmp_path):
    run = RunConfig()
    run.task.name, run.task.generate = "jsonl", "gsm8k_tiny"
    run.task.path = run.task.eval_path = str(tmp_path / "data.parquet")
    run.model.path = str(tmp_path)
    problems = check_task(run)
    assert any("both are" in p and "give them different files" in p for p in problems)
    assert any("inside model.path=" in p for p in problems)
    assert list(tmp_path.iterdir()) == []


def test_tool_solutions_call_python_and_its_result_is_not_trained_on():
    """task.params.tool: the arithmetic of every solution is a python[...] call whose result is
    right; the result is the one piece not trained on."""
    train, _ = word_problems(Gsm8kTinySpec(num_train=300, num_eval=10, max_number=99, tool=True))
    for row in train:
        op, a, b = _operation(row["question"])
        found = re.search(r"python\[(\d+)([+-])(\d+)\]=(\d+);", row["answer"])
        assert found and found.groups()[:3] == (str(a), op, str(b)), row
        assert int(found.group(4)) == evaluate(f"{a}{op}{b}")
        assert extract_hash_answer(row["answer"]) == found.group(4)
    assert solution_pieces("Ava has python[3+4]=7; apples.\n#### 7") == [
        ("Ava has python[3+4]", True),
        ("=7;", False),
        (" apples.\n#### 7", True),
    ]
    plain = "Ava has 3 + 4 = 7 apples.\n#### 7"
    assert solution_pieces(plain) == [(plain, True)]  # without the tool: all learned


def test_the_tool_variant_has_its_own_stamp_and_its_demonstrations_masked(tmp_path):
    """A gsm8k_tiny cache is never taken for the tool variant (or back): the stamp records
    task.params.tool. The tool checkpoint's tokenizer has no token across a call's end, and
    its supervised demonstrations leave exactly the tool's results out of the loss."""
    from rltrain.tasks.gsm8k_tiny import _solution_ids

    paths = (str(tmp_path / "t.parquet"), str(tmp_path / "e.parquet"), str(tmp_path / "ckpt"))
    plain = Gsm8kTinySpec(num_train=200, num_eval=8, vocab_size=320, sft_steps=0, max_number=99)
    tool = dataclasses.replace(plain, tool=True)
    stamp = tmp_path / "ckpt" / "generated_by_rltrain.json"
    assert ensure_gsm8k_tiny(*paths, plain, _tiny_model())
    assert json.loads(stamp.read_text())["spec"]["tool"] is False
    assert ensure_gsm8k_tiny(*paths, tool, _tiny_model())  # not current: rewritten
    assert json.loads(stamp.read_text())["spec"]["tool"] is True
    assert not ensure_gsm8k_tiny(*paths, tool, _tiny_model())
    assert "python[" in pq.read_table(paths[0]).column("answer")[0].as_py()
    tok = build_tokenizer(ModelConfig(path=paths[2]))
    assert [t for t in tok.get_vocab() if "]" in t] == ["]"]
    ids, keep = _solution_ids(tok, "Ava has python[13+24]=37; apples.\n#### 37")
    masked = tok.decode([i for i, k in zip(ids, keep, strict=True) if not k])
    assert masked == "=37;"
    assert tok.decode(ids) == "Ava has python[13+24]=37; apples.\n#### 37"
    assert ensure_gsm8k_tiny(*paths, plain, _tiny_model())  # and back
