"""The vLLM generation engine: its entry and the config checks it adds."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from rltrain.kinds.records import EngineKind

#: vLLM 0.26's ``SamplingParams`` raises a temperature in ``(0, 0.01)`` to 0.01
#: (``vllm.sampling_params._MAX_TEMP``; tests/vllm_contract checks the value).
VLLM_MIN_TEMPERATURE = 0.01

#: vLLM 0.26's ``SamplingParams`` raises ``ValueError`` for a temperature above 2
#: (``_verify_args``; tests/vllm_contract checks the bound).
VLLM_MAX_TEMPERATURE = 2.0


def vllm_context(cfg: Any) -> tuple[int, str] | None:
    """The model's context as vLLM reads it from the model directory rltrain gives it.

    Args:
        cfg: the run config.

    Returns:
        ``(max_position_embeddings, where)``: the ``model`` field for a built model (its
        ``config.json`` is written from it), the checkpoint's ``config.json`` for
        ``model.path``; None when that file cannot be read yet (the ``model.path`` checks say
        why, or ``task.generate`` writes it later).
    """
    # rltrain.config imports this module through the registry: import on use
    from rltrain.config.files import checkpoint_config

    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") not in ("", "0"):
        return None  # vLLM then lets a longer engine through with a warning
    m = cfg.model
    if m.path is None:
        context = int(m.max_position_embeddings)
        return context, f"model.max_position_embeddings={context}"
    config = checkpoint_config(m.path) or {}
    stored = config.get("max_position_embeddings")
    if not isinstance(stored, int) or rope_scaled(config):
        return None  # vLLM multiplies the context by the RoPE scaling factor: it decides
    return stored, f"max_position_embeddings={stored} in model.path={m.path}/config.json"


def rope_scaled(config: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's ``config.json`` scales its RoPE context (yarn, linear, dynamic,
    ...: ``rope_scaling``, or transformers 5's ``rope_parameters``, of a type other than
    ``default`` or with a factor other than 1), which vLLM multiplies its length by.

    Args:
        config: the checkpoint's ``config.json``.
    """
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if not isinstance(value, Mapping) or not value:
            continue
        nested = all(isinstance(v, Mapping) for v in value.values())
        for rp in value.values() if nested else (value,):
            kind = rp.get("rope_type", rp.get("type", "default"))
            if kind not in ("default", None) or rp.get("factor") not in (None, 1, 1.0):
                return True
    return False


def length_problems(cfg: Any, context: tuple[int, str] | None) -> Iterator[str]:
    """``rollout.max_model_len`` outside what vLLM accepts and the run needs.

    vLLM 0.26 refuses an engine longer than the model's ``max_position_embeddings`` (its
    ``ModelConfig``, raised inside the rollout worker); shorter than ``task.max_prompt_length +
    rollout.max_new_tokens`` (or the context, when that is shorter), a full-length row would
    not fit.

    Args:
        cfg: the run config.
        context: :func:`vllm_context`'s answer (None: only the lower bound is checked).

    Yields:
        At most one message, naming the key, the value, the model's context and the fix.
    """
    r = cfg.rollout
    if r.max_model_len is None:
        return
    need = cfg.task.max_prompt_length + r.max_new_tokens
    if context is not None and r.max_model_len > context[0]:
        yield (
            f"rollout.max_model_len={r.max_model_len} is longer than the model's context "
            f"({context[1]}): vLLM refuses to build such an engine; set rollout.max_model_len "
            f"<= {context[0]}, or leave it null (task.max_prompt_length + rollout.max_new_tokens "
            f"= {need}, capped at the context)"
        )
        return
    floor = need if context is None else min(need, context[0])
    if r.max_model_len < floor:
        yield (
            f"rollout.max_model_len={r.max_model_len} is shorter than task.max_prompt_length "
            f"+ rollout.max_new_tokens = {need}"
            + (f" (capped at the model's context, {floor})" if floor < need else "")
            + ": raise it, or leave it null (that length)"
        )


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
    if r.temperature > VLLM_MAX_TEMPERATURE:
        yield (
            f"rollout.temperature={r.temperature}: vLLM 0.26 refuses a temperature above "
            f"{VLLM_MAX_TEMPERATURE} (at the first generate, inside the rollout worker); use "
            f"rollout.temperature <= {VLLM_MAX_TEMPERATURE}, or rollout.backend=torch"
        )
    yield from length_problems(cfg, vllm_context(cfg))


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
