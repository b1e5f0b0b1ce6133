from __future__ import annotations

import pytest

from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.placement.sizes import derive_sizes


def run_with(batch: int, n: int, minibatches: int = 1, micro: int = 64) -> RunConfig:
    run = RunConfig()
    run.trainer.train_batch_size = batch
    run.rollout.n_samples_per_prompt = n
    run.algorithm.num_minibatches = minibatches
    run.actor.micro_batch_size = micro
    return run


def test_sizes_by_hand():
    # 8 prompts x 16 samples = 128; 2 rollout ranks get 4 prompts each; 2 actor ranks get 64
    # samples each, 2 minibatches of 32, micro batch capped at 32.
    s = derive_sizes(run_with(8, 16, minibatches=2), actor_world=2, rollout_world=2)
    assert (s.samples_per_step, s.prompts_per_rollout_rank, s.samples_per_actor_rank) == (
        128,
        4,
        64,
    )
    assert (s.samples_per_minibatch, s.micro_batch) == (32, 32)


def test_batch_not_divisible_by_rollout_dp_names_key_and_suggests_a_value():
    with pytest.raises(ConfigError) as info:
        derive_sizes(run_with(6, 16), actor_world=1, rollout_world=4)
    assert "trainer.train_batch_size=6" in str(info.value)
    assert "e.g. 8" in str(info.value)


def test_samples_not_divisible_by_actor_dp_x_minibatches():
    with pytest.raises(ConfigError, match="algorithm.num_minibatches"):
        derive_sizes(run_with(3, 3, minibatches=2), actor_world=1, rollout_world=1)
