"""Bad RL-core input is refused by the config checks, before anything starts."""

from __future__ import annotations

import pytest

from rltrain.config import load_config
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError


def _run(**sections) -> RunConfig:
    run = RunConfig()
    run.placement.component_placement = {"actor,rollout": "all"}
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        setattr(getattr(run, section), key, value)
    return run


def test_defaults_pass():
    assert load_config(_run()).algorithm.advantage_estimator == "grpo"


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_group_estimator_with_one_sample_is_refused(estimator):
    run = _run(algorithm__advantage_estimator=estimator, rollout__n_samples_per_prompt=1)
    with pytest.raises(ConfigError, match="rollout.n_samples_per_prompt=1"):
        load_config(run)
    run = _run(algorithm__advantage_estimator="reinforce_pp", rollout__n_samples_per_prompt=1)
    assert load_config(run)


def test_reward_fn_that_cannot_be_imported_is_refused():
    with pytest.raises(ConfigError, match="task.reward_fn='no_such_module_x:f'.*cannot import"):
        load_config(_run(task__reward_fn="no_such_module_x:f"))
    with pytest.raises(ConfigError, match="has no callable 'nope'"):
        load_config(_run(task__reward_fn="os.path:nope"))
    assert load_config(_run(task__reward_fn="rltrain.tasks.base:exact_match"))


def test_model_path_and_dr_grpo_aggregation():
    with pytest.raises(ConfigError, match="model.path='/no/such/ckpt' does not exist"):
        load_config(_run(model__path="/no/such/ckpt"))
    assert load_config(_run(algorithm__loss_agg="seq_mean_token_sum_norm"))
