"""The plan's logits term against what torch allocates, measured with torch's own memory
profiler on CPU.

On an H200 (2026-11-26) the plan chose `actor.micro_batch_size=128` for Qwen2.5-0.5B at a
predicted 51.8 GiB and the run ran out of 139.8 GiB: the plan counted one fp32 copy of the
logits where the log-prob pass holds five. The slope per response token of the measured peak
must match the plan's (`LOGIT_COPIES`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rltrain.algorithms.logprobs import compute_logprobs
from rltrain.placement import memory as mem

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, PROMPT = 8192, 32, 16


def model(dtype: torch.dtype) -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def peak_bytes(m: torch.nn.Module, rows: int, response: int, kind: str) -> int:
    """Peak bytes torch allocated above the start, over one log-prob pass (and backward)."""
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    ids = torch.randint(0, VOCAB, (rows, PROMPT + response))
    mask, rmask = torch.ones_like(ids), torch.ones(rows, response)
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        if kind == "forward":
            with torch.no_grad():
                compute_logprobs(m, ids, mask, rmask, temperature=0.7)
        else:  # as actor_loss: the entropy carries gradients only as a bonus
            bonus = kind == "train_entropy"
            logp, ent = compute_logprobs(
                m, ids, mask, rmask, temperature=0.7, with_entropy=True, entropy_grad=bonus
            )
            (-(logp.sum()) - (0.01 * ent.sum() if bonus else 0.0)).backward()
    m.zero_grad(set_to_none=True)
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    total = np.asarray(sizes).sum(axis=1)
    return int(total.max() - total[0])


@pytest.mark.parametrize("kind", ["train", "train_entropy", "forward"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_planned_logits_grow_as_the_measured_peak(kind, dtype):
    m = model(getattr(torch, dtype))
    dims = mem.ModelDims(HIDDEN, 64, 1, 2, 2, VOCAB, 256, dtype)
    small, large = (2, 16), (4, 32)  # (rows, response tokens)
    measured = peak_bytes(m, *large, kind) - peak_bytes(m, *small, kind)

    def planned(rows: int, response: int) -> int:
        return mem.activation_bytes(
            rows,
            PROMPT + response,
            dims,
            training=kind != "forward",
            response_len=response,
            logit_copies=mem.LOGIT_COPIES[kind],
        )

    predicted = planned(*large) - planned(*small)
    assert predicted == pytest.approx(measured, rel=0.10), (predicted, measured)
