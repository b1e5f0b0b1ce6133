"""Embodied PPO pieces against hand-computed values: GAE with episode ends, truncation
bootstraps, the actor-critic's sampling, and the PPO epochs' row split across ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rltrain.algorithms.embodied_ppo import (
    PPOSettings,
    Transitions,
    build_transitions,
    episode_gae,
    ppo_epochs,
)
from rltrain.workers.embodied import ActorCritic, item_seed
from rltrain.workers.env import EnvRollout, SpaceSpec

CARTPOLE = SpaceSpec("CartPole-v1", 4, "discrete", 2)


def test_gae_resets_at_episode_ends_and_bootstraps_the_tail():
    # gamma 0.9, lam 0.8; the episode ends at t=1, so t=1 does not see V(t=2).
    # t=2: delta = 1 + 0.9*0.2 - 0.3 = 0.88                     A = 0.88
    # t=1: delta = 1 - 0.4 = 0.6 (done)                          A = 0.6
    # t=0: delta = 1 + 0.9*0.4 - 0.5 = 0.86; A = 0.86 + 0.72*0.6 = 1.292
    rewards = torch.tensor([[1.0], [1.0], [1.0]])
    values = torch.tensor([[0.5], [0.4], [0.3]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    adv, ret = episode_gae(rewards, values, dones, torch.tensor([0.2]), 0.9, 0.8)
    assert adv.squeeze(1).tolist() == pytest.approx([1.292, 0.6, 0.88])
    assert ret.squeeze(1).tolist() == pytest.approx([1.792, 1.0, 1.18])


def test_gae_with_lambda_one_and_no_ends_is_the_discounted_return_minus_value():
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    values = torch.tensor([[0.5, 0.0], [1.0, 2.0]])
    adv, ret = episode_gae(rewards, values, torch.zeros(2, 2), torch.tensor([10.0, 0.0]), 0.5, 1.0)
    # column 0: G0 = 1 + 0.5*3 + 0.25*10 = 5, G1 = 3 + 0.5*10 = 8; column 1: 2 + 0.5*4 = 4, 4
    assert ret.flatten().tolist() == pytest.approx([5.0, 4.0, 8.0, 4.0])
    assert adv.flatten().tolist() == pytest.approx([4.5, 4.0, 7.0, 2.0])


def _constant_value_model(value: float) -> ActorCritic:
    model = ActorCritic(CARTPOLE, 8, 1)
    head = model.critic[-1]
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.constant_(head.bias, value)
    return model


def _rollout(steps: int, n: int, **over) -> EnvRollout:
    base = dict(
        obs=np.zeros((steps, n, 4), np.float32),
        actions=np.zeros((steps, n), np.int64),
        logprobs=np.zeros((steps, n), np.float32),
        rewards=np.ones((steps, n), np.float32),
        dones=np.zeros((steps, n), np.float32),
        truncated=np.zeros((steps, n), np.float32),
        final_obs=np.zeros((steps, n, 4), np.float32),
        last_obs=np.zeros((n, 4), np.float32),
        episode_returns=(),
        episode_lengths=(),
        versions=(0,),
    )
    base.update(over)
    return EnvRollout(**base)


def test_a_truncated_step_bootstraps_the_value_of_its_final_observation():
    # V = 2 everywhere, gamma 0.5, lam 1. Column 0 is cut by a time limit at t=0, column 1 ends
    # by termination: only column 0's reward gains gamma * V(final) = 1.
    dones = np.array([[1.0, 1.0]], np.float32)
    trunc = np.array([[1.0, 0.0]], np.float32)
    roll = _rollout(1, 2, dones=dones, truncated=trunc)
    batch = build_transitions(_constant_value_model(2.0), [roll], 0.5, 1.0, torch.device("cpu"))
    # A = r + bootstrap - V: column 0: 1 + 1 - 2 = 0; column 1: 1 - 2 = -1
    assert batch.advantages.tolist() == pytest.approx([0.0, -1.0])
    assert batch.returns.tolist() == pytest.approx([2.0, 1.0])


def test_env_processes_concatenate_along_the_environment_axis():
    a = _rollout(2, 1, rewards=np.array([[1.0], [2.0]], np.float32))
    b = _rollout(2, 2, rewards=np.array([[3.0, 4.0], [5.0, 6.0]], np.float32))
    batch = build_transitions(_constant_value_model(0.0), [a, b], 1.0, 1.0, torch.device("cpu"))
    # rows are time-major: (t0: a0 b0 b1), (t1: a0 b0 b1); gamma 1, V 0: returns sum the future
    assert batch.returns.tolist() == pytest.approx([3.0, 8.0, 10.0, 2.0, 5.0, 6.0])


def test_sampling_is_seeded_by_the_item_and_greedy_picks_the_mode():
    model = ActorCritic(CARTPOLE, 16, 2)
    obs = torch.randn(64, 4)
    seed = item_seed(1, 3, 0, 1, 7)
    a1, lp1 = model.act(obs, torch.Generator().manual_seed(seed))
    a2, lp2 = model.act(obs, torch.Generator().manual_seed(seed))
    assert torch.equal(a1, a2) and torch.equal(lp1, lp2)
    assert item_seed(1, 3, 0, 1, 7) != item_seed(1, 3, 0, 1, 8) != item_seed(1, 3, 1, 0, 7)
    greedy, _ = model.act(obs, None, greedy=True)
    assert torch.equal(greedy, model.distribution(obs).probs.argmax(-1))
    logp, _, _ = model(obs, a1)
    assert torch.allclose(logp, lp1, atol=1e-6)


class _GeneratorOnItsDevice(TorchDispatchMode):
    """CUDA's rule, kept on any device: a random op's generator lives where its tensors do
    (``torch.multinomial`` of GPU probabilities refuses a host generator)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gens = [g for g in (*args, *kwargs.values()) if isinstance(g, torch.Generator)]
        for t in (a for a in args if isinstance(a, torch.Tensor)):
            for g in gens:
                if t.device.type != g.device.type:
                    raise RuntimeError(
                        f"Expected a '{t.device.type}' device type for generator but found "
                        f"'{g.device.type}' ({func})"
                    )
        return func(*args, **kwargs)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_items_host_generator_samples_a_policy_on_any_device(device, monkeypatch):
    """The rollout seeds each item's generator on the host; a policy on a GPU must still
    sample with it (the "meta" device stands in for the GPU), and on CPU the actions are
    ``torch.multinomial``'s, as before."""
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", False)  # no values
    model = ActorCritic(CARTPOLE, 16, 2)
    obs = torch.randn(64, 4)
    seed = item_seed(1, 3, 0, 1, 7)
    probs = model.distribution(obs).probs
    want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)
    model.to(device)
    with _GeneratorOnItsDevice():
        actions, logp = model.act(obs.to(device), torch.Generator().manual_seed(seed))
    assert actions.device.type == logp.device.type == device
    if device == "cpu":
        assert torch.equal(actions, want)


