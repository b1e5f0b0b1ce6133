"""Engine settings a plan cannot serve are refused by run_reasoning before Ray starts."""

from __future__ import annotations

import pytest
from composed import composed_run as compose_run

from rltrain.backends.vllm_rollout import check_vllm_memory
from rltrain.config import engine_checks
from rltrain.errors import ConfigError
from rltrain.placement.plan import build_plan
from rltrain.placement.types import GIB, ClusterSpec, NodeSpec
from rltrain.runners import reasoning


@pytest.fixture
def no_ray(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Ray must not start for a run the plan cannot serve")

    monkeypatch.setattr(reasoning, "start_job", refuse)
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: False)


def test_an_explicit_transport_the_plan_cannot_serve(no_ray, tmp_path):
    run = compose_run("weight_sync.transport=ipc")
    with pytest.raises(ConfigError, match="weight_sync.transport=ipc needs CUDA GPUs"):
        reasoning.run_reasoning(run, str(tmp_path))


def test_a_reward_model_on_two_processes(no_ray, tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=32,
        num_labels=1,
    )
    LlamaForSequenceClassification(config).save_pretrained(str(tmp_path / "rm"))
    run = compose_run(
        "reward.kind=model",
        f"reward.model_path={tmp_path / 'rm'}",
        "placement.component_placement.reward=0-1",
    )
    with pytest.raises(ConfigError, match="reward.kind='model' is placed on 2 processes"):
        reasoning.run_reasoning(run, str(tmp_path))


def test_vllm_memory_is_checked_against_the_plan(monkeypatch):
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: True)
    monkeypatch.setattr(engine_checks, "package_installed", lambda name: True)
    run = compose_run(
        "placement=disaggregated",
        "rollout.backend=vllm",
        "rollout.gpu_memory_utilization=0.5",
        "cluster.simulate_devices=false",
    )
    plan = build_plan(run, ClusterSpec((NodeSpec(0, 2, 8 * GIB, "cuda"),)))
    check_vllm_memory(run, plan, weights_bytes=1 * GIB)  # 4 GiB reserved holds 1 GiB
    with pytest.raises(ConfigError, match="not more than the rollout's weights"):
        check_vllm_memory(run, plan, weights_bytes=5 * GIB)
