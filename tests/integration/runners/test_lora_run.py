"""A real LoRA run on the session's Ray: the KL without a reference component, merged weights
synced to a separate rollout, and a checkpoint with the adapter in peft's format."""

from __future__ import annotations

import json

import pytest

from rltrain.runners.reasoning import run_reasoning
from rltrain.telemetry.metrics import read_metrics

from .test_reasoning import SHORT, compose_run


@pytest.mark.timeout(300)
def test_lora_with_kl_and_no_reference_trains_syncs_and_checkpoints(ray_session, tmp_path):
    ray_session.ensure()
    run = compose_run(
        "placement=disaggregated",  # the rollout is its own process: weights are synced
        "actor.lora.rank=4",
        "algorithm.kl_coef=0.05",
        *SHORT,
    )
    summary = run_reasoning(run, str(tmp_path))
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert "reference" not in summary["seconds_per_stage"]  # the actor's base is the reference
    assert summary["weight_sync"]["rollout"]["transport"] == "host"
    records = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert all("actor/kl_loss" in r for r in records)  # reference log-probs reached the loss
    assert records[-1]["eval/accuracy"] is not None  # the rollout evaluated synced weights
    ckpt = tmp_path / "checkpoints" / (tmp_path / "checkpoints" / "latest").read_text().strip()
    adapter = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and (ckpt / "adapter" / "adapter_model.safetensors").is_file()
    assert (ckpt / "model" / "model.safetensors").is_file()
    assert (ckpt / "rng" / "actor_rank0.pt").is_file()  # the adapter dropout's draws resume
