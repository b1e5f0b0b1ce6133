"""Engine options a run could not honour are refused by load_config, naming key and fix."""

from __future__ import annotations

import pytest
from composed import composed_run as load

from rltrain.config import engine_checks
from rltrain.errors import ConfigError


def problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    return str(info.value)


def test_torch_engines_refuse_tensor_and_pipeline_parallel_sizes():
    text = problems("rollout.tensor_parallel_size=2", "actor.pipeline_parallel_size=2")
    assert "rollout.tensor_parallel_size=2 with rollout.backend='torch'" in text
    assert "rollout.backend=vllm" in text
    assert "actor.pipeline_parallel_size=2 with actor.backend='torch'" in text
    text = problems("inference.tensor_parallel_size=2")
    assert "inference.tensor_parallel_size=2" in text


def test_vllm_is_refused_on_simulated_devices(monkeypatch):
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: False)
    text = problems("rollout.backend=vllm")
    assert "rollout.backend='vllm' needs CUDA GPUs" in text and "simulated" in text
    monkeypatch.setattr(engine_checks, "local_gpus_visible", lambda: True)
    monkeypatch.setattr(engine_checks, "package_installed", lambda name: False)
    assert "needs the vllm package" in problems("rollout.backend=vllm")
    monkeypatch.setattr(engine_checks, "package_installed", lambda name: True)
    run = load("rollout.backend=vllm", "rollout.tensor_parallel_size=2")
    assert run.rollout.tensor_parallel_size == 2  # vLLM honours TP
    text = problems("rollout.backend=vllm", "rollout.pipeline_parallel_size=2")
    assert "tensor-parallel only" in text
    text = problems("rollout.backend=vllm", "rollout.max_model_len=8")
    assert "rollout.max_model_len=8 is shorter" in text
    # vLLM would sample at 0.01 (tests/vllm_contract reads its rule): refused, not changed
    text = problems("rollout.backend=vllm", "rollout.temperature=0.005")
    assert "rollout.temperature=0.005: vLLM 0.26 samples with at least 0.01" in text
    assert load("rollout.backend=vllm", "rollout.temperature=0.01").rollout.temperature == 0.01
    assert load("rollout.temperature=0.005").rollout.temperature == 0.005  # the torch engine


def test_options_an_engine_would_ignore():
    assert "actor.zero_stage=2 with actor.backend='torch'" in problems("actor.zero_stage=2")
    assert "rollout.max_model_len=64 sizes a vllm engine" in problems("rollout.max_model_len=64")
    text = problems("reward.model_path=/tmp")
    assert "reward.kind='rule'" in text and "would ignore it" in text


def test_reward_model_path_must_be_a_checkpoint(tmp_path):
    text = problems("reward.kind=model", f"reward.model_path={tmp_path}")
    assert "no config.json" in text
    (tmp_path / "config.json").write_text("{}")
    assert load("reward.kind=model", f"reward.model_path={tmp_path}").reward.kind == "model"


def test_inference_component_is_synchronous_only():
    text = problems(
        "placement=disaggregated",
        "cluster.devices_per_node=3",
        "+placement.component_placement.inference=2",
        "trainer.max_staleness=1",
    )
    assert "trainer.max_staleness=1 with an inference component" in text


def test_gpu_probe_respects_an_empty_visible_device_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert engine_checks.local_gpus_visible() is False
