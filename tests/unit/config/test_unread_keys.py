"""Keys the run would never read where they are set: each is refused before Ray, naming the key,
its value, why nothing reads it and the fix, and accepted at its default and where it is read
(rltrain.config.unread; the old code accepted each and trained as without it)."""

from __future__ import annotations

import dataclasses

import pytest
from composed import composed_run as load

from rltrain.config.unread import unread_keys
from rltrain.errors import ConfigError
from rltrain.tasks.tokenizer import build_tokenizer


def _refused(match: str, *overrides: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(*overrides)


def _unread(run, **sections) -> list[str]:
    """The unread keys of ``run`` with ``sections`` (name -> {field: value}) replaced."""
    changes = {
        name: dataclasses.replace(getattr(run, name), **fields) for name, fields in sections.items()
    }
    return list(unread_keys(dataclasses.replace(run, **changes)))


# ------------------------------------------------------------------ the estimator's options
@pytest.mark.parametrize(
    "preset", ["algorithm=dr_grpo", "algorithm=rloo", "algorithm=reinforce_pp", "algorithm=ppo"]
)
def test_norm_adv_by_std_is_refused_with_an_estimator_that_never_divides(preset):
    _refused(
        r"algorithm.norm_adv_by_std=False is set but nothing reads it: "
        r"algorithm.advantage_estimator='\w+' never divides by the group std \(only grpo",
        preset,
        "algorithm.norm_adv_by_std=false",
    )


def test_norm_adv_by_std_is_read_by_grpo_and_dr_grpo_sets_none():
    assert load("algorithm.norm_adv_by_std=false").algorithm.norm_adv_by_std is False
    run = load("algorithm=dr_grpo")
    assert (run.algorithm.advantage_estimator, run.algorithm.norm_adv_by_std) == ("dr_grpo", True)


# --------------------------------------------------------------------------------- the KL
@pytest.mark.parametrize("override", ["algorithm.kl_estimator=k1", "algorithm.kl_in=reward"])
def test_kl_keys_without_a_kl_are_refused(override):
    key = override.split("=")[0]
    _refused(rf"{key}='\w+' is set but nothing reads it: algorithm.kl_coef=0.0", override)


def test_a_presets_kl_keys_are_refused_when_its_kl_is_turned_off():
    _refused(
        r"algorithm.kl_estimator='k1' is set .* set algorithm.kl_coef>0, or leave it at its "
        r"default \(algorithm.kl_estimator=k3",
        "algorithm=reinforce_pp",
        "algorithm.kl_coef=0",
    )


def test_kl_keys_are_accepted_with_a_kl():
    a = load("algorithm=reinforce_pp").algorithm
    assert (a.kl_coef, a.kl_estimator, a.kl_in) == (0.01, "k1", "reward")
    a = load("actor.lora.rank=4", "algorithm.kl_coef=0.1", "algorithm.kl_estimator=k2").algorithm
    assert a.kl_estimator == "k2"


# ------------------------------------------------------------------------------ tis_cap
def test_tis_cap_with_the_rollouts_log_probs_is_refused():
    _refused(
        r"algorithm.tis_cap=3.0 is set but nothing reads it: pi_old is the rollout's own "
        r"log-probs \(algorithm.old_logprobs 'rollout'",
        "algorithm.old_logprobs=rollout",
        "algorithm.tis_cap=3",
    )


def test_tis_cap_is_judged_by_what_auto_resolves_to():
    # reinforce_pp's KL in the reward on the float32 torch rollout: auto takes the rollout's
    _refused(
        r"algorithm.tis_cap=None is set .*algorithm.old_logprobs='auto', which resolves to "
        r"'rollout' for this run",
        "algorithm=reinforce_pp",
        "algorithm.tis_cap=null",
    )


def test_tis_cap_is_accepted_where_pi_old_is_recomputed():
    assert load("algorithm.tis_cap=3").algorithm.tis_cap == 3.0  # grpo: auto recomputes
    run = load("algorithm=reinforce_pp", "algorithm.old_logprobs=recompute", "algorithm.tis_cap=3")
    assert run.algorithm.tis_cap == 3.0
    assert load("algorithm.old_logprobs=rollout").algorithm.tis_cap == 2.0  # the default


# -------------------------------------------------------- simulators on the reasoning runner
@pytest.mark.parametrize(
    "override",
    [
        "simulate.env_step_latency_ms=5",
        "simulate.env_step_jitter_ms=5",
        "simulate.env_policy_latency_ms=5",
        "simulate.env_policy_jitter_ms=5",
    ],
)
def test_simulator_latencies_on_the_reasoning_runner_are_refused(override):
    key = override.split("=")[0]
    _refused(rf"{key}=5.0 is set but nothing reads it: .*runner='reasoning' steps no", override)
    run = load("experiment=cartpole_hybrid", override)
    assert getattr(run.simulate, key.split(".")[1]) == 5.0


def test_simulator_latencies_are_refused_with_a_text_environment_too():
    # task.env episodes run in the tool workers, never in the simulators' env workers
    _refused(
        r"simulate.env_step_latency_ms=5.0 is set but nothing reads it",
        "experiment=calc_tool",
        "simulate.env_step_latency_ms=5",
    )


# ---------------------------------------------------------------- the generation engine
def test_gpu_memory_utilization_is_refused_on_an_engine_that_reserves_none():
    _refused(
        r"rollout.gpu_memory_utilization=0.5 is set but nothing reads it: rollout.backend="
        r"'torch' reserves no share of device memory .*use an engine that does \(vllm\)",
        "rollout.gpu_memory_utilization=0.5",
    )


def test_gpu_memory_utilization_is_read_by_a_reserving_engine():
    run = load()
    vllm = _unread(run, rollout={"backend": "vllm", "gpu_memory_utilization": 0.5})
    assert not [p for p in vllm if "gpu_memory_utilization" in p]


# ------------------------------------------------------------------------- the tokenizer
def test_an_empty_alphabet_is_refused_not_replaced_by_the_default():
    _refused(r"model.vocab_chars='' must be a non-empty string", "model.vocab_chars=''")
    with pytest.raises(ConfigError, match="model.vocab_chars=''"):
        build_tokenizer(load().model.__class__(vocab_chars=""))


def test_an_alphabet_beside_a_checkpoints_tokenizer_is_refused(tmp_path):
    _refused(
        rf"model.vocab_chars='01\+=' is set but nothing reads it: the tokenizer is "
        rf"model.tokenizer_path='{tmp_path}''s own",
        f"model.tokenizer_path={tmp_path}",
        "model.vocab_chars='01+='",
    )
    run = load()
    assert any(
        "model.vocab_chars" in p for p in _unread(run, model={"path": "/ckpt", "vocab_chars": "01"})
    )
    assert not _unread(run, model={"path": "/ckpt", "hidden_size": 32})  # documented: kept


def test_an_alphabet_of_the_built_in_tokenizer_is_accepted():
    assert load("model.vocab_chars='012+='").model.vocab_chars == "012+="


# ---------------------------------------------------------------------------- micro-batches
@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("reference.micro_batch_size=4", "no reference is placed"),
        ("inference.micro_batch_size=4", "no inference is placed"),
        ("critic.micro_batch_size=4", "no critic is placed"),
        ("reward.micro_batch_size=4", "reward.kind='rule' scores with the task's reward function"),
    ],
)
def test_a_micro_batch_size_of_an_absent_component_is_refused(override, why):
    key = override.split("=")[0]
    _refused(rf"{key}=4 is set but nothing reads it: {why}", override)