def test_continuous_actions_use_a_gaussian_with_summed_log_probs():
    spec = SpaceSpec("Pendulum-v1", 3, "continuous", 2, (-2.0, -2.0), (2.0, 2.0))
    model = ActorCritic(spec, 8, 1)
    obs = torch.randn(5, 3)
    actions, logp = model.act(obs, torch.Generator().manual_seed(0))
    assert actions.shape == (5, 2) and logp.shape == (5,)
    mean = model.policy(obs)
    expect = torch.distributions.Normal(mean, 1.0).log_prob(actions).sum(-1)  # log_std starts 0
    assert torch.allclose(logp, expect, atol=1e-5)


def _settings(**over) -> PPOSettings:
    base = dict(
        gamma=0.99,
        lam=0.95,
        clip=0.2,
        value_clip=0.0,
        value_coef=0.5,
        entropy_coef=0.0,
        epochs=2,
        minibatches=2,
        grad_clip=0.5,
    )
    base.update(over)
    return PPOSettings(**base)


def test_ppo_epochs_split_each_minibatch_between_ranks():
    """Two ranks each training half of every minibatch see disjoint rows covering the batch."""
    seen: dict[int, list[int]] = {0: [], 1: []}

    class Recorder(torch.nn.Module):
        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, obs, actions):
            seen[self.rank].extend(int(x) for x in obs[:, 0])
            z = self.w.expand(len(obs))
            return z, z, z

    rows = 8
    batch = Transitions(
        obs=torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, 4),
        actions=torch.zeros(rows, dtype=torch.long),
        logprobs=torch.zeros(rows),
        values=torch.zeros(rows),
        advantages=torch.arange(rows, dtype=torch.float32),
        returns=torch.zeros(rows),
    )
    for rank in (0, 1):
        model = Recorder(rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        gen = torch.Generator().manual_seed(5)
        out = ppo_epochs(model, opt, batch, _settings(), gen, rank, 2)
        assert set(out) >= {"loss/policy", "loss/value", "loss/entropy", "grad_norm"}
    # 2 epochs x 2 minibatches x 2 rows per rank: 8 rows each, each epoch covers all 8 rows once
    assert len(seen[0]) == len(seen[1]) == 8
    for epoch in range(2):
        both = seen[0][epoch * 4 : epoch * 4 + 4] + seen[1][epoch * 4 : epoch * 4 + 4]
        assert sorted(both) == list(range(rows))


def test_ppo_epochs_improve_the_surrogate_on_a_fixed_batch():
    torch.manual_seed(0)
    model = ActorCritic(CARTPOLE, 16, 1)
    obs = torch.randn(64, 4)
    actions, logp = model.act(obs, torch.Generator().manual_seed(1))
    adv = torch.where(actions == 1, 1.0, -1.0)  # action 1 is good everywhere
    batch = Transitions(obs, actions, logp, torch.zeros(64), adv, torch.zeros(64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = model.distribution(obs).probs[:, 1].mean().item()
    ppo_epochs(model, opt, batch, _settings(epochs=4), torch.Generator().manual_seed(2))
    after = model.distribution(obs).probs[:, 1].mean().item()
    assert after > before + 0.05


def test_pipeline_overlap_counts_time_both_were_busy():
    from rltrain.runners.embodied import pipeline_overlap
    from rltrain.telemetry.trace import Span

    def span(proc: str, name: str, start: float, end: float) -> Span:
        comp = proc.split("[")[0]
        return Span(name, comp, ("node0/dev0",), proc, start * 1e6, (end - start) * 1e6, 1)

    spans = [
        span("env[0]", "env_step", 0, 2),
        span("env[0]", "env_step", 3, 4),
        span("env[1]", "env_step", 1, 2.5),  # overlaps env[0]: merged, not double-counted
        span("rollout[0]", "generate", 1.5, 3.5),
        span("rollout[0]", "train", 0, 10),  # other stages do not count
        span("actor[0]", "generate", 0, 10),  # other components do not count
    ]
    o = pipeline_overlap(spans)
    # env busy [0, 2.5] + [3, 4] = 3.5 s; rollout [1.5, 3.5] = 2 s; both [1.5, 2.5] + [3, 3.5]
    assert (o.env_busy_s, o.rollout_busy_s, o.both_s) == pytest.approx((3.5, 2.0, 1.5))
    assert o.fraction == pytest.approx(0.75)
    sequential = pipeline_overlap(
        [span("env[0]", "env_step", 0, 1), span("rollout[0]", "generate", 1, 2)]
    )
    assert sequential.both_s == 0 and sequential.fraction == 0
