"""The roofline and continuous-batching decode, against hand-computed values."""

from __future__ import annotations

import pytest

from rltrain.whatif.hardware import Device, Link
from rltrain.whatif.roofline import (
    BANDWIDTH_EFFICIENCY,
    DECODE_FLOP_EFFICIENCY,
    PREFILL_FLOP_EFFICIENCY,
    STEP_OVERHEAD_S,
    ModelCost,
    decode_step_seconds,
    generate_seconds,
    prefill_seconds,
    train_seconds,
)

LINK = Link("test", 100.0, 0.0)
# 1 GB/s memory, 1 TFLOP/s: easy numbers.
DEV = Device("toy", 80, 1.0, 1.0, LINK, LINK)


def _model(weight_gb: float = 0.8, kv: int = 0, params: int = 1000) -> ModelCost:
    return ModelCost(params, int(weight_gb * 1e9), kv, layers=1, hidden=1)


def test_decode_step_is_memory_bound_for_small_batches():
    m = _model(0.8, kv=1000)
    # bytes = 0.8e9 + 4 * 100 * 1000 = 800.4e6... over 1e9 * 0.8
    expected = (0.8e9 + 4 * 100 * 1000) / (1e9 * BANDWIDTH_EFFICIENCY) + STEP_OVERHEAD_S
    assert decode_step_seconds(DEV, m, batch=4, context=100) == pytest.approx(expected)


def test_decode_step_turns_compute_bound_with_a_large_batch():
    m = ModelCost(params=10**9, weight_bytes=10**6, kv_bytes_per_token=0, layers=1, hidden=1)
    batch, ctx = 1000, 10
    flops = 2 * 10**9 * batch + 4 * 1 * 1 * ctx * batch
    expected = flops / (1e12 * DECODE_FLOP_EFFICIENCY) + STEP_OVERHEAD_S
    assert decode_step_seconds(DEV, m, batch, ctx) == pytest.approx(expected)


def test_tensor_parallel_divides_bytes_and_flops():
    m = _model(0.8)
    one = decode_step_seconds(DEV, m, 1, 1) - STEP_OVERHEAD_S
    two = decode_step_seconds(DEV, m, 1, 1, tp=2) - STEP_OVERHEAD_S
    assert two == pytest.approx(one / 2)


def test_prefill_is_compute_bound_with_a_weight_read_floor():
    m = ModelCost(params=10**9, weight_bytes=8 * 10**8, kv_bytes_per_token=0, layers=1, hidden=1)
    tokens = 10_000
    compute = 2 * 10**9 * tokens / (1e12 * PREFILL_FLOP_EFFICIENCY)
    assert prefill_seconds(DEV, m, tokens) == pytest.approx(compute)
    assert prefill_seconds(DEV, m, 1) == pytest.approx(8e8 / (1e9 * BANDWIDTH_EFFICIENCY))
    assert prefill_seconds(DEV, m, 0) == 0.0


def test_continuous_batching_replaces_finished_sequences():
    # Memory-bound steps of exactly 1 s (+ overhead); no KV, no prompt.
    m = _model(0.8)
    step = 1.0 + STEP_OVERHEAD_S
    # Two slots: requests of 2 and 4 tokens start; the first ends at step 2 and the third
    # (1 token) takes its slot until step 3; the second ends at step 4.
    seconds, steps = generate_seconds(DEV, m, prompt=0, lengths=[2, 4, 1], max_concurrent=2)
    assert steps == 4
    assert seconds == pytest.approx(4 * step)
    # One slot: the requests run one after another: 2 + 4 + 1 steps.
    seconds, steps = generate_seconds(DEV, m, prompt=0, lengths=[2, 4, 1], max_concurrent=1)
    assert (steps, seconds) == (7, pytest.approx(7 * step))
    assert generate_seconds(DEV, m, 0, [], 4) == (0.0, 0)


def test_generation_matches_the_step_by_step_sum():
    m = _model(0.01, kv=10**5, params=10**7)
    lengths, prompt, slots = [3, 1, 2, 5], 4, 2
    total, _ = generate_seconds(DEV, m, prompt, lengths, slots)
    # Step by step: the running set and each one's context, a prefill per admission.
    running = [(lengths[0], 0), (lengths[1], 0)]
    nxt, t, step = 2, prefill_seconds(DEV, m, 2 * prompt), 0
    while running:
        b = len(running)
        ctx = prompt + step + 0.5 - sum(s for _, s in running) / b
        t += decode_step_seconds(DEV, m, b, ctx)
        step += 1
        done = [r for r in running if r[0] + r[1] == step]
        running = [r for r in running if r[0] + r[1] != step]
        for _ in done:
            if nxt < len(lengths):
                running.append((lengths[nxt], step))
                t += prefill_seconds(DEV, m, prompt)
                nxt += 1
    assert total == pytest.approx(t)


def test_training_is_six_n_flops_per_token_plus_the_all_reduce():
    m = ModelCost(params=10**9, weight_bytes=2 * 10**9, kv_bytes_per_token=0, layers=1, hidden=1)
    tokens, u = 1000, 0.5
    compute = 6 * 10**9 * tokens / (1e12 * u)
    assert train_seconds(DEV, m, tokens, u, dp=1, dp_link=LINK) == pytest.approx(compute)
    # dp 4: a ring all-reduce of 2 GB of BF16 grads moves 2 * 3/4 * 2 GB over 100 GB/s.
    allreduce = 2 * 3 / 4 * 2e9 / 100e9
    got = train_seconds(DEV, m, tokens, u, dp=4, dp_link=LINK, epochs=2)
    assert got == pytest.approx(2 * compute + 2 * allreduce)