def test_micro_batch_sizes_of_placed_components_are_accepted():
    assert load("algorithm=reinforce_pp", "reference.micro_batch_size=4").reference.micro_batch_size
    assert load("algorithm=ppo").critic.micro_batch_size == 64
    run = load()
    placement = {"actor,rollout": "0", "inference": "1"}
    placed = _unread(
        run,
        placement={"component_placement": placement},
        inference={"micro_batch_size": 4},
        reward={"kind": "model", "micro_batch_size": 4},
    )
    assert placed == []


# ------------------------------------------------------------------------------- targets
def test_a_target_with_no_evaluation_before_the_end_is_refused():
    _refused(
        r"trainer.target_accuracy=0.9 is set but nothing reads it: trainer.eval_every=0 .* set "
        r"trainer.eval_every>0",
        "trainer.eval_every=0",
        "trainer.target_accuracy=0.9",
    )
    _refused(
        r"env.target_return=475.0 is set but nothing reads it: trainer.eval_every=0",
        "experiment=cartpole_hybrid",
        "trainer.eval_every=0",
    )


def test_a_target_with_evaluations_is_accepted():
    assert load("trainer.target_accuracy=0.9").trainer.target_accuracy == 0.9
    assert load("trainer.eval_every=0").trainer.eval_every == 0
    assert load("experiment=cartpole_hybrid").env.target_return == 475.0


# ---------------------------------------------------------------------- cluster, trackers
def test_a_temp_dir_when_joining_a_cluster_is_refused():
    _refused(
        r"cluster.temp_dir='/tmp/x' is set but nothing reads it: cluster.address='auto' joins",
        "cluster.address=auto",
        "cluster.temp_dir=/tmp/x",
    )
    assert load("cluster.temp_dir=/tmp/x").cluster.temp_dir == "/tmp/x"


def test_a_project_without_a_tracker_is_refused():
    _refused(
        r"logging.project='mine' is set but nothing reads it: .*set logging.wandb=true",
        "logging.project=mine",
    )
    run = load()
    for tracker in ("wandb", "mlflow"):
        assert not _unread(run, logging={"project": "mine", tracker: True})
