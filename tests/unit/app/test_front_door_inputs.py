"""Inputs that used to reach Ray (or were accepted and ignored), refused or made to work before
it starts: each message names the key, the value and the fix.

Every case goes through :func:`rltrain.app.run` in a process where starting a cluster fails the
test (the ``no_ray`` fixture of test_front_door), as training unless it says otherwise.
"""

from __future__ import annotations

import json
import logging
import pathlib

import pytest
from model_configs import QWEN25_05B, TINY_LLAMA
from test_front_door import compose_config, no_ray  # noqa: F401 - the fixture

from rltrain.config import load_config
from rltrain.errors import ConfigError, RltrainError


def refused(*overrides: str) -> str:
    """The message of a run refused before Ray (the test fails if Ray starts)."""
    from rltrain.app import run

    with pytest.raises(RltrainError) as info:
        run(compose_config(*overrides))
    return str(info.value)


def checkpoint(path: pathlib.Path, config: dict, weights: bool = True) -> str:
    """A Hugging Face checkpoint directory: config.json and (optionally) a weights file."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        from safetensors.torch import save_file
        from torch import zeros

        save_file({"w": zeros(1)}, str(path / "model.safetensors"))
    return str(path)


def tiny_lm(path: pathlib.Path, head: str = "LlamaForCausalLM", weights: bool = True) -> str:
    config = {"architectures": [head], **TINY_LLAMA, "vocab_size": 32}
    return checkpoint(path, config, weights)


def rows(path: pathlib.Path, *records: dict) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


# ------------------------------------------------------------------- item 2: task.path alone
def test_a_data_file_without_task_name_jsonl_is_refused(no_ray):  # noqa: F811
    data = rows(no_ray / "d.jsonl", {"prompt": "1+1=", "answer": "2"})
    text = refused(f"task.path={data}")
    assert f"task.path='{data}'" in text and "task.name=jsonl" in text


# ------------------------------------------------------------------------- item 3: the reward
def test_a_reward_that_cannot_take_the_arguments_is_refused(no_ray):  # noqa: F811
    text = refused("task.reward_fn=builtins:len")
    assert "task.reward_fn='builtins:len'" in text and "(prompt, response, answer)" in text


def test_a_reward_the_tokenizer_cannot_earn_is_refused(no_ray):  # noqa: F811
    # the built-in tokenizer has no '#', and gsm8k pays only for '#### n'
    text = refused("task.reward_fn=rltrain.rewards.math:gsm8k")
    assert "rltrain.rewards.math:gsm8k" in text and "'#'" in text and "vocab_chars" in text


def char_tokenizer(path: pathlib.Path) -> str:
    """A saved character tokenizer that can write every printable ASCII character."""
    import string

    from rltrain.tasks import build_char_tokenizer

    build_char_tokenizer("".join(dict.fromkeys(string.printable[:95]))).save_pretrained(str(path))
    return str(path)


def test_a_reward_that_reads_another_answer_format_is_refused(no_ray):  # noqa: F811
    data = rows(
        no_ray / "d.jsonl",
        *({"prompt": f"{a}+1=", "answer": f"{a} plus 1 is {a + 1} #### {a + 1}"} for a in range(4)),
    )
    text = refused(
        "task.name=jsonl",
        f"task.path={data}",
        "task.reward_fn=rltrain.rewards.math:boxed",
        f"model.tokenizer_path={char_tokenizer(no_ray / 'tok')}",
        "rollout.max_new_tokens=24",
    )
    assert "rltrain.rewards.math:boxed" in text and "pays nothing" in text
    assert "rltrain.rewards.math:gsm8k" in text  # the reward that reads these answers


def never_pays(prompt: str, response: str, answer: str) -> float:
    """A user's reward with its own convention (used by the next test)."""
    return 1.0 if response.startswith("ANSWER:") else 0.0


def test_a_users_reward_that_never_pays_is_a_warning(no_ray, caplog):  # noqa: F811
    from rltrain.config.validate import check_config
    from rltrain.runners.layout import preflight

    run, problems = check_config(
        compose_config("mode=plan", "task.reward_fn=test_front_door_inputs:never_pays")
    )
    assert problems == []
    with caplog.at_level(logging.WARNING, logger="rltrain"):
        preflight(run, str(no_ray))
    assert "pays nothing" in caplog.text and "never_pays" in caplog.text


