"""The vLLM engine's lengths, temperatures, per-prompt seeds and sleep, without vLLM or a GPU
(tests/vllm_contract holds each against vLLM 0.26.0's own code)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from composed import composed_run as load
from model_configs import TINY_LLAMA

from rltrain.backends.vllm_rollout import (
    VllmRollout,
    VllmSettings,
    check_plan_memory,
    prompt_sampling_kwargs,
    vllm_settings,
)
from rltrain.config import engine_checks
from rltrain.config.schema import RunConfig
from rltrain.config.seeds import SEED_SPACE, prompt_seed, sampling_seed
from rltrain.errors import ConfigError
from rltrain.kinds.vllm import length_problems, vllm_context


@pytest.fixture
def vllm_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with GPUs and vLLM, as the config checks see it."""
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: True)
    monkeypatch.setattr(engine_checks, "package_installed", lambda name: True)


def problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    return str(info.value)


# ------------------------------------------------------------------------------------ lengths
def test_an_engine_longer_than_the_models_context_is_refused(vllm_machine) -> None:
    # the built model's context is 64 tokens (model.max_position_embeddings)
    text = problems("rollout.backend=vllm", "rollout.max_model_len=100000")
    assert "rollout.max_model_len=100000 is longer than the model's context" in text
    assert "model.max_position_embeddings=64" in text and "rollout.max_model_len <= 64" in text
    assert "rollout.max_model_len=65 is longer" in problems(
        "rollout.backend=vllm", "rollout.max_model_len=65"
    )
    assert load("rollout.backend=vllm", "rollout.max_model_len=64").rollout.max_model_len == 64
    # below task.max_prompt_length + rollout.max_new_tokens, capped at the context (64)
    text = problems("rollout.backend=vllm", "rollout.max_model_len=63")
    assert (
        "rollout.max_model_len=63 is shorter" in text
        and "capped at the model's context, 64" in text
    )


def test_a_null_engine_length_is_capped_at_the_context_as_the_plan_is(vllm_machine) -> None:
    run = load("rollout.backend=vllm")
    assert run.task.max_prompt_length + run.rollout.max_new_tokens > 64
    assert vllm_settings(run, "/models/policy", (1,)).max_model_len == 64
    run = load("rollout.backend=vllm", "task.max_prompt_length=16", "rollout.max_new_tokens=8")
    assert vllm_settings(run, "/models/policy", (1,)).max_model_len == 24


def _checkpoint(path, context: int) -> str:
    config = {**TINY_LLAMA, "max_position_embeddings": context}
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_a_checkpoints_context_is_read_from_its_config_json(tmp_path) -> None:
    run = RunConfig()
    run.rollout.backend = "vllm"
    run.model.path = str(tmp_path)
    assert vllm_context(run) is None  # not written yet (task.generate): checked before Ray
    _checkpoint(tmp_path, 128)
    assert vllm_context(run) == (
        128,
        f"max_position_embeddings=128 in model.path={tmp_path}/config.json",
    )
    run.rollout.max_model_len = 200
    [text] = length_problems(run, vllm_context(run))
    assert "rollout.max_model_len=200 is longer than the model's context" in text
    # the pre-Ray check reads it too (a checkpoint task.generate wrote after the config check)
    plan = SimpleNamespace(by_component={}, memory={})
    with pytest.raises(ConfigError, match="rollout.max_model_len=200 is longer"):
        check_plan_memory(run, plan)
    run.rollout.max_model_len = 128
    check_plan_memory(run, plan)


# ------------------------------------------------------------------------------- temperature
def test_a_temperature_above_two_is_refused(vllm_machine) -> None:
    text = problems("rollout.backend=vllm", "rollout.temperature=2.5")
    assert "rollout.temperature=2.5: vLLM 0.26 refuses a temperature above 2.0" in text
    assert "rollout.temperature <= 2.0, or rollout.backend=torch" in text
    assert load("rollout.backend=vllm", "rollout.temperature=2.0").rollout.temperature == 2.0
    assert load("rollout.temperature=2.5").rollout.temperature == 2.5  # the torch engine


# ------------------------------------------------------------------------------------- seeds
def test_prompt_seeds_by_hand() -> None:
    # n=1: no sample bits; the key is seed * 2**16 + prompt modulo 2**32, then mixed
    key = (1 << 16) + 2
    mask = 2**32 - 1
    v = (key * 0x9E3779B1) & mask
    v ^= v >> 16
    assert prompt_seed(1, 2, 1) == (v * 0x85EBCA6B) & mask
    # n=4: two sample bits, 30 mixed bits above them
    mask = 2**30 - 1
    v = (key * 0x9E3779B1) & mask
    v ^= v >> 15
    assert prompt_seed(1, 2, 4) == ((v * 0x85EBCA6B) & mask) << 2


