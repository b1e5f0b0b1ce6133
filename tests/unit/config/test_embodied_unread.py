"""An embodied run reads its policy network's width, depth and seed of the model section and
none of the language model's sampling, batching, KL or pi_old keys, nor the reasoning rollout's
modelled latencies, nor a prompt task's seed, data generator, text environment or tool keys; its
weights go through the host and it never fuses: each set away from its default is refused before
Ray, naming it (a run with them set trained bit for bit as one without)."""

from __future__ import annotations

import pytest
from composed import composed_run as load

from rltrain.errors import ConfigError


@pytest.mark.parametrize(
    "override",
    [
        "rollout.temperature=0.05",
        "rollout.top_p=0.1",
        "rollout.n_samples_per_prompt=4",
        "rollout.max_new_tokens=7",
        "model.dtype=bfloat16",
        "model.intermediate_size=32",
        "algorithm.norm_adv_by_std=false",
        "algorithm.loss_agg=seq_mean_token_sum",
        "actor.micro_batch_size=3",
        "trainer.train_batch_size=16",
        "algorithm.kl_estimator=k1",
        "algorithm.kl_in=reward",
        "algorithm.tis_cap=3",
        "simulate.rollout_latency_ms=5",
        "simulate.rollout_token_latency_ms=1",
        "weight_sync.transport=collective",
        "weight_sync.transport=ipc",
    ],
)
def test_a_language_model_key_on_the_embodied_runner_is_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.* is set but nothing reads it: runner="):
        load("experiment=cartpole_hybrid", override)


def test_the_policy_networks_own_keys_are_accepted():
    run = load("experiment=cartpole_hybrid", "model.hidden_size=32", "model.num_layers=3")
    assert (run.model.hidden_size, run.model.num_layers) == (32, 3)


def test_the_host_weight_transport_is_accepted():
    for transport in ("host", "auto"):
        run = load("experiment=cartpole_hybrid", f"weight_sync.transport={transport}")
        assert run.weight_sync.transport == transport


def test_fusing_is_refused_on_a_runner_that_never_fuses():
    with pytest.raises(
        ConfigError,
        match=r"placement.fuse='true' is set but nothing reads it: runner='embodied' never fuses",
    ):
        load("experiment=cartpole_collocated", "placement.fuse=true")
    assert load("experiment=cartpole_collocated", "placement.fuse=auto").placement.fuse == "auto"
    fused = load("placement=collocated", "placement.fuse=true")  # the reasoning runner fuses
    assert str(fused.placement.fuse).lower() == "true"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task.seed=5", r"task.seed=5 seeds a prompt task's data; .* from the run's seed"),
        ("task.generate=gsm8k_tiny", r"task.generate='gsm8k_tiny' writes a language task's data"),
        (
            "task.env=rltrain.tasks.calc_tool:CalculatorEnv",
            r"task.env='rltrain.tasks.calc_tool:CalculatorEnv' is a text environment",
        ),
        ("rollout.max_turns=3", r"rollout.max_turns=3 is set but nothing reads it: runner="),
        ("rollout.max_total_tokens=50", r"rollout.max_total_tokens=50 is set but nothing reads"),
        ("simulate.tool_latency_ms=5", r"simulate.tool_latency_ms=5.0 is set but nothing reads"),
        ("simulate.tool_failure_rate=0.1", r"simulate.tool_failure_rate=0.1 is set but nothing"),
        ("tools.pool_size=3", r"tools.pool_size=3 is set but nothing reads it: runner="),
    ],
)
def test_a_prompt_task_or_tool_key_on_the_embodied_runner_is_refused(override, message):
    # the environments and the policy's sampling are seeded from `seed`, and the runner runs
    # no text episodes: a run with these set trained exactly as one without
    with pytest.raises(ConfigError, match=message):
        load("experiment=cartpole_hybrid", override)


def test_the_run_seed_is_accepted_on_the_embodied_runner():
    assert load("experiment=cartpole_hybrid", "seed=5").seed == 5
