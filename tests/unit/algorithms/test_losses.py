"""Losses, KL estimators, entropy and aggregation against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rltrain.algorithms import aggregate, entropy_from_logits, kl_penalty, policy_loss, value_loss
from rltrain.errors import ConfigError

T = torch.tensor
VALUES = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "norm_len", "expected"),
    [
        ("token_mean", None, 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq_mean_token_sum", None, 3.5),  # (3 + 4) / 2 sequences
        ("seq_mean_token_mean", None, 2.75),  # (1.5 + 4) / 2
        ("seq_mean_token_sum_norm", None, 7 / 6),  # 7 / (2 sequences * R=3)
        ("seq_mean_token_sum_norm", 4, 7 / 8),  # 7 / (2 * 4)
    ],
)
def test_aggregation_modes(mode, norm_len, expected):
    assert aggregate(VALUES, MASK, mode, norm_len).item() == pytest.approx(expected)


def test_aggregation_of_an_empty_mask_is_zero_and_unknown_mode_is_named():
    assert aggregate(VALUES, torch.zeros(2, 3), "token_mean").item() == 0.0
    with pytest.raises(ConfigError, match="algorithm.loss_agg='sum'"):
        aggregate(VALUES, MASK, "sum")


def _ratios(*ratios: float) -> tuple[torch.Tensor, torch.Tensor]:
    logp = T([[math.log(r) for r in ratios]], requires_grad=True)
    return logp, torch.zeros(1, len(ratios))


def test_clipped_surrogate_by_hand():
    # ratio 1.5, A=1: max(-1.5, -1.3) = -1.3 (clipped by clip_high .3)
    # ratio 0.5, A=-1: max(0.5, 0.8) = 0.8 (clipped by clip_low .2)
    # ratio 1.1, A=-2: max(2.2, 2.2) = 2.2 ; ratio 1, A=3: -3
    logp, old = _ratios(1.5, 0.5, 1.1, 1.0)
    adv = T([[1.0, -1.0, -2.0, 3.0]])
    out = policy_loss(logp, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.3)
    assert out.loss.item() == pytest.approx((-1.3 + 0.8 + 2.2 - 3.0) / 4)
    assert out.clip_frac.item() == pytest.approx(0.5)
    assert out.ratio_mean.item() == pytest.approx((1.5 + 0.5 + 1.1 + 1.0) / 4)
    # Schulman's k3 for KL(old || new) under old's samples: (r - 1) - log r, r = new / old
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 1.0)]
    assert out.approx_kl.item() == pytest.approx(sum(k3) / 4)
    out.loss.backward()
    # clipped tokens carry no gradient; d/dlogp of -A*ratio/4 is -A*ratio/4
    assert torch.allclose(logp.grad, T([[0.0, 0.0, 2 * 1.1 / 4, -3 / 4]]))


def test_clip_low_and_clip_high_are_separate():
    logp, old = _ratios(1.25)
    adv = T([[1.0]])
    assert policy_loss(logp, old, adv, T([[1.0]]), 0.2, 0.3).loss.item() == pytest.approx(-1.25)
    assert policy_loss(logp, old, adv, T([[1.0]]), 0.2, 0.2).loss.item() == pytest.approx(-1.2)
    logp, old = _ratios(0.75)
    adv = T([[-1.0]])
    assert policy_loss(logp, old, adv, T([[1.0]]), 0.3, 0.2).loss.item() == pytest.approx(0.75)
    assert policy_loss(logp, old, adv, T([[1.0]]), 0.2, 0.2).loss.item() == pytest.approx(0.8)


def test_policy_loss_aggregates_by_sequence():
    # per-token losses -A*ratio at ratio 1: [[-1, -1, x], [-4, x, x]] with A [[1,1,9],[4,9,9]]
    logp = torch.zeros(2, 3)
    adv = T([[1.0, 1.0, 9.0], [4.0, 9.0, 9.0]])
    out = policy_loss(logp, logp, adv, MASK, loss_agg="seq_mean_token_mean")
    assert out.loss.item() == pytest.approx((-1.0 - 4.0) / 2)
    out = policy_loss(logp, logp, adv, MASK, loss_agg="seq_mean_token_sum")
    assert out.loss.item() == pytest.approx((-2.0 - 4.0) / 2)


def test_kl_estimators_by_hand():
    # pi = .5, pi_ref = .25 at the sampled token: d = ln 2
    ln2 = math.log(2)
    logp, ref = T([[math.log(0.5), math.log(0.25)]]), T([[math.log(0.25), math.log(0.5)]])
    assert torch.allclose(kl_penalty(logp, ref, "k1"), T([[ln2, -ln2]]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), T([[ln2**2 / 2, ln2**2 / 2]]))
    # k3 = exp(-d) - 1 + d: 0.5 - 1 + ln2 and 2 - 1 - ln2
    assert torch.allclose(kl_penalty(logp, ref, "k3"), T([[ln2 - 0.5, 1 - ln2]]))
    with pytest.raises(ConfigError, match="algorithm.kl_estimator='k4'"):
        kl_penalty(logp, ref, "k4")


def test_entropy_by_hand():
    logits = T([[0.0, 0.0], [math.log(3.0), 0.0]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert torch.allclose(entropy_from_logits(logits), T([math.log(2.0), h]))


def test_value_loss_clips_against_old_values():
    # t0: max((1-2)^2, (.7-2)^2) = 1.69; t1: max((0-1)^2, (.3-1)^2) = 1
    v, old, ret, m = T([[1.0, 0.0]]), T([[0.5, 0.5]]), T([[2.0, 1.0]]), T([[1.0, 1.0]])
    assert value_loss(v, old, ret, m, clip=0.2).item() == pytest.approx(0.5 * (1.69 + 1.0) / 2)
    assert value_loss(v, old, ret, m, clip=None).item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