@pytest.mark.parametrize("n", [1, 3, 4, 16, 64])
def test_no_two_samples_of_a_step_share_a_seed_across_prompts_and_ranks(n: int) -> None:
    for run_seed in (0, 42, SEED_SPACE - 1):
        seen: set[int] = set()
        ranks, prompts = 8, 300
        for rank in range(ranks):
            call = sampling_seed(run_seed, 7, rank)
            for p in range(prompts):
                first = prompt_seed(call, p, n)
                assert 0 <= first and first + n - 1 < SEED_SPACE
                seen.update(first + i for i in range(n))  # vLLM's child seeds
        assert len(seen) == ranks * prompts * n
    assert prompt_seed(5, 3, 4) == prompt_seed(5, 3, 4)  # deterministic


def test_each_prompt_of_a_call_gets_its_own_seed() -> None:
    common = dict(n=4, temperature=1.0, top_p=1.0, max_new_tokens=8, logprobs=True)
    kwargs = prompt_sampling_kwargs(3, seed=11, stop_token_ids=(1,), **common)
    assert [k["seed"] for k in kwargs] == [prompt_seed(11, i, 4) for i in range(3)]
    assert all(k["n"] == 4 and k["stop_token_ids"] == [1] for k in kwargs)
    greedy = prompt_sampling_kwargs(2, seed=None, stop_token_ids=(), **common)
    assert [k["seed"] for k in greedy] == [None, None]


class _Llm:
    """What :class:`VllmRollout` calls on vLLM's ``LLM``, recorded; sleep and wake keep vLLM's
    executor's rule (``sleep`` is ignored while any tag still sleeps)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.sleeping: set[str] = set()

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))
        if not self.sleeping:
            self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str]) -> None:
        self.calls.append(("wake_up", tuple(tags)))
        self.sleeping -= set(tags)

    def generate(self, prompts, params, use_tqdm: bool):
        self.calls.append(("generate", prompts, params))
        out = SimpleNamespace(token_ids=[3], logprobs=None, finish_reason="stop")
        return [SimpleNamespace(outputs=[out] * p["n"]) for p in params]


def _rollout(llm: _Llm) -> VllmRollout:
    rollout = object.__new__(VllmRollout)
    rollout.settings, rollout.llm = VllmSettings(model_path="/m", sleep_level=1), llm
    rollout._vllm = SimpleNamespace(SamplingParams=lambda **kw: kw)
    rollout.asleep = rollout.weights_asleep = False
    return rollout


def test_generate_hands_vllm_one_sampling_params_per_prompt() -> None:
    llm = _Llm()
    outs = _rollout(llm).generate(
        [[5, 6], [7, 8]], n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=9
    )
    assert [len(o) for o in outs] == [2, 2]
    _, _, params = llm.calls[-1]
    assert [p["seed"] for p in params] == [prompt_seed(9, 0, 2), prompt_seed(9, 1, 2)]


# ------------------------------------------------------------------------------------- sleep
def test_weights_woken_alone_go_back_to_sleep() -> None:
    llm = _Llm()
    rollout = _rollout(llm)
    rollout.sleep()
    assert llm.sleeping == {"weights", "kv_cache"}
    rollout.wake_weights()  # a weight load without a generate (an evaluation's catch-up)
    assert llm.sleeping == {"kv_cache"}
    llm.calls.clear()
    rollout.sleep()
    # the KV cache is woken so that vLLM sleeps at all: the weights leave
    assert llm.calls == [("wake_up", ("kv_cache",)), ("sleep", 1)]
    assert llm.sleeping == {"weights", "kv_cache"} and rollout.weights_asleep and rollout.asleep
    llm.calls.clear()
    rollout.sleep()  # all asleep already: nothing to do
    assert llm.calls == []


def test_a_rope_scaled_checkpoint_leaves_its_length_to_vllm(tmp_path) -> None:
    # vLLM multiplies the context by a yarn/linear factor: rltrain does not refuse what it takes
    run = RunConfig()
    run.rollout.backend = "vllm"
    run.model.path = str(tmp_path)
    config = {**TINY_LLAMA, "max_position_embeddings": 128}
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    for scaled in ({"rope_scaling": yarn}, {"rope_parameters": yarn}):
        (tmp_path / "config.json").write_text(json.dumps({**config, **scaled}))
        assert vllm_context(run) is None
    # transformers 5 writes default rope parameters for every model: no scaling there
    plain = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    (tmp_path / "config.json").write_text(json.dumps({**config, **plain}))
    assert vllm_context(run) == (
        128,
        f"max_position_embeddings=128 in model.path={tmp_path}/config.json",
    )
