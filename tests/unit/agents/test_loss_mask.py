"""The loss mask apart from the response mask: observation tokens and infra-failed rows are in
the response (attended to) but out of every loss and out of the group statistics."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms.advantages import (
    compute_advantages,
    grpo_advantages,
    rloo_advantages,
    valid_group_advantages,
)
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, actor_loss, add_advantages, micro_weights
from rltrain.config.schema import AlgorithmConfig, ModelConfig
from rltrain.tasks.model import build_model


def test_group_statistics_leave_out_failed_rows_by_hand():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    valid = torch.tensor([True, True, True, False, True, False, False, False])
    adv = valid_group_advantages(scores, valid, 4, "grpo")
    # group 1 over (1, 0, 1): mean 2/3, sample std sqrt(1/3); the failed row gets 0
    std = (1 / 3) ** 0.5
    want = [(1 / 3) / std, (-2 / 3) / std, (1 / 3) / std, 0.0]
    assert adv[:4].tolist() == pytest.approx(want, abs=1e-5)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # one valid row: no comparison, no signal
    rloo = valid_group_advantages(scores, valid, 4, "rloo")
    assert rloo[:4].tolist() == pytest.approx([0.5, -1.0, 0.5, 0.0])


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_all_valid_rows_give_the_plain_estimator(estimator):
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])
    valid = torch.ones(6, dtype=torch.bool)
    got = valid_group_advantages(scores, valid, 3, estimator)
    if estimator == "rloo":
        want = rloo_advantages(scores, 3)
    else:
        want = grpo_advantages(scores, 3, estimator == "grpo")
    assert torch.allclose(got, want, atol=1e-5)


def test_per_token_estimators_leave_a_failed_row_out_of_their_statistics():
    # Multi-turn rows, gamma 1: tokens 0-1 a turn, 2 a tool result, 3 the answer; row 2 failed
    # (its mask is zero throughout, as an episode's loss mask is). REINFORCE++: returns 1, 0
    # on the two valid rows' policy tokens (the tool result passes the outcome through), so
    # 3 tokens of 1 and 3 of 0: mean .5, std .5, advantages +1 / -1; the failed row 0 (its
    # reward of 5 never enters the whitening).
    mask = torch.tensor([[1.0, 1, 0, 1], [1, 1, 0, 1], [0, 0, 0, 0]])
    rewards = torch.tensor([1.0, 0.0, 5.0])
    valid = torch.tensor([True, True, False])
    want = torch.tensor([[1.0, 1, 0, 1], [-1, -1, 0, -1], [0, 0, 0, 0]])
    adv, _ = compute_advantages("reinforce_pp", rewards, mask, valid=valid)
    assert torch.allclose(adv, want, atol=1e-4)
    # GAE with zero values: advantages are the returns, whitened the same way; the failed
    # row's returns (the critic's targets) are 0 and outside its mask
    adv, returns = compute_advantages(
        "gae", rewards, mask, values=torch.zeros(3, 4), valid=valid, gamma=1.0, lam=1.0
    )
    assert torch.allclose(adv, want, atol=1e-4)
    assert returns.tolist() == [[1, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]


def _batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    resp = torch.randint(3, 20, (4, 6), generator=g)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    loss = mask.clone()
    loss[:, 2:4] = 0  # an observation in every row
    loss[3] = 0  # row 3 failed
    return RolloutBatch(
        prompt_ids=torch.randint(3, 20, (4, 3), generator=g),
        prompt_mask=torch.ones(4, 3, dtype=torch.long),
        response_ids=resp,
        response_mask=mask,
        group_size=4,
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        loss_mask=loss,
        infra_failed=torch.tensor([False, False, False, True]),
    )


def test_advantages_and_the_policy_loss_average_over_the_loss_mask():
    torch.manual_seed(0)
    model = build_model(ModelConfig(hidden_size=32, intermediate_size=64, init_seed=3))
    s = UpdateSettings(algorithm=AlgorithmConfig(advantage_estimator="rloo"))
    batch = add_advantages(_batch(), s)
    # rloo over the three valid rows (1, 0, 1): 0.5, -1, 0.5; the failed row gets 0
    assert batch.advantages[:, 0].tolist() == pytest.approx([0.5, -1.0, 0.5, 0.0])
    assert bool((batch.advantages[batch.loss_mask == 0] == 0).all())
    loss, _ = actor_loss(model, batch, s)
    # on-policy ratio 1: the token-mean of -A over the loss-masked tokens only
    m = batch.loss_mask
    assert float(loss.detach()) == pytest.approx(
        float(-(batch.advantages * m).sum() / m.sum()), abs=1e-6
    )
    tokens = [
        float(w)
        for w in micro_weights(m, [torch.tensor([0, 1]), torch.tensor([2, 3])], "token_mean")
    ]
    assert tokens == pytest.approx([6 / 10, 4 / 10])


def test_without_a_loss_mask_the_response_mask_is_used():
    b = _batch().replace(loss_mask=None, infra_failed=None)
    assert b.token_mask is b.response_mask
    adv, _ = compute_advantages("grpo", b.rewards, b.token_mask, group_size=4)
    assert torch.allclose(adv[:, 0], grpo_advantages(b.rewards, 4))
