"""Every shipped config composes and validates; bad input gets a message naming the key."""

from __future__ import annotations

import pathlib

import pytest
from composed import composed as compose_run

from rltrain.config import load_config, resolve_offload
from rltrain.config.schema import OffloadPolicyConfig, RunConfig
from rltrain.errors import ConfigError

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"
SHIPPED = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))


def test_primary_config_validates():
    run = load_config(compose_run())
    assert isinstance(run, RunConfig)
    assert run.placement.mode == "collocated"


@pytest.mark.parametrize(("group", "name"), SHIPPED, ids=[f"{g}/{n}" for g, n in SHIPPED])
def test_every_shipped_config_composes(group: str, name: str):
    run = load_config(compose_run(f"{group}={name}"))
    assert isinstance(run, RunConfig)


def test_problems_are_collected_and_name_their_keys():
    cfg = compose_run(
        "rollout.n_samples_per_prompt=1", "model.hidden_size=63", "trainer.total_steps=0"
    )
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    text = str(info.value)
    assert len(info.value.problems) == 3
    for key in ("rollout.n_samples_per_prompt", "model.hidden_size", "trainer.total_steps"):
        assert key in text


def test_missing_required_key_is_named():
    with pytest.raises(ConfigError, match="placement.component_placement"):
        load_config({"placement": {}})


def test_unknown_component_is_named():
    with pytest.raises(ConfigError, match="'actr'"):
        load_config(compose_run("+placement.component_placement.actr=0"))


def test_model_path_must_be_a_checkpoint(tmp_path: pathlib.Path):
    with pytest.raises(ConfigError, match="config.json"):
        load_config(compose_run(f"model.path={tmp_path}"))


def test_gae_without_critic_is_refused():
    with pytest.raises(ConfigError, match="critic"):
        load_config(compose_run("algorithm.advantage_estimator=gae"))


# ------------------------------------------------------------------ offload policy (hand-computed)
def test_offload_default_is_never():
    p = resolve_offload(OffloadPolicyConfig(), "k")
    assert p.when == "never" and not p.enabled and p.states == frozenset()


def test_rlinf_aliases_select_exactly_the_flagged_states():
    p = resolve_offload(
        OffloadPolicyConfig(offload_optimizer=True, offload_weight=False), "placement.offload.a"
    )
    assert p.when == "after_stage"
    assert p.states == frozenset({"optimizer", "kv_cache"})  # kv_cache kept from `states`
    assert p.may_offload("optimizer") and not p.may_offload("weights")


def test_enable_offload_means_after_every_stage_whatever_when_was():
    assert resolve_offload(OffloadPolicyConfig(enable_offload=True), "k").when == "after_stage"
    # the shipped policies are on_demand: enable_offload=true there must change something
    p = resolve_offload(OffloadPolicyConfig(enable_offload=True, when="on_demand"), "k")
    assert p.when == "after_stage"
    # the state aliases alone keep on_demand: they choose what may leave, not when
    p = resolve_offload(OffloadPolicyConfig(offload_weight=True, when="on_demand"), "k")
    assert p.when == "on_demand" and p.states == frozenset({"weights", "kv_cache"})


