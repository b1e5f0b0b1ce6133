"""The torch and DeepSpeed engines: their entries and the config checks they add."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rltrain.kinds.records import EngineKind


def _whole_model_training(why: str) -> Any:
    """The check of a training engine that holds the whole model (no tensor/pipeline split)."""

    def check(cfg: Any) -> Iterator[str]:
        a = cfg.actor
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(a, name)
            if value > 1:
                yield (
                    f"actor.{name}={value} with actor.backend={a.backend!r}: {why}, so nothing "
                    f"would be split; set actor.{name}=1 (shard the optimizer and weights with "
                    f"actor.backend=deepspeed actor.zero_stage=3 instead)"
                )

    return check


def _no_zero(cfg: Any) -> Iterator[str]:
    """ZeRO stages are DeepSpeed's."""
    a = cfg.actor
    if a.zero_stage != 0:
        yield (
            f"actor.zero_stage={a.zero_stage} with actor.backend={a.backend!r}: ZeRO is "
            f"DeepSpeed's; use actor.backend=deepspeed, or leave actor.zero_stage=0"
        )


def _lora_whole_layers(cfg: Any) -> Iterator[str]:
    """ZeRO-3 partitions layers; the merged LoRA export and the adapters-off reference need
    them whole."""
    a = cfg.actor
    if a.lora.rank > 0 and a.zero_stage == 3:
        yield (
            f"actor.lora.rank={a.lora.rank} with actor.backend=deepspeed actor.zero_stage=3: "
            f"ZeRO-3 partitions every layer's weights across ranks, and the merged weight "
            f"export and the adapters-disabled reference need whole layers; use "
            f"actor.zero_stage 0-2 (the adapters' optimizer state is small), or "
            f"actor.lora.rank=0"
        )


def _torch_generation(cfg: Any) -> Iterator[str]:
    """The torch generation engine holds the whole model on one device."""
    r = cfg.rollout
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(r, name)
        if value > 1:
            yield (
                f"rollout.{name}={value} with rollout.backend={r.backend!r}: the torch engine "
                f"generates with the whole model on one device; use rollout.backend=vllm "
                f"(tensor parallel on GPUs) or set rollout.{name}=1"
            )


TORCH_TRAINING = EngineKind(
    name="torch",
    role="training",
    summary="torch AdamW + DDP (the CPU default)",
    runtime="rltrain.backends.training:torch_engine",
    fusable=True,
    fp32_masters=True,
    config_checks=(
        _whole_model_training(
            "the torch engine holds the whole model on every device (data parallel, DDP)"
        ),
        _no_zero,
    ),
)

DEEPSPEED = EngineKind(
    name="deepspeed",
    role="training",
    summary="DeepSpeed ZeRO stages 0-3 (actor.zero_stage)",
    runtime="rltrain.backends.training:DeepSpeedEngine",
    runners=("reasoning",),
    zero=True,
    config_checks=(
        _whole_model_training("the DeepSpeed engine shards with ZeRO only"),
        _lora_whole_layers,
    ),
    pre_ray_checks=("rltrain.backends.training:check_training_plan",),
)

TORCH_GENERATION = EngineKind(
    name="torch",
    role="generation",
    summary="KV-cached decoding with the policy's own torch module",
    runtime="rltrain.backends.generation:torch_generation",
    fusable=True,
    segments=True,
    multi_turn=True,
    config_checks=(_torch_generation,),
)
