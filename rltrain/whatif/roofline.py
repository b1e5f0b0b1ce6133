"""Device time of the step's work: a roofline per operation, continuous batching for decoding.

Every function is plain arithmetic on published peaks (:class:`~rltrain.whatif.hardware.Device`)
and the model's sizes (:class:`ModelCost`), tested against hand-computed values:

- a decoding step of ``b`` sequences at mean context ``c`` reads the weights once and every
  sequence's KV cache: ``max((W + b c K) / (B e_B), F_dec / (P e_d)) + o`` where ``W`` is the
  weight bytes, ``K`` the KV bytes per token, ``B`` the memory bandwidth, ``P`` the BF16 peak,
  ``F_dec = 2 N b + 4 L h c b`` (matmuls and attention) and ``o`` the engine's per-step cost;
- a prefill of ``t`` tokens is compute-bound: ``max(2 N t / (P e_p), W / (B e_B))``;
- a request stream decodes by continuous batching (:func:`generate_seconds`): at most as many
  sequences at once as the KV cache holds, a finished one replaced by the next waiting one;
- training is ``6 N`` FLOPs per token per epoch at a utilization, plus the gradient
  all-reduce; a log-prob pass ``2 N`` per token.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rltrain.whatif.hardware import Device, Link

#: Share of the memory bandwidth a decoding step reaches (weights and KV streamed).
BANDWIDTH_EFFICIENCY = 0.8
#: Share of the BF16 peak a decoding step's matmuls reach (small, skinny GEMMs).
DECODE_FLOP_EFFICIENCY = 0.5
#: Share of the BF16 peak a prefill reaches.
PREFILL_FLOP_EFFICIENCY = 0.6
#: The engine's own time per decoding step (scheduling, sampling, launches), seconds.
STEP_OVERHEAD_S = 2e-3


@dataclass(frozen=True)
class ModelCost:
    """The model's sizes the roofline reads.

    Attributes:
        params: parameters ``N``.
        weight_bytes: ``W`` at the model's dtype.
        kv_bytes_per_token: ``K`` for one token of one sequence.
        layers: ``L``.
        hidden: ``h``.
    """

    params: int
    weight_bytes: int
    kv_bytes_per_token: int
    layers: int
    hidden: int

    @classmethod
    def of(cls, dims: Any) -> ModelCost:
        """From :class:`~rltrain.placement.memory.ModelDims`."""
        from rltrain.placement import memory as mem

        n = mem.param_count(dims)
        return cls(
            params=n,
            weight_bytes=mem.weight_bytes(n, dims.dtype),
            kv_bytes_per_token=mem.kv_bytes_per_token(dims),
            layers=dims.num_layers,
            hidden=dims.hidden_size,
        )


def decode_step_seconds(
    dev: Device, m: ModelCost, batch: int, context: float, tp: int = 1
) -> float:
    """One decoding step of ``batch`` sequences at mean ``context`` tokens (module docstring).

    Args:
        dev: the device.
        m: the model.
        batch: sequences decoding.
        context: their mean context (prompt + tokens so far).
        tp: tensor-parallel devices the engine spans (each reads ``1/tp`` of the bytes).
    """
    nbytes = (m.weight_bytes + batch * context * m.kv_bytes_per_token) / tp
    flops = (2 * m.params * batch + 4 * m.layers * m.hidden * context * batch) / tp
    memory_s = nbytes / (dev.bandwidth * BANDWIDTH_EFFICIENCY)
    compute_s = flops / (dev.flops * DECODE_FLOP_EFFICIENCY)
    return max(memory_s, compute_s) + STEP_OVERHEAD_S


def prefill_seconds(dev: Device, m: ModelCost, tokens: float, tp: int = 1) -> float:
    """A prefill of ``tokens`` prompt tokens (compute-bound, at least one weight read)."""
    if tokens <= 0:
        return 0.0
    compute_s = 2 * m.params * tokens / tp / (dev.flops * PREFILL_FLOP_EFFICIENCY)
    memory_s = m.weight_bytes / tp / (dev.bandwidth * BANDWIDTH_EFFICIENCY)
    return max(compute_s, memory_s)


def generate_seconds(
    dev: Device,
    m: ModelCost,
    prompt: int,
    lengths: Sequence[int],
    max_concurrent: int,
    tp: int = 1,
) -> tuple[float, int]:
    """One engine decoding a list of requests by continuous batching.

    Requests start in order, at most ``max_concurrent`` at once (the KV cache's room); every
    running sequence gains one token per step, a finished one is replaced by the next waiting
    request (whose prompt is prefilled then). Between two completions the batch is constant, so
    the time is a sum over completions, not over tokens: ``O(n log n)``.

    Args:
        dev: the device.
        m: the model.
        prompt: prompt tokens per request.
        lengths: response tokens of each request.
        max_concurrent: sequences the KV cache holds at once (>= 1).
        tp: tensor-parallel devices of the engine.

    Returns:
        ``(seconds, decoding steps)``.
    """
    n = len(lengths)
    if n == 0:
        return 0.0, 0
    # decode_step_seconds and prefill_seconds, with their constants hoisted (the hot loop of
    # a large cluster's simulation): step(b, c) = max(w + b c kv, b (f + a c)) + o.
    bw = dev.bandwidth * BANDWIDTH_EFFICIENCY
    w, kv = m.weight_bytes / tp / bw, m.kv_bytes_per_token / tp / bw
    dflops = dev.flops * DECODE_FLOP_EFFICIENCY
    f, a = 2 * m.params / tp / dflops, 4 * m.layers * m.hidden / tp / dflops
    pf = 2 * m.params / tp / (dev.flops * PREFILL_FLOP_EFFICIENCY)
    o = STEP_OVERHEAD_S
    slots = max(1, min(max_concurrent, n))
    heap = [(lengths[i], 0) for i in range(slots)]
    heapq.heapify(heap)
    step, start_sum = 0, 0
    seconds = max(pf * slots * prompt, w) if prompt > 0 else 0.0
    nxt = slots
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        finish = heap[0][0]
        if finish > step:
            b = len(heap)
            span = finish - step
            c = prompt + (step + span / 2) - start_sum / b
            mem_s, flop_s = w + b * c * kv, b * (f + a * c)
            seconds += span * ((mem_s if mem_s > flop_s else flop_s) + o)
            step = finish
        admitted = 0
        while heap and heap[0][0] == step:
            start_sum -= pop(heap)[1]
            if nxt < n:
                push(heap, (step + lengths[nxt], step))
                start_sum += step
                nxt += 1
                admitted += 1
        if admitted and prompt > 0:
            seconds += max(pf * admitted * prompt, w)
    return seconds, step


def forward_seconds(dev: Device, m: ModelCost, tokens: float, utilization: float) -> float:
    """A log-prob pass over ``tokens`` tokens: ``2 N t / (P u)``."""
    return 2 * m.params * tokens / (dev.flops * utilization)


def train_seconds(
    dev: Device,
    m: ModelCost,
    tokens: float,
    utilization: float,
    dp: int,
    dp_link: Link,
    epochs: int = 1,
) -> float:
    """One rank's update: ``6 N t e / (P u)`` plus a ring all-reduce of BF16 gradients per
    epoch (``2 (dp-1)/dp x 2 N`` bytes over ``dp_link``)."""
    compute = 6 * m.params * tokens * epochs / (dev.flops * utilization)
    if dp <= 1:
        return compute
    grad_bytes = 2 * m.params
    return compute + epochs * dp_link.seconds(2 * (dp - 1) / dp * grad_bytes, hops=2 * (dp - 1))
