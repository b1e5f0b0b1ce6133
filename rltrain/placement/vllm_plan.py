"""The vLLM engine's plan-time rule: a KV cache that cannot hold one sequence (vLLM refuses to
start such an engine). Named by the vLLM entry of :mod:`rltrain.kinds.vllm` (``plan_problems``)."""

from __future__ import annotations

from typing import Any

from rltrain.placement import memory as mem
from rltrain.placement.types import GIB, ClusterSpec


def _gib(b: int) -> str:
    return f"{b / GIB:.2f} GiB"


def kv_problems(run: Any, cluster: ClusterSpec, rollout: tuple[Any, ...]) -> list[str]:
    """vLLM engines (one per rollout process) whose KV cache cannot hold one sequence of
    ``max_model_len`` tokens: vLLM refuses to start them."""
    if not rollout:
        return []
    dims = mem.model_dims(run.model)
    need = mem.vllm_max_model_len(run, dims)
    per_token = mem.kv_bytes_per_token(dims)
    weights = mem.weight_bytes(mem.param_count(dims), dims.dtype)
    nodes = {n.rank: n for n in cluster.nodes}
    util = run.rollout.gpu_memory_utilization
    seen: set[tuple[int, int]] = set()
    out = []
    for p in rollout:
        node = nodes[p.node_rank]
        key = (len(p.devices), node.device_memory_bytes)
        if not p.devices or key in seen:
            continue
        seen.add(key)
        kv = mem.vllm_reserved_bytes(util, node.device_memory_bytes, len(p.devices)) - weights
        tokens = max(kv, 0) // per_token
        if tokens < need:
            out.append(
                f"rollout.backend=vllm: an engine on {len(p.devices)} device(s) of "
                f"{_gib(node.device_memory_bytes)} at rollout.gpu_memory_utilization={util} "
                f"keeps {_gib(max(kv, 0))} for its KV cache after the weights ({_gib(weights)}),"
                f" room for {tokens:,} tokens, fewer than one sequence of {need:,} "
                f"(rollout.max_model_len, or task.max_prompt_length + rollout.max_new_tokens): "
                f"raise rollout.gpu_memory_utilization or rollout.tensor_parallel_size, or "
                f"lower rollout.max_model_len"
            )
    return out