# ------------------------------------------------------------- item 5: RLinf's offload keys
def test_rlinf_offload_spelling_needs_no_plus():
    run = load_config(compose_config("placement.offload.actor.offload_weight=true"))
    from rltrain.config import resolve_offload

    policy = resolve_offload(run.placement.offload["actor"], "placement.offload.actor")
    assert policy.states == frozenset({"weights"}) and policy.when == "on_demand"


def test_an_empty_offload_mapping_clears_the_shipped_policies():
    from rltrain.config.overrides import apply_empty_mappings

    cfg = compose_config("placement.offload={}")
    assert cfg.placement.offload  # Hydra's merge keeps the shipped policies ...
    assert apply_empty_mappings(cfg, ["placement.offload={}"]) == ["placement.offload"]
    assert load_config(cfg).placement.offload == {}  # ... the command line empties them


# ----------------------------------------------------------- item 6: found only after Ray
def test_an_unwritable_checkpoint_dir_is_refused(no_ray):  # noqa: F811
    text = refused("trainer.checkpoint_dir=/proc/rltrain-no-such/ckpt")
    assert "trainer.checkpoint_dir='/proc/rltrain-no-such/ckpt'" in text
    assert "writable" in text


def test_a_checkpoint_uri_without_its_filesystem_is_refused(no_ray):  # noqa: F811
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed here")
    text = refused("trainer.checkpoint_dir=s3://bucket/ckpt")
    assert "trainer.checkpoint_dir='s3://bucket/ckpt'" in text and "pip install s3fs" in text


def test_a_checkpoint_without_weights_is_refused_for_training(no_ray):  # noqa: F811
    path = tiny_lm(no_ray / "ckpt", weights=False)
    text = refused(f"model.path={path}")
    assert f"model.path='{path}'" in text and "no weights" in text


def test_a_classifier_as_the_policy_is_refused(no_ray):  # noqa: F811
    path = tiny_lm(no_ray / "rm", head="LlamaForSequenceClassification")
    text = refused(f"model.path={path}")
    assert "not a causal language model" in text and "reward.model_path" in text


@pytest.mark.parametrize("kind", ["causal LM", "corrupt config"])
def test_a_reward_model_that_is_not_one_is_refused(no_ray, kind):  # noqa: F811
    path = tiny_lm(no_ray / "rm")
    if kind == "corrupt config":
        (no_ray / "rm" / "config.json").write_text('{"architectures": [')
    text = refused("reward.kind=model", f"reward.model_path={path}")
    assert f"reward.model_path='{path}'" in text
    assert ("not a sequence-classification" if kind == "causal LM" else "not valid JSON") in text


def test_an_unwritable_profile_cache_is_refused(no_ray):  # noqa: F811
    text = refused("placement=auto", "placement.auto.cache_dir=/proc/rltrain-no-such")
    assert "placement.auto.cache_dir='/proc/rltrain-no-such'" in text


def test_resuming_at_the_last_step_is_refused_before_ray(no_ray):  # noqa: F811
    from rltrain.runners.checkpoint import CheckpointManager, model_fingerprint

    run = load_config(compose_config())
    manager = CheckpointManager(str(no_ray / "ck"))
    path = manager.commit(manager.begin(10), {"model": model_fingerprint(run)})
    text = refused(f"trainer.resume={path}", "trainer.total_steps=10")
    assert "at step 10" in text and "trainer.total_steps=10" in text
    assert "raise trainer.total_steps" in text.lower()


# ------------------------------------------------------------- item 8: real-model defaults
def test_the_dtype_follows_the_checkpoint(tmp_path):
    path = checkpoint(tmp_path / "q", QWEN25_05B, weights=False)
    assert load_config(compose_config(f"model.path={path}")).model.dtype == "bfloat16"
    set_here = compose_config(f"model.path={path}", "model.dtype=float32")
    assert load_config(set_here).model.dtype == "float32"
    assert load_config(compose_config()).model.dtype == "float32"  # built from the fields


