"""The update loop: minibatches, epochs, KL and critic wiring, on the real tiny model."""

from __future__ import annotations

import pytest
import torch

from rltrain.algorithms import (
    RolloutBatch,
    SamplingParams,
    UpdateSettings,
    ValueModel,
    actor_loss,
    add_advantages,
    compute_logprobs,
    compute_values,
    encode_prompts,
    generate,
    minibatch_indices,
    ppo_update,
)
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError

T = torch.tensor


def test_settings_come_from_the_config():
    cfg = RunConfig()
    cfg.algorithm.clip_high = 0.28
    cfg.rollout.max_new_tokens = 7
    s = UpdateSettings.from_config(cfg)
    assert (s.algorithm.clip_high, s.max_new_tokens, s.grad_clip) == (
        0.28,
        7,
        cfg.optimizer.grad_clip,
    )
    assert s.algorithm is cfg.algorithm  # the config itself, not a copy of its fields
    assert not s.uses_reference


def test_settings_of_splits_algorithm_and_own_fields():
    s = UpdateSettings.of(clip_high=0.28, grad_clip=0.5, policy_loss="gspo")
    assert (s.algorithm.clip_high, s.algorithm.policy_loss, s.grad_clip) == (0.28, "gspo", 0.5)
    with pytest.raises(TypeError):
        UpdateSettings.of(no_such_field=1)


def test_minibatches_partition_the_batch():
    parts = minibatch_indices(10, 3, torch.Generator().manual_seed(0))
    assert sorted(len(p) for p in parts) == [3, 3, 4]
    assert sorted(torch.cat(parts).tolist()) == list(range(10))
    with pytest.raises(ConfigError, match="algorithm.num_minibatches=11"):
        minibatch_indices(10, 11)


def _batch(model, tokenizer, n=4) -> RolloutBatch:
    ids, mask = encode_prompts(tokenizer, ["1+2=", "3+3="])
    g = torch.Generator().manual_seed(0)
    return generate(model, ids, mask, SamplingParams(max_new_tokens=3, n=n), 1, 0, g)


def _logp(model, b: RolloutBatch) -> torch.Tensor:
    with torch.no_grad():
        return compute_logprobs(model, b.input_ids, b.attention_mask, b.response_mask)


def test_an_update_makes_rewarded_responses_more_likely(model, tokenizer):
    b = _batch(model, tokenizer)
    rewards = T([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    b = add_advantages(b.replace(rewards=rewards), UpdateSettings.of())
    before = _logp(model, b).sum(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    s = UpdateSettings.of(ppo_epochs=2, num_minibatches=2)
    metrics = ppo_update(model, opt, b, s, generator=torch.Generator().manual_seed(0))
    gain = _logp(model, b).sum(1) - before
    assert gain[0] > 0 and gain[5] > 0
    assert gain[0] > gain[1:4].max() and gain[5] > gain[[4, 6, 7]].max()
    assert {"actor/pg_loss", "actor/clip_frac", "actor/grad_norm"} <= set(metrics)


def test_kl_in_loss_needs_reference_logprobs_and_pulls_towards_them(model, tokenizer):
    b = _batch(model, tokenizer)
    b = add_advantages(b.replace(rewards=torch.zeros(8)), UpdateSettings.of())
    s = UpdateSettings.of(kl_coef=1.0, kl_in="loss", kl_estimator="k2")
    with pytest.raises(ConfigError, match="reference log-probs"):
        actor_loss(model, b, s)
    ref = _logp(model, b) - 0.5 * b.response_mask  # the reference prefers these tokens less
    loss, metrics = actor_loss(model, b.replace(ref_logprobs=ref), s)
    # zero advantages: the loss is the k2 KL, 0.5 * 0.5^2 per token (token mean)
    assert metrics["actor/kl_loss"] == pytest.approx(0.125, abs=1e-5)
    assert loss.item() == pytest.approx(0.125, abs=1e-5)


def test_kl_in_reward_lowers_the_advantage_of_divergent_samples(model, tokenizer):
    b = _batch(model, tokenizer)
    old = _logp(model, b)
    ref = old.clone()
    ref[0] -= 1.0 * b.response_mask[0]  # sample 0 drifted from the reference
    b = b.replace(rewards=torch.zeros(8), old_logprobs=old, ref_logprobs=ref)
    b = add_advantages(b, UpdateSettings.of(kl_coef=0.1, kl_in="reward", kl_estimator="k1"))
    assert b.advantages[0, 0] < 0 and b.advantages[1, 0] > 0


def test_ppo_with_a_critic_fits_the_returns(model, tokenizer):
    torch.manual_seed(0)
    b = _batch(model, tokenizer, n=1)  # one sample per prompt: every state has one target
    critic = ValueModel(model.__class__(model.config))
    # gamma = lam = 1: every token's return is the outcome reward, a fixed regression target
    s = UpdateSettings.of(advantage_estimator="gae", gamma=1.0, lam=1.0, value_clip=10.0)
    rewards = T([1.0, 0.0])
    c_opt = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    p_opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(20):
        with torch.no_grad():
            values = compute_values(critic, b.input_ids, b.attention_mask, b.response_mask)
        step = add_advantages(b.replace(rewards=rewards, values=values), s)
        m = ppo_update(model, p_opt, step, s, critic=critic, critic_optimizer=c_opt)
        losses.append(m["critic/value_loss"])
    assert losses[-1] < 0.1 * losses[0], losses
    assert torch.allclose(step.returns, rewards[:, None] * b.response_mask)
