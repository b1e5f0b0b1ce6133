"""Token-level GAE for LLM PPO: outcome reward on the last response token, KL per token."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms import RolloutBatch, UpdateSettings, add_advantages

T = torch.tensor


def test_gae_with_the_kl_in_the_reward_by_hand():
    # one sequence, 3 response tokens (the 4th is padding), reward 1 on the last real token
    mask = T([[1.0, 1, 1, 0]])
    b = RolloutBatch(
        prompt_ids=T([[5, 6]]),
        prompt_mask=T([[1, 1]]),
        response_ids=T([[7, 8, 1, 0]]),
        response_mask=mask,
        rewards=T([1.0]),
        old_logprobs=T([[-1.0, -1.0, -1.0, -1.0]]),
        ref_logprobs=T([[-1.2, -1.4, -1.2, -3.0]]),  # k1 = old - ref = .2 .4 .2 (2.0 padded)
        values=T([[0.5, 0.4, 0.8, 9.0]]),  # the padded value is never used
    )
    s = UpdateSettings.of(
        advantage_estimator="gae", kl_coef=0.5, kl_in="reward", kl_estimator="k1", lam=0.5
    )
    out = add_advantages(b, s)
    # token rewards r = -.1, -.2, 1 - .1 = .9; gamma = 1, lam = .5, V past the end = 0
    # t=2: delta = .9 + 0 - .8 = .1                 A2 = .1
    # t=1: delta = -.2 + .8 - .4 = .2               A1 = .2 + .5 * .1 = .25
    # t=0: delta = -.1 + .4 - .5 = -.2              A0 = -.2 + .5 * .25 = -.075
    adv = T([-0.075, 0.25, 0.1])
    assert torch.allclose(out.returns, T([[-0.075 + 0.5, 0.25 + 0.4, 0.1 + 0.8, 0.0]]), atol=1e-6)
    whitened = (adv - adv.mean()) / adv.var(unbiased=False).sqrt()
    assert torch.allclose(out.advantages[0, :3], whitened, atol=1e-4)
    assert out.advantages[0, 3] == 0


def test_gae_without_a_kl_gives_the_last_token_the_outcome_reward():
    b = RolloutBatch(
        prompt_ids=T([[5], [5]]),
        prompt_mask=T([[1], [1]]),
        response_ids=T([[7, 1], [1, 0]]),
        response_mask=T([[1.0, 1], [1, 0]]),
        rewards=T([2.0, -1.0]),
        values=torch.zeros(2, 2),
    )
    out = add_advantages(b, UpdateSettings.of(advantage_estimator="gae", gamma=0.5, lam=1.0))
    # zero values: returns are the discounted outcome, 2 * .5 on the first token of row 0
    assert out.returns.tolist() == [[1.0, 2.0], [-1.0, 0.0]]
    # advantages = returns (V = 0), whitened over the 3 real tokens: mean 2/3, var 14/9
    std = (14 / 9) ** 0.5
    want = [[(1 - 2 / 3) / std, (2 - 2 / 3) / std], [(-1 - 2 / 3) / std, 0.0]]
    assert out.advantages.flatten().tolist() == pytest.approx(sum(want, []), abs=1e-5)
