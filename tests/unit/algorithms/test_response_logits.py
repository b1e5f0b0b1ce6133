"""The log-prob pass takes logits for the response positions only, and its entropy metric
carries no autograd state; both give the values of the full computation."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms.logprobs import compute_logprobs, entropy_metric, keeps_logits
from rltrain.algorithms.losses import entropy_from_logits

transformers = pytest.importorskip("transformers")


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


def test_response_positions_only_give_the_full_passs_log_probs_and_entropies():
    m = tiny()
    assert keeps_logits(m)
    ids = torch.randint(0, 97, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    r = 5
    rmask = torch.ones(3, r)
    full = m(input_ids=ids, attention_mask=mask, use_cache=False).logits  # every position
    assert full.shape[1] == 12
    logits = full[:, -r - 1 : -1].float() / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, ids[:, -r:, None]).squeeze(-1)
    logp, ent = compute_logprobs(m, ids, mask, rmask, temperature=0.7, with_entropy=True)
    # position ids from the mask differ from the default ones only on the padded row
    torch.testing.assert_close(logp[1:], want[1:], rtol=1e-5, atol=1e-5)
    _, metric = compute_logprobs(
        m, ids, mask, rmask, temperature=0.7, with_entropy=True, entropy_grad=False
    )
    assert ent.requires_grad and not metric.requires_grad
    torch.testing.assert_close(metric, ent.detach())


def test_the_entropy_metric_slices_rows_and_matches(monkeypatch):
    from rltrain.algorithms import logprobs

    monkeypatch.setattr(logprobs, "ENTROPY_SLICE_ELEMENTS", 3 * 50)  # 3 rows a slice
    x = torch.randn(2, 7, 50)
    torch.testing.assert_close(entropy_metric(x), entropy_from_logits(x))


def test_a_model_without_logits_to_keep_gets_the_plain_call():
    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
            return input_ids

    class Wrapper(torch.nn.Module):  # as DDP and DeepSpeed's engine: .module, **kwargs
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.module = inner

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    assert not keeps_logits(Plain())
    assert not keeps_logits(Wrapper(Plain()))  # read through the wrapper
    assert keeps_logits(Wrapper(tiny()))
