"""The front door: everything training refuses before Ray, ``mode=plan`` refuses too, at once.

Each bad input goes through :func:`rltrain.app.run` twice, as training and as ``mode=plan``, in
a process where starting a cluster fails the test: both must refuse with the same message and
neither may reach Ray.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from rltrain.config import load_config
from rltrain.config.store import register_configs
from rltrain.errors import ConfigError, RltrainError

CONF = pathlib.Path(__file__).resolve().parents[3] / "conf"


def compose_config(*overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def no_ray(monkeypatch, tmp_path):
    """Starting a cluster fails the test; the run directory is a fresh temporary one."""
    from rltrain.scheduler import cluster

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started for input that should be refused before it")

    monkeypatch.setattr(cluster.Cluster, "start", classmethod(refuse))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def not_a_checkpoint(tmp: pathlib.Path) -> str:
    (tmp / "empty").mkdir(exist_ok=True)
    return f"trainer.resume={tmp / 'empty'}"


BAD = {
    "staleness on a shared device": ["trainer.max_staleness=1"],
    "fuse=true with a reference": [
        "placement.fuse=true",
        "algorithm.kl_coef=0.1",
        "+placement.component_placement.reference=all",
    ],
    "no rollout": ["~placement.component_placement.rollout", "placement.mode=null"],
    "batch does not divide": ["trainer.train_batch_size=3"],
    "does not fit": ["cluster.device_memory_gib=0.001"],
    "critic samples do not divide": [
        "experiment=reasoning_ppo",
        "algorithm.num_minibatches=3",
    ],
    "embodied envs do not divide": ["experiment=cartpole_hybrid", "env.num_envs=15"],
    "not a checkpoint": None,  # filled in with the test's temporary directory
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_training_and_plan_refuse_alike_before_ray(case: str, no_ray):
    from rltrain.app import run

    overrides = BAD[case] if BAD[case] is not None else [not_a_checkpoint(no_ray)]
    messages = []
    for mode in ("train", "plan"):
        with pytest.raises(RltrainError) as info:
            run(compose_config(*overrides, f"mode={mode}"))
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_problems_of_config_and_plan_come_in_one_report(no_ray):
    from rltrain.runners.layout import preflight

    run = load_config(compose_config("trainer.train_batch_size=3", "trainer.max_staleness=1"))
    with pytest.raises(ConfigError) as info:
        preflight(run, str(no_ray))
    text = str(info.value)
    assert "trainer.max_staleness=1" in text and "trainer.train_batch_size=3" in text


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optimizer.lr=nan", "optimizer.lr"),
        ("optimizer.lr=-1", "optimizer.lr"),
        ("optimizer.lr=inf", "optimizer.lr"),
        ("optimizer.betas=[0.9]", "optimizer.betas"),
        ("optimizer.betas=[0.9,1.5]", "optimizer.betas[1]"),
        ("optimizer.grad_clip=-1", "optimizer.grad_clip"),
        ("optimizer.name=sgd", "optimizer.name"),
        ("optimizer.name=deepspeed_adamw", "optimizer.name"),
        ("rollout.temperature=nan", "rollout.temperature"),
        ("algorithm.entropy_coef=nan", "algorithm.entropy_coef"),
        ("algorithm.clip_low=1.5", "algorithm.clip_low"),
        ("algorithm.gamma=1.5", "algorithm.gamma"),
        ("algorithm.lam=-0.1", "algorithm.lam"),
        ("reference.micro_batch_size=0", "reference.micro_batch_size"),
        ("rollout.n_samples_per_prompt=0", "rollout.n_samples_per_prompt"),
        ("trainer.time_budget_s=-5", "trainer.time_budget_s"),
        ("cluster.device_memory_gib=nan", "cluster.device_memory_gib"),
        ("cluster.devices_per_node=200000", "cluster.devices_per_node"),
        ("seed=-1", "seed"),
        ("seed=99999999999999999999", "seed"),
        ("weight_sync.transport=nccl", "weight_sync.transport"),
        ("task.max_prompt_length=0", "task.max_prompt_length"),
    ],
)
def test_numbers_and_names_are_checked(override: str, key: str):
    with pytest.raises(ConfigError) as info:
        load_config(compose_config(override))
    # the value's own check, not only the refusal of a key the run would not read (which
    # names the key too, and would hide a range check gone missing)
    checked = [p for p in info.value.problems if "is set but nothing reads it" not in p]
    assert any(key in p for p in checked), info.value.problems


def test_a_new_components_offload_policy_is_one_override():
    run = load_config(
        compose_config(
            "+placement.offload.reference={when: after_stage}",
            "+placement.component_placement.reference=all",
            "algorithm.kl_coef=0.01",
        )
    )
    assert run.placement.offload["reference"].when == "after_stage"


def test_a_bad_offload_key_is_named():
    with pytest.raises(ConfigError, match=r"placement\.offload\.reference\.whn"):
        load_config(compose_config("+placement.offload.reference={whn: after_stage}"))


def test_moving_the_actor_moves_the_collocated_rollout():
    run = load_config(
        compose_config("cluster.devices_per_node=4", "placement.component_placement.actor=0-1")
    )
    assert run.placement.component_placement["rollout"] == "0-1"


def test_plan_mode_writes_the_plan_and_refuses_after(no_ray):
    from rltrain.app import run

    with pytest.raises(
        ConfigError, match="trainer.max_staleness=1 needs rollout and actor on separate devices"
    ):
        run(compose_config("mode=plan", "trainer.max_staleness=1"))
    assert json.loads((no_ray / "plan.json").read_text())["mode"] == "collocated"