def test_contradicting_aliases_and_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="placement.offload.actor.enable_offload"):
        resolve_offload(
            OffloadPolicyConfig(enable_offload=False, when="after_stage"), "placement.offload.actor"
        )
    with pytest.raises(ConfigError) as info:
        resolve_offload(OffloadPolicyConfig(when="sometimes", states=["ram"]), "x")
    assert len(info.value.problems) == 2


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algorithm.policy_loss=nope"], "algorithm.policy_loss='nope' is not valid"),
        (
            ["algorithm.filter_groups=true", "algorithm=ppo"],
            "algorithm.filter_groups=true with algorithm.advantage_estimator='gae'",
        ),
        (
            ["algorithm.filter_groups=true", "trainer.max_staleness=1"],
            "set trainer.max_staleness=0",
        ),
        (["algorithm.filter_groups=true", "placement.fuse=true"], "placement.fuse=false or auto"),
        (["algorithm.overlong_buffer=5"], "algorithm.overlong_buffer=5 must be in [0, 4]"),
        (["algorithm.max_generation_batches=0"], "algorithm.max_generation_batches=0 must be > 0"),
        (
            ["algorithm.overlong_buffer=2", "task.env=rltrain.tasks.calc_tool:CalculatorEnv"],
            "a multi-turn episode's response holds every turn and tool result; set "
            "algorithm.overlong_buffer=0",
        ),
        (
            ["experiment=cartpole_collocated", "algorithm.mask_truncated=true"],
            "algorithm.mask_truncated shape token responses",
        ),
        (
            ["experiment=cartpole_disaggregated", "trainer.max_staleness=3"],
            "trainer.max_staleness=3 with runner='embodied': its steps are synchronous",
        ),
        (
            ["experiment=cartpole_hybrid", "trainer.target_accuracy=0.5"],
            "not on accuracy; set trainer.target_accuracy=null",
        ),
    ],
)
def test_algorithm_shaping_keys_are_refused_with_the_fix(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    assert expected in str(err.value)


def test_presets_name_their_algorithms():
    gspo = load_config(compose_run("algorithm=gspo")).algorithm
    assert (gspo.policy_loss, gspo.clip_low, gspo.clip_high) == ("gspo", 3e-4, 4e-4)
    dapo = load_config(compose_run("algorithm=dapo")).algorithm
    assert (dapo.filter_groups, dapo.mask_truncated, dapo.clip_high) == (True, True, 0.28)


def test_a_tracker_not_installed_is_refused_with_the_config(monkeypatch):
    # Checked with the config, so a sweep's launcher and placement=auto refuse it before they
    # start Ray or profile; a plan logs nothing and needs none.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError) as err:
        load_config(compose_run("logging.wandb=true"))
    assert "logging.wandb=true but wandb is not installed: pip install 'rltrain[track]'" in str(
        err.value
    )
    assert load_config(compose_run("logging.wandb=true", "mode=plan")).logging.wandb


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["task.path=/tmp/x.jsonl"], "task.path='/tmp/x.jsonl' is read by task.name=jsonl"),
        (
            ["task.prompt_key=q"],
            "task.name='arithmetic' has none: add task.name=jsonl task.path=..., or drop "
            "task.prompt_key",
        ),
        (
            ["experiment=cartpole_hybrid", "task.prompt_key=q"],
            "task.name='gym' has none: drop task.prompt_key",
        ),
        (
            ["experiment=cartpole_hybrid", "task.num_train=5"],
            "task.num_train=5 sizes a prompt task; task.name='gym' runs an environment",
        ),
        (
            ["task.env_id=Acrobot-v1"],
            "task.name='arithmetic' has none: drop task.env_id",
        ),
        (
            ["task.name=jsonl", "task.max_operand=9"],
            "task.max_operand=9 sizes the built-in arithmetic task",
        ),
        (  # with task.env_id's problem too, still reported
            ["task.name=jsonl", "task.max_operand=9", "task.env_id=Acrobot-v1"],
            "task.max_operand=9 sizes the built-in arithmetic task",
        ),
    ],
)
def test_task_keys_the_task_would_not_read_are_refused(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["algorithm.overlong_penalty=0.5"],
            "algorithm.overlong_penalty=0.5 is set but nothing reads it: the penalty applies "
            "over algorithm.overlong_buffer tokens, which is 0",
        ),
        (["algorithm.max_generation_batches=8"], "algorithm.filter_groups=true or drop it"),
        (["actor.lora.alpha=32"], "actor.lora.alpha=32.0 is set but nothing reads it"),
        (["critic.lr=0.01"], "critic.lr=0.01 is set but nothing reads it: no critic is placed"),
        (
            ["experiment=cartpole_hybrid", "critic.lr=0.01"],
            "trains its value head in the actor, at optimizer.lr: drop it",
        ),
        (["algorithm.gamma=0.9"], "'grpo' scores whole responses"),
        (["algorithm=reinforce_pp", "algorithm.lam=0.9"], "it is read only by gae"),
        (["env.num_envs=8"], "env.num_envs=8 is set but nothing reads it"),
    ],
)
def test_keys_nothing_would_read_are_refused(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(compose_run(*overrides))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm=dapo"],  # overlong_penalty and max_generation_batches with their keys on
        ["algorithm=ppo", "algorithm.lam=0.95", "critic.lr=0.01"],
        ["algorithm=reinforce_pp", "algorithm.gamma=0.99"],
        ["actor.lora.rank=4", "actor.lora.alpha=8"],
        ["experiment=cartpole_hybrid", "env.num_envs=8", "algorithm.gamma=0.95"],
    ],
)
def test_the_same_keys_where_something_reads_them_are_accepted(overrides):
    load_config(compose_run(*overrides))


def test_tool_simulation_without_an_environment_is_refused():
    from rltrain.tasks.text_env import env_problems

    run = load_config(compose_run("simulate.tool_latency_ms=100", "simulate.tool_failure_rate=0.1"))
    problems = env_problems(run)
    assert "simulate.tool_latency_ms=100.0 is set but the run has no task.env" in problems[0]
    assert "simulate.tool_failure_rate=0.1" in problems[1]
