"""Behaviour log-probs: those of the distribution actually sampled (temperature, top-p)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rltrain.algorithms.logprobs import compute_logprobs
from rltrain.algorithms.sampling import (
    GenerationStopped,
    SamplingParams,
    encode_prompts,
    generate,
    sampled_logprobs,
)

T = torch.tensor
PROBS = (0.5, 0.3, 0.2)


def _logits(rows: int = 1) -> torch.Tensor:
    return torch.log(T([list(PROBS)])).repeat(rows, 1)


def test_top_p_logprobs_are_the_renormalised_nucleus():
    every = T([0, 1, 2])
    full = sampled_logprobs(_logits(3), every, SamplingParams())
    assert torch.allclose(full, torch.log(T([0.5, 0.3, 0.2])))
    # top_p .6 keeps .5 and .3 (mass .8): .625 and .375; .2 is never sampled
    cut = sampled_logprobs(_logits(3), every, SamplingParams(top_p=0.6))
    assert torch.allclose(cut[:2], torch.log(T([0.625, 0.375])))
    assert cut[2].item() == -math.inf


def test_temperature_then_top_p_logprobs():
    # T=2: p ~ sqrt(p) -> .4154 .3218 .2628; top_p .7 keeps the first two (mass above the
    # third is .7372): sqrt(.5) / (sqrt(.5) + sqrt(.3)) = .56351, sqrt(.3) / (...) = .43649
    got = sampled_logprobs(_logits(2), T([0, 1]), SamplingParams(temperature=2.0, top_p=0.7))
    s5, s3 = math.sqrt(0.5), math.sqrt(0.3)
    assert torch.allclose(got, torch.log(T([s5 / (s5 + s3), s3 / (s5 + s3)])), atol=1e-6)


def test_greedy_picks_are_certain():
    got = sampled_logprobs(_logits(2), T([0, 0]), SamplingParams(greedy=True))
    assert got.tolist() == [0.0, 0.0]


class FixedLM(torch.nn.Module):
    """Next-token distribution PROBS over tokens 0..2 (then EOS=3 at probability ~0) at every
    position, except that row 1 is forced to EOS at its second step."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache):
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], 4), -1e9)
        logits[:, -1, :3] = torch.log(T(list(PROBS)))
        if self.calls == 1 and input_ids.shape[0] > 1:
            logits[1, -1] = T([-1e9, -1e9, -1e9, 0.0])
        self.calls += 1
        return SimpleNamespace(logits=logits, past_key_values=attention_mask.shape[1])


def test_generate_records_the_sampled_distributions_logprobs():
    ids, mask = T([[2], [2]]), T([[1], [1]])
    params = SamplingParams(max_new_tokens=3, top_p=0.6)
    g = torch.Generator().manual_seed(0)
    b = generate(
        FixedLM(),
        ids,
        mask,
        params,
        eos_token_id=3,
        pad_token_id=0,
        generator=g,
        with_logprobs=True,
    )
    nucleus = {0: math.log(0.625), 1: math.log(0.375)}
    rows = b.response_ids.tolist()
    assert all(t in nucleus for t in rows[0])  # top-p .6 never samples token 2
    want0 = [nucleus[t] for t in rows[0]]
    # row 1: one sampled token, then the forced EOS (certain), then padding (masked: 0)
    want1 = [nucleus[rows[1][0]], 0.0, 0.0]
    assert b.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]] and rows[1][1] == 3
    assert torch.allclose(b.old_logprobs, T([want0, want1]), atol=1e-6)


def test_no_logprobs_unless_asked():
    b = generate(FixedLM(), T([[2]]), T([[1]]), SamplingParams(max_new_tokens=2), 3, 0)
    assert b.old_logprobs is None


def test_recorded_logprobs_match_a_full_forward_without_top_p(model, tokenizer):
    # top_p = 1: the behaviour log-probs equal the actor's own (the on-policy ratio is 1)
    ids, mask = encode_prompts(tokenizer, ["1+2=", "13+24="])
    params = SamplingParams(max_new_tokens=4, temperature=0.7, n=2)
    g = torch.Generator().manual_seed(1)
    b = generate(
        model,
        ids,
        mask,
        params,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        g,
        with_logprobs=True,
    )
    full = compute_logprobs(model, b.input_ids, b.attention_mask, b.response_mask, temperature=0.7)
    assert torch.allclose(b.old_logprobs, full, atol=1e-5)


def test_should_stop_abandons_the_generation():
    lm = FixedLM()
    asked = []

    def stop() -> bool:
        asked.append(lm.calls)
        return lm.calls == 2

    with pytest.raises(GenerationStopped):
        generate(lm, T([[2]]), T([[1]]), SamplingParams(max_new_tokens=5), 3, 0, should_stop=stop)
    assert asked == [0, 1, 2] and lm.calls == 2  # stopped before a third forward pass
