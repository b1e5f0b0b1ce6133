"""Sampling, log-probs and greedy evaluation: hand-made distributions and the real tiny model."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rltrain.algorithms import (
    SamplingParams,
    compute_logprobs,
    decode_responses,
    encode_prompts,
    generate,
    greedy_accuracy,
    next_tokens,
    top_p_filter,
)
from rltrain.config.schema import TaskConfig
from rltrain.errors import ConfigError
from rltrain.tasks import build_task

T = torch.tensor


def test_top_p_keeps_the_smallest_nucleus():
    # probabilities .05 .5 .15 .3 (shuffled): ranked .5 .3 .15 .05, mass above = 0 .5 .8 .95
    logits = torch.log(T([[0.05, 0.5, 0.15, 0.3]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))
    assert kept.tolist() == [[False, True, False, True]]
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[False, True, False, False]]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_temperature_and_top_p_shape_the_sampled_distribution():
    logits = torch.log(T([[0.5, 0.3, 0.2]])).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    freq = torch.bincount(next_tokens(logits, SamplingParams(), g), minlength=3) / 20000
    assert torch.allclose(freq, T([0.5, 0.3, 0.2]), atol=0.02)
    # temperature 2 flattens: p ~ sqrt(p) -> .4312 .3340 .2727 after renormalising
    s = [math.sqrt(p) for p in (0.5, 0.3, 0.2)]
    hot = next_tokens(logits, SamplingParams(temperature=2.0), g)
    freq = torch.bincount(hot, minlength=3) / 20000
    assert torch.allclose(freq, T([x / sum(s) for x in s]), atol=0.02)
    # top_p .6 keeps .5 and .3, renormalised to .625 .375
    freq = torch.bincount(next_tokens(logits, SamplingParams(top_p=0.6), g), minlength=3) / 20000
    assert torch.allclose(freq, T([0.625, 0.375, 0.0]), atol=0.02)


def test_sampling_params_name_bad_keys():
    with pytest.raises(ConfigError) as info:
        SamplingParams(max_new_tokens=0, top_p=1.5)
    assert "rollout.max_new_tokens=0" in str(info.value) and "rollout.top_p=1.5" in str(info.value)


class ScriptedLM(torch.nn.Module):
    """Emits ``script[row][k]`` at generation step ``k`` (a stand-in with known outputs)."""

    def __init__(self, script: list[list[int]], vocab: int = 8) -> None:
        super().__init__()
        self.script, self.vocab, self.calls = script, vocab, 0

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache):
        assert attention_mask.shape[1] == (past_key_values or 0) + input_ids.shape[1]
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        for row, seq in enumerate(self.script):
            logits[row, -1, seq[min(self.calls, len(seq) - 1)]] = 10.0
        self.calls += 1
        return SimpleNamespace(logits=logits, past_key_values=attention_mask.shape[1])


def test_generate_stops_each_row_at_eos_and_pads_after():
    eos, pad = 1, 0
    lm = ScriptedLM([[5, 1, 6, 6], [5, 6, 7, 1], [1, 7, 7, 7]])
    ids, mask = T([[0, 3], [4, 3], [0, 3]]), T([[0, 1], [1, 1], [0, 1]])
    b = generate(lm, ids, mask, SamplingParams(max_new_tokens=6, greedy=True), eos, pad)
    assert b.response_ids.tolist() == [[5, 1, 0, 0], [5, 6, 7, 1], [1, 0, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert lm.calls == 4  # stopped once every row had its EOS, before max_new_tokens
    assert b.truncated.tolist() == [False, False, False]


def test_generate_flags_rows_cut_by_the_budget_and_stops_on_every_eos_id():
    eos, end_of_text, pad = 1, 2, 0
    lm = ScriptedLM([[5, 2, 6], [5, 6, 7], [1, 7, 7]])
    ids, mask = T([[3], [3], [3]]), T([[1], [1], [1]])
    params = SamplingParams(max_new_tokens=3, greedy=True)
    b = generate(lm, ids, mask, params, (eos, end_of_text), pad, with_logprobs=True)
    # row 0 ends on the generation config's end-of-text id, row 2 on the tokenizer's EOS: both
    # keep the id they sampled; row 1 reached max_new_tokens without one
    assert b.response_ids.tolist() == [[5, 2, 0], [5, 6, 7], [1, 0, 0]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert b.truncated.dtype == torch.bool and b.truncated.tolist() == [False, True, False]
    # one eos id only: row 0 runs on past its end-of-text token and is cut by the budget
    one = generate(ScriptedLM(lm.script), ids, mask, params, eos, pad)
    assert one.truncated.tolist() == [True, True, False]


def test_generate_repeats_each_prompt_n_times_in_adjacent_rows(model, tokenizer):
    ids, mask = encode_prompts(tokenizer, ["1+2=", "13+4="])
    g = torch.Generator().manual_seed(0)
    b = generate(model, ids, mask, SamplingParams(max_new_tokens=3, n=3), 1, 0, g)
    assert b.size == 6 and b.group_size == 3
    assert torch.equal(b.prompt_ids, ids.repeat_interleave(3, dim=0))
    assert b.response_ids.shape[1] <= 3


def test_cached_greedy_generation_matches_full_recomputation(model, tokenizer):
    prompts = ["1+2=", "13+24=", "4="]  # different lengths: left padding is exercised
    ids, mask = encode_prompts(tokenizer, prompts)
    b = generate(model, ids, mask, SamplingParams(max_new_tokens=5, greedy=True), -1, 0)
    for i, p in enumerate(prompts):  # one row at a time, no padding, no cache
        seq = tokenizer(p, return_tensors="pt")["input_ids"]
        for _ in range(5):
            nxt = model(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
        assert seq[0, -5:].tolist() == b.response_ids[i].tolist()


def test_logprobs_under_left_padding_equal_unpadded_ones(model, tokenizer):
    ids, mask = encode_prompts(tokenizer, ["1+2=", "13+24="])
    resp = T([[3, 1, 0], [4, 5, 1]])
    rmask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    full, fmask = torch.cat([ids, resp], 1), torch.cat([mask, rmask.long()], 1)
    logp, ent = compute_logprobs(model, full, fmask, rmask, temperature=0.5, with_entropy=True)
    for i in range(2):
        real = full[i][fmask[i].bool()][None]
        logits = model(input_ids=real).logits[0].float() / 0.5
        n = int(rmask[i].sum())
        lp = torch.log_softmax(logits[-n - 1 : -1], -1)
        want = lp.gather(-1, real[0, -n:, None]).squeeze(-1)
        assert torch.allclose(logp[i, :n], want, atol=1e-5)
        assert torch.allclose(ent[i, :n], -(lp.exp() * lp).sum(-1), atol=1e-5)
    assert logp[0, 2].item() == 0.0 and ent[0, 2].item() == 0.0


def test_decode_cuts_at_eos_and_keeps_sampled_specials(tokenizer):
    from rltrain.algorithms import RolloutBatch

    seven = tokenizer.convert_tokens_to_ids("7")
    b = RolloutBatch(
        prompt_ids=torch.zeros(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=T([[seven, 1, 0], [seven, 0, seven]]),
        response_mask=T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
    )
    assert decode_responses(tokenizer, b, tokenizer.eos_token_id) == ["7", "7<pad>7"]
    # with several EOS ids a response ends at whichever it sampled
    assert decode_responses(tokenizer, b, (tokenizer.eos_token_id, seven)) == ["7", "7<pad>"]


def test_greedy_accuracy_sends_the_prompts_to_the_policys_device(tokenizer):
    """The tokenizer encodes on the host; a policy on a GPU must get its prompts there (the
    fused and torch-rollout evaluations crashed on an H200 before). The "meta" device stands in
    for the GPU: the forward records where its input arrived, then stops."""

    class Arrived(Exception):
        pass

    class OnMeta(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1, device="meta"))

        def forward(self, input_ids, attention_mask, **_):
            raise Arrived(input_ids.device, attention_mask.device)

    task = build_task(TaskConfig(max_operand=4), tokenizer)
    with pytest.raises(Arrived) as seen:
        greedy_accuracy(OnMeta(), tokenizer, task, max_new_tokens=4)
    assert seen.value.args == (torch.device("meta"), torch.device("meta"))


def test_greedy_accuracy_scores_the_eval_prompts(tokenizer):
    seven = tokenizer.convert_tokens_to_ids("7")
    task = build_task(TaskConfig(max_operand=4), tokenizer)
    lm = ScriptedLM([[seven, 1]] * 25, vocab=len(tokenizer))
    # only 3+4 and 4+3 of the 25 prompts have the answer 7
    assert greedy_accuracy(lm, tokenizer, task, max_new_tokens=4) == pytest.approx(2 / 25)


def test_the_exponential_race_draws_what_multinomial_draws():
    from rltrain.algorithms.sampling import _pick

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    probs = torch.softmax(top_p_filter(logits / 0.8, 0.9), -1)
    want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(-1)
    every = torch.arange(6)
    assert torch.equal(_pick(logits, params, torch.Generator().manual_seed(5), 6, every), want)
    # rows 1 and 4 alone (the others finished): each still draws what it drew in the full batch
    some = torch.tensor([1, 4])
    got = _pick(logits[some], params, torch.Generator().manual_seed(5), 6, some)
    assert torch.equal(got, want[some])


class RowCache:
    """A KV-cache stand-in that knows which original rows it holds (batch_select_indices)."""

    def __init__(self, rows: list[int], length: int) -> None:
        self.rows, self.length = rows, length

    def batch_select_indices(self, keep: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in keep.tolist()]


class RowScriptedLM(ScriptedLM):
    """ScriptedLM that follows its rows through the cache and records each call's batch size."""

    def __init__(self, script: list[list[int]], vocab: int = 8) -> None:
        super().__init__(script, vocab)
        self.batch_sizes: list[int] = []

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache):
        cache = past_key_values or RowCache(list(range(input_ids.shape[0])), 0)
        assert input_ids.shape[0] == len(cache.rows) == attention_mask.shape[0]
        assert attention_mask.shape[1] == cache.length + input_ids.shape[1]
        self.batch_sizes.append(input_ids.shape[0])
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], self.vocab)
        for i, row in enumerate(cache.rows):
            seq = self.script[row]
            logits[i, -1, seq[min(self.calls, len(seq) - 1)]] = 10.0
        self.calls += 1
        cache.length = attention_mask.shape[1]
        return SimpleNamespace(logits=logits, past_key_values=cache)


