"""Advantage estimators against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rltrain.algorithms import (
    compute_advantages,
    discounted_returns,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rltrain.errors import ConfigError

T = torch.tensor
SCORES = T([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # two groups of four


def close(a: torch.Tensor, b: list, tol: float = 1e-5) -> None:
    assert torch.allclose(a, T(b, dtype=torch.float32), atol=tol), (a, b)


def test_grpo_divides_by_the_sample_std_of_each_group():
    # group 1: mean 1/4, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    # group 2: mean 1/2, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3)
    s3 = 0.5 * math.sqrt(3)
    close(grpo_advantages(SCORES, 4), [1.5, -0.5, -0.5, -0.5, s3, s3, -s3, -s3])


def test_grpo_gives_zero_to_a_group_of_equal_scores():
    close(grpo_advantages(T([1.0, 1.0, 0.0, 0.0]), 2), [0.0, 0.0, 0.0, 0.0])


def test_dr_grpo_only_subtracts_the_group_mean():
    close(dr_grpo_advantages(SCORES, 4), [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3; 1 - mean(1,0,0) = 2/3; 0 - mean(1,1,0) = -2/3
    third = 1.0 / 3.0
    close(
        rloo_advantages(SCORES, 4),
        [1, -third, -third, -third, 2 * third, 2 * third] + [-2 * third] * 2,
    )


@pytest.mark.parametrize("fn", [grpo_advantages, dr_grpo_advantages, rloo_advantages])
def test_group_estimators_refuse_groups_of_one(fn):
    with pytest.raises(ConfigError, match="rollout.n_samples_per_prompt=1"):
        fn(T([1.0, 0.0]), 1)
    with pytest.raises(ConfigError, match="n_samples_per_prompt=4"):
        fn(T([1.0, 0.0, 1.0]), 4)


def test_outcome_reward_lands_on_the_last_response_token():
    mask = T([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    close(outcome_token_rewards(T([2.0, 3.0, 5.0]), mask), [[0, 2, 0], [0, 0, 3], [0, 0, 0]])


def test_discounted_returns():
    close(discounted_returns(T([[0.0, 0.0, 1.0]]), T([[1, 1, 1]]), 0.5), [[0.25, 0.5, 1.0]])
    # G1 = 2; G0 = 1 + 0.5 * 2 = 2; the padded token gets nothing
    close(discounted_returns(T([[1.0, 2.0, 0.0]]), T([[1, 1, 0]]), 0.5), [[2.0, 2.0, 0.0]])


def test_discounted_returns_pass_through_a_tool_result():
    # turn 1 (tokens 0-1), a tool result (2-3, not the policy's), turn 2 (4-5), padding (6);
    # reward 1 at the end, gamma .5 per policy token: G5 = 1, G4 = .5, G1 = .25, G0 = .125
    mask = T([[1, 1, 0, 0, 1, 1, 0]])
    rewards = T([[0.0, 0.0, 7.0, 7.0, 0.0, 1.0, 0.0]])  # a stray value under the mask is not read
    close(discounted_returns(rewards, mask, 0.5), [[0.125, 0.25, 0, 0, 0.5, 1.0, 0]])
    # gamma 1: every policy token of the episode gets its outcome
    close(discounted_returns(rewards, mask, 1.0), [[1, 1, 0, 0, 1, 1, 0]])


def test_masked_whiten_uses_only_masked_entries():
    # valid values 1, 3: mean 2, population std 1
    close(masked_whiten(T([[1.0, 3.0, 100.0]]), T([[1, 1, 0]])), [[-1.0, 1.0, 0.0]], tol=1e-4)


def test_reinforce_pp_whitens_returns_over_the_batch():
    # returns [[1,1,1],[2,2,-]]: mean 1.4, population variance (3*0.16 + 2*0.36)/5 = 0.24
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    lo, hi = (1 - 1.4) / math.sqrt(0.24), (2 - 1.4) / math.sqrt(0.24)
    out = reinforce_pp_advantages(rewards, T([[1, 1, 1], [1, 1, 0]]))
    close(out, [[lo, lo, lo], [hi, hi, 0.0]], tol=1e-4)


def test_gae_by_hand():
    # gamma 0.9, lam 0.8, values [.5, .2, .4], reward 1 at the end:
    # d2 = 1 - .4 = .6 -> A2 = .6; d1 = .9*.4 - .2 = .16 -> A1 = .16 + .72*.6 = .592
    # d0 = .9*.2 - .5 = -.32 -> A0 = -.32 + .72*.592 = .10624; returns = A + V
    adv, ret = gae_advantages(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.2, 0.4]]), T([[1, 1, 1]]), 0.9, 0.8)
    close(adv, [[0.10624, 0.592, 0.6]])
    close(ret, [[0.60624, 0.792, 1.0]])


def test_gae_ignores_values_past_the_response():
    # the value .9 on a padded position must not be bootstrapped from: A1 = 1 - .2; A0 = .2-.5+.8
    adv, ret = gae_advantages(T([[0.0, 1.0, 0.0]]), T([[0.5, 0.2, 0.9]]), T([[1, 1, 0]]), 1.0, 1.0)
    close(adv, [[0.5, 0.8, 0.0]])
    close(ret, [[1.0, 1.0, 0.0]])


def test_gae_bootstraps_across_a_tool_result_from_the_next_turn():
    # mask [1, 0, 1]: token 1 is a tool result (its value .9 is not the policy's state);
    # gamma 1, lam 1, reward 1 at the end: A2 = 1 - .4 = .6; d0 = V2 - V0 = .4 - .5 = -.1,
    # A0 = -.1 + .6 = .5 (= the return 1 minus V0); returns 1 on both policy tokens
    adv, ret = gae_advantages(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.9, 0.4]]), T([[1, 0, 1]]), 1.0, 1.0)
    close(adv, [[0.5, 0.0, 0.6]])
    close(ret, [[1.0, 0.0, 1.0]])
    # gamma .9, lam .8 with the hole: the step from token 0 to 2 is one step
    # d2 = .6, A2 = .6; d0 = .9*.4 - .5 = -.14, A0 = -.14 + .72*.6 = .292
    adv, _ = gae_advantages(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.9, 0.4]]), T([[1, 0, 1]]), 0.9, 0.8)
    close(adv, [[0.292, 0.0, 0.6]])


def test_kl_in_reward_enters_group_scores_as_a_sequence_sum():
    # scores: 1 - (.1 + .2) = .7 and 0 - .3 = -.3 (the masked .4 is ignored)
    # mean .2, sample std sqrt(2 * .25) -> advantages +-1/sqrt(2), spread over response tokens
    adv, ret = compute_advantages(
        "grpo",
        T([1.0, 0.0]),
        T([[1, 1], [1, 0]]),
        group_size=2,
        token_kl=T([[0.1, 0.2], [0.3, 0.4]]),
    )
    h = 1 / math.sqrt(2)
    close(adv, [[h, h], [-h, 0.0]])
    assert ret is None


def test_dispatch_matches_the_estimators():
    mask = T([[1, 1], [1, 1], [1, 0], [1, 1]])
    r = T([1.0, 0.0, 0.0, 0.0])
    for name, fn in (("dr_grpo", dr_grpo_advantages), ("rloo", rloo_advantages)):
        adv, _ = compute_advantages(name, r, mask, group_size=2)
        assert torch.allclose(adv, fn(r, 2)[:, None] * mask)
    adv, _ = compute_advantages("grpo", r, mask, group_size=2, norm_by_std=False)
    assert torch.allclose(adv, dr_grpo_advantages(r, 2)[:, None] * mask)


def test_dispatch_gae_whitens_and_returns_targets():
    mask = T([[1, 1], [1, 1]])
    adv, ret = compute_advantages("gae", T([1.0, 0.0]), mask, values=torch.zeros(2, 2))
    # values 0, gamma = lam = 1: raw advantages [[1,1],[0,0]] -> whitened [[1,1],[-1,-1]]
    close(adv, [[1.0, 1.0], [-1.0, -1.0]], tol=1e-4)
    close(ret, [[1.0, 1.0], [0.0, 0.0]])


def test_dispatch_errors_name_the_key():
    with pytest.raises(ConfigError, match="algorithm.advantage_estimator='ppo'"):
        compute_advantages("ppo", T([1.0]), T([[1]]))
    with pytest.raises(ConfigError, match="critic values"):
        compute_advantages("gae", T([1.0]), T([[1]]))
