"""GSPO's sequence ratio and DAPO's shaping, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.losses import gspo_loss, sequence_log_ratio
from rltrain.algorithms.registry import PolicyLossInputs
from rltrain.algorithms.shaping import informative_groups, overlong_penalties, without_truncated
from rltrain.algorithms.update import UpdateSettings, add_advantages
from rltrain.config.schema import AlgorithmConfig
from rltrain.errors import ConfigError

# Row 0: two tokens with log-ratios 0.2 and -0.1 (mean 0.05: s = e^0.05 = 1.05127, inside the
# clip); row 1: one token (the second is padding) with log-ratio 0.3 (s = e^0.3 = 1.34986,
# clipped to 1.2 for its positive advantage).
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
OLD = torch.tensor([[-1.0, -0.5], [-2.0, 0.0]])
DELTA = torch.tensor([[0.2, -0.1], [0.3, 0.0]])
ADV = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
GSPO = AlgorithmConfig(
    policy_loss="gspo", clip_low=0.2, clip_high=0.2, loss_agg="seq_mean_token_mean"
)


def _inputs(rollout=None):
    logp = (OLD + DELTA).clone().requires_grad_(True)
    return logp, PolicyLossInputs(logp, OLD, ADV, MASK, rollout_logprobs=rollout, norm_len=2)


def test_sequence_ratio_is_the_length_normalised_product():
    seq = sequence_log_ratio(OLD + DELTA, OLD, MASK)
    assert seq.tolist() == pytest.approx([0.05, 0.3], abs=1e-6)


def test_gspo_loss_clips_whole_sequences_by_hand():
    logp, x = _inputs()
    out = gspo_loss(x, GSPO)
    # row 0: -A * s = -1.05127 on both tokens; row 1: clipped, -1.2; mean of the row means
    assert out.loss.item() == pytest.approx((-math.exp(0.05) - 1.2) / 2, abs=1e-6)
    assert out.clip_frac.item() == pytest.approx(1 / 3)  # row 1's one token of 3
    out.loss.backward()
    # the gradient of each token of row 0 is -s / (2 tokens * 2 rows); row 1 is clipped: 0
    want = torch.tensor([[-math.exp(0.05) / 4] * 2, [0.0, 0.0]])
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_gspo_truncated_importance_weight_is_per_sequence():
    # log pi_old - log pi_rollout: row 0 [0.5, 0.3] -> e^0.4 = 1.49182; row 1 [1.0] -> e^1,
    # capped at tis_cap = 2
    rollout = OLD - torch.tensor([[0.5, 0.3], [1.0, 0.0]])
    _, x = _inputs(rollout)
    out = gspo_loss(x, GSPO)
    want = (-math.exp(0.05) * math.exp(0.4) - 1.2 * 2.0) / 2
    assert out.loss.item() == pytest.approx(want, abs=1e-5)
    assert out.is_weights[:, 0].tolist() == pytest.approx([math.exp(0.4), 2.0], abs=1e-5)


def test_overlong_penalty_ramps_over_the_buffer():
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    assert overlong_penalties(mask, 4, 2, 1.0).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalties(mask, 4, 4, 0.5).tolist() == [-0.125, -0.25, -0.375, -0.5]
    assert overlong_penalties(mask, 4, 0, 1.0).tolist() == [0.0] * 4


def _pair(rewards, lengths, truncated):
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lengths])
    return RolloutBatch(
        prompt_ids=torch.ones(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        response_ids=torch.ones(2, 4, dtype=torch.long),
        response_mask=mask,
        group_size=2,
        rewards=torch.tensor(rewards),
        truncated=torch.tensor(truncated),
    )


def test_overlong_penalty_enters_the_group_advantage():
    # both correct, the second at the budget: shaped rewards [1, 0] -> GRPO [0.70711, -0.70711]
    s = UpdateSettings.of(overlong_buffer=2, overlong_penalty=1.0, max_new_tokens=4)
    out = add_advantages(_pair([1.0, 1.0], [2, 4], [False, False]), s)
    assert out.advantages[:, 0].tolist() == pytest.approx([0.70711, -0.70711], abs=1e-4)
    plain = add_advantages(_pair([1.0, 1.0], [2, 4], [False, False]), UpdateSettings.of())
    assert plain.advantages.abs().sum() == 0  # equal rewards: no signal without the penalty


def test_mask_truncated_drops_cut_rows_after_the_group_statistics():
    s = UpdateSettings.of(mask_truncated=True)
    out = add_advantages(_pair([1.0, 0.0], [2, 4], [False, True]), s)
    assert out.advantages[0, 0].item() == pytest.approx(0.70711, abs=1e-4)  # the pair's stats
    assert out.response_mask.sum(dim=1).tolist() == [2.0, 0.0]
    with pytest.raises(ConfigError, match="algorithm.mask_truncated"):
        without_truncated(_pair([1.0, 0.0], [2, 4], [False, True]).replace(truncated=None))


def test_informative_groups_are_those_whose_rewards_differ():
    r = torch.tensor([1.0, 1, 0, 1, 0, 0, 1, 0])
    assert informative_groups(r, 2).tolist() == [False, True, False, True]