def test_finished_rows_leave_the_decoding_batch(monkeypatch):
    eos, pad = 1, 0
    script = [[1], [5, 1], [5, 6, 1], [5, 6, 7, 1]]  # row r ends at step r
    ids, mask = T([[3]] * 4), T([[1]] * 4)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    lm = RowScriptedLM(script)
    b = generate(lm, ids, mask, params, eos, pad)
    # each step one of the rows left finishes: 1 of 4, 1 of 3, 1 of 2 are >= COMPACT_SHARE
    assert lm.batch_sizes == [4, 3, 2, 1]
    assert b.response_ids.tolist() == [[1, 0, 0, 0], [5, 1, 0, 0], [5, 6, 1, 0], [5, 6, 7, 1]]
    assert b.response_mask.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    monkeypatch.setattr("rltrain.algorithms.sampling.COMPACT_SHARE", 2.0)  # never compact
    lm = RowScriptedLM(script)
    again = generate(lm, ids, mask, params, eos, pad)
    assert lm.batch_sizes == [4, 4, 4, 4] and torch.equal(again.response_ids, b.response_ids)


def test_compaction_never_changes_what_is_sampled(model, tokenizer, monkeypatch):
    ids, mask = encode_prompts(tokenizer, ["1+2=", "13+4=", "4="])
    params = SamplingParams(max_new_tokens=10, temperature=1.5, n=6)
    eos = tokenizer.convert_tokens_to_ids("3")  # a common digit: rows end at many lengths

    def run(share: float) -> tuple[Any, list[int]]:
        sizes: list[int] = []
        real = model.forward

        def counting(*args, **kwargs):
            sizes.append(kwargs["input_ids"].shape[0])
            return real(*args, **kwargs)

        monkeypatch.setattr("rltrain.algorithms.sampling.COMPACT_SHARE", share)
        monkeypatch.setattr(model, "forward", counting)
        g = torch.Generator().manual_seed(3)
        out = generate(model, ids, mask, params, eos, 0, g, with_logprobs=True)
        monkeypatch.undo()
        return out, sizes

    dropped, shrinking = run(0.25)
    kept, constant = run(2.0)
    assert set(constant) == {18} and shrinking[0] == 18 and shrinking[-1] < 18
    lengths = dropped.response_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows did end at different steps
    assert torch.equal(dropped.response_ids, kept.response_ids)
    assert torch.equal(dropped.response_mask, kept.response_mask)
    assert torch.allclose(dropped.old_logprobs, kept.old_logprobs, atol=1e-6)
