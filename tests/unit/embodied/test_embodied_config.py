"""The cartpole presets compose into valid plans at any device count; sizes and checks refuse
what the embodied runner cannot run, naming the keys (no Ray)."""

from __future__ import annotations

import pytest
from composed import composed_run as compose_run

from rltrain.errors import ConfigError
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.runners.embodied import check_components, derive_sizes, run_embodied

PRESETS = ("cartpole_collocated", "cartpole_disaggregated", "cartpole_hybrid")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("devices", [2, 8])
def test_presets_plan_their_mode_on_any_device_count(preset, devices):
    run = compose_run(f"experiment={preset}", f"cluster.devices_per_node={devices}")
    assert run.runner == "embodied" and run.task.env_id == "CartPole-v1"
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert plan.mode.value == preset.split("_")[1]
    assert set(plan.components) == {"actor", "rollout", "env"}
    check_components(run, set(plan.components))
    env = plan.placements("env")
    if preset == "cartpole_hybrid":
        # the seeds' layout: env and rollout on their own devices, the actor on all of them
        assert [p.device_ids for p in env] == [(0,)]
        assert plan.world_size("actor") == devices
    else:
        assert all(not p.device_ids for p in env)  # simulators need no accelerator
    sizes = derive_sizes(
        run, plan.world_size("env"), plan.world_size("rollout"), plan.world_size("actor")
    )
    assert sizes.env_steps_per_epoch == run.env.num_envs * run.env.rollout_steps


def test_the_seed_sets_the_initialisation():
    assert compose_run("experiment=cartpole_hybrid", "seed=7").model.init_seed == 7


def test_reasoning_placements_are_untouched_by_the_presets():
    run = compose_run("placement=hybrid")
    assert run.runner == "reasoning" and "env" not in run.placement.component_placement


def test_sizes_refuse_environments_that_do_not_split_over_processes_and_stages():
    run = compose_run("experiment=cartpole_hybrid", "env.num_envs=6", "env.pipeline_stage_num=2")
    with pytest.raises(ConfigError) as err:
        derive_sizes(run, env_world=2, rollout_world=1, actor_world=2)
    text = str(err.value)
    assert "env.num_envs=6" in text and "env.pipeline_stage_num=2" in text
    assert "env.num_envs=4" in text  # the nearest valid value


def test_sizes_refuse_minibatches_that_do_not_split_over_actor_ranks():
    run = compose_run(
        "experiment=cartpole_hybrid",
        "env.num_envs=2",
        "env.rollout_steps=3",
        "algorithm.num_minibatches=4",
    )
    with pytest.raises(ConfigError, match="algorithm.num_minibatches=4"):
        derive_sizes(run, env_world=1, rollout_world=1, actor_world=2)


def test_sizes_count_items_per_rollout_rank():
    run = compose_run("experiment=cartpole_hybrid", "env.num_envs=8", "env.rollout_steps=10")
    sizes = derive_sizes(run, env_world=1, rollout_world=2, actor_world=2)
    assert sizes.envs_per_stage == 4 and sizes.items_per_rollout == (10, 10)
    sizes = derive_sizes(run, env_world=2, rollout_world=1, actor_world=1)
    assert sizes.envs_per_stage == 2 and sizes.items_per_rollout == (40,)


def test_config_checks_name_the_env_keys():
    with pytest.raises(ConfigError) as err:
        compose_run(
            "experiment=cartpole_hybrid",
            "env.num_envs=5",
            "simulate.env_policy_latency_ms=-1",
            "env.lr_final_fraction=2",
        )
    text = str(err.value)
    assert "env.num_envs=5 is not divisible by env.pipeline_stage_num=2" in text
    assert "simulate.env_policy_latency_ms=-1" in text and "env.lr_final_fraction=2" in text


def test_components_the_runner_cannot_use_are_refused_before_ray(tmp_path):
    run = compose_run(
        "experiment=cartpole_hybrid",
        "+placement.component_placement.reward={node_group: node, placement: '0'}",
    )
    with pytest.raises(ConfigError, match="reward"):
        run_embodied(run, str(tmp_path))
    run = compose_run("experiment=cartpole_hybrid", "algorithm.advantage_estimator=grpo")
    with pytest.raises(ConfigError, match="advantage_estimator='grpo'"):
        run_embodied(run, str(tmp_path))