def test_a_real_model_with_default_micro_batches_fits_where_a_setting_does(no_ray, capsys):  # noqa: F811
    from rltrain.app import run

    path = checkpoint(no_ray / "q", QWEN25_05B, weights=False)
    char_tokenizer(no_ray / "q")  # its tokenizer beside it (the plan reads only config.json)
    real = (
        f"model.path={path}",
        "cluster.devices_per_node=1",
        "cluster.device_memory_gib=80",
        "task.max_prompt_length=512",
        "rollout.max_new_tokens=1024",
    )
    run(compose_config("mode=plan", *real))  # no ResourceError
    out = capsys.readouterr().out
    assert "actor.micro_batch_size=" in out and "largest that fits" in out


def test_the_tiny_default_keeps_its_micro_batch():
    from rltrain.runners.layout import decide_for_user

    run, notes = decide_for_user(load_config(compose_config()))
    assert run.actor.micro_batch_size == 64  # 8 prompts x 16 samples over 2 actor ranks
    assert notes == [
        "micro-batches chosen by the plan (the largest that fits; set a key to fix it): "
        "actor.micro_batch_size=64"
    ]


def test_a_reward_model_on_no_device_is_said(no_ray, capsys):  # noqa: F811
    from rltrain.app import run

    path = tiny_lm(no_ray / "rm", head="LlamaForSequenceClassification")
    run(compose_config("mode=plan", "reward.kind=model", f"reward.model_path={path}"))
    out = capsys.readouterr().out
    assert "runs on the CPU" in out and "placement.component_placement.reward=0" in out


# ------------------------------------------------------ item 9: off features, rows, counts
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor.lora.rank=100000", "actor.lora.rank=100000"),
        ("actor.lora.alpha=-1", "actor.lora.alpha"),  # LoRA off: still checked
        ("placement.auto.profile_steps=1", "placement.auto.profile_steps"),  # not auto
        ("task.num_train=26", "task.num_train=26"),  # the arithmetic task has 25 prompts
    ],
)
def test_values_of_features_that_are_off_and_counts_are_checked(override, key, no_ray):  # noqa: F811
    assert key in refused(override)


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ({"prompt": "  ", "answer": "2"}, "the prompt ('prompt') is empty"),
        ({"prompt": "1+1=", "answer": ""}, "the answer ('answer') is empty"),
        ({"prompt": [{"role": "narrator", "content": "1+1="}], "answer": "2"}, "['narrator']"),
    ],
)
def test_empty_rows_and_unknown_roles_are_refused(record, words, no_ray):  # noqa: F811
    data = rows(no_ray / "d.jsonl", {"prompt": "2+2=", "answer": "4"}, record)
    text = refused("task.name=jsonl", f"task.path={data}", "task.chat_template=null")
    assert words in text and "line 2" in text


# --------------------------------------------------------------------- item 10: messages
def test_no_devices_is_blamed_on_the_cluster_key():
    with pytest.raises(ConfigError) as info:
        load_config(compose_config("cluster.devices_per_node=0"))
    assert "cluster.devices_per_node=0" in str(info.value)
    assert "at least 1" in str(info.value)


def test_a_config_problem_comes_with_the_layouts_problems(no_ray):  # noqa: F811
    text = refused("trainer.train_batch_size=3", "placement.auto.profile_steps=1")
    assert "trainer.train_batch_size=3" in text and "placement.auto.profile_steps=1" in text


def test_a_job_takes_only_the_chosen_micro_batches_from_its_layout():
    import dataclasses

    from rltrain.placement.micro_batches import adopt_micro_batches
    from rltrain.runners.layout import decide_for_user

    decided, _ = decide_for_user(load_config(compose_config()))
    restart = load_config(compose_config())
    restart.trainer = dataclasses.replace(restart.trainer, resume="/ckpt/step-000004")
    run = adopt_micro_batches(restart, decided)
    assert run.actor.micro_batch_size == 64  # the plan's choice ...
    assert run.trainer.resume == "/ckpt/step-000004"  # ... and nothing else of the layout's
