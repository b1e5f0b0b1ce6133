"""The vLLM generation engine: its entry and the config checks it adds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rltrain.kinds.records import EngineKind

#: vLLM 0.26's ``SamplingParams`` raises a temperature in ``(0, 0.01)`` to 0.01
#: (``vllm.sampling_params._MAX_TEMP``; tests/vllm_contract checks the value).
VLLM_MIN_TEMPERATURE = 0.01


def _vllm_settings(cfg: Any) -> Iterator[str]:
    """Settings vLLM would not honour as given."""
    r = cfg.rollout
    if r.pipeline_parallel_size > 1:
        yield (
            f"rollout.pipeline_parallel_size={r.pipeline_parallel_size} with "
            f"rollout.backend='vllm': rltrain's vLLM engine is tensor-parallel only (one engine "
            f"per rollout process spanning its devices); use rollout.tensor_parallel_size"
        )
    if 0 < r.temperature < VLLM_MIN_TEMPERATURE:
        yield (
            f"rollout.temperature={r.temperature}: vLLM 0.26 samples with at least "
            f"{VLLM_MIN_TEMPERATURE} (it raises anything lower), so the run would not sample what "
            f"it says; use rollout.temperature >= {VLLM_MIN_TEMPERATURE}, or rollout.backend=torch"
        )
    if r.max_model_len is not None:
        need = cfg.task.max_prompt_length + r.max_new_tokens
        if r.max_model_len < need:
            yield (
                f"rollout.max_model_len={r.max_model_len} is shorter than task.max_prompt_length "
                f"+ rollout.max_new_tokens = {need}: raise it, or leave it null (that sum)"
            )


def _own_devices(cfg: Any) -> Iterator[str]:
    """vLLM builds on the first devices its process sees, not on the ones the plan gave it.

    vLLM 0.26 puts a TP=1 engine on ``cuda:0`` (``UniProcExecutor``) and its TP workers on
    ``cuda:0..TP-1`` (``gpu_worker``): only a process that sees nothing but its own devices
    builds its engine where the plan placed it.
    """
    if not cfg.placement.isolate_accelerator:
        yield (
            "placement.isolate_accelerator=false with rollout.backend='vllm': vLLM builds its "
            "engine on the first GPUs its process sees, so every rollout process of a node "
            "would share GPU 0 instead of using its own; set placement.isolate_accelerator=true "
            "(each process then sees only its own GPUs), or use rollout.backend=torch"
        )


VLLM = EngineKind(
    name="vllm",
    role="generation",
    summary="vLLM 0.26 (CUDA GPUs; tensor parallel, paged KV cache)",
    runtime="rltrain.backends.generation:VllmGeneration",
    runners=("reasoning",),
    needs_cuda=True,
    package="vllm",
    install="pip install 'rltrain[vllm]' (a build matching the node's torch)",
    kv_reserved=True,
    max_model_len=True,
    own_kernels=True,
    config_checks=(_vllm_settings, _own_devices),
    pre_ray_checks=("rltrain.backends.vllm_rollout:check_plan_memory",),
    plan_problems=("rltrain.placement.vllm_plan:kv_problems",),
)
