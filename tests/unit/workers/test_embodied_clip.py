"""The embodied PPO loss clips the ratio to [1 - clip_low, 1 + clip_high], as the reasoning
loss does (it used clip_low on both sides before)."""

from __future__ import annotations

import math

import pytest
import torch

from rltrain.algorithms.embodied_ppo import PPOSettings, Transitions, ppo_loss
from rltrain.config.schema import RunConfig


class FixedPolicy(torch.nn.Module):
    """Log-probs given per row; no entropy, zero values."""

    def __init__(self, logp: torch.Tensor) -> None:
        super().__init__()
        self.logp = torch.nn.Parameter(logp)

    def forward(self, obs, actions):
        zeros = torch.zeros_like(self.logp)
        return self.logp, zeros, zeros


def _loss(clip_low: float, clip_high: float) -> tuple[float, float]:
    run = RunConfig()
    run.algorithm.clip_low, run.algorithm.clip_high = clip_low, clip_high
    run.algorithm.value_coef = 0.0
    s = PPOSettings.from_config(run)
    assert (s.clip, s.clip_high) == (clip_low, clip_high)
    # ratio 1.25 on both rows; advantages +1 / -1 (whitened to +-1/sqrt(2))
    mb = Transitions(
        obs=torch.zeros(2, 1),
        actions=torch.zeros(2),
        logprobs=torch.zeros(2),
        values=torch.zeros(2),
        advantages=torch.tensor([1.0, -1.0]),
        returns=torch.zeros(2),
    )
    loss, parts = ppo_loss(FixedPolicy(torch.full((2,), math.log(1.25))), mb, s)
    return float(loss), float(parts["loss/clip_frac"])


def test_the_upper_clip_is_clip_high():
    a = 1 / math.sqrt(2)
    # clip_high=0.2: the positive row's ratio is cut to 1.2; the negative row keeps 1.25
    loss, frac = _loss(0.2, 0.2)
    assert frac == 0.5 and loss == pytest.approx(-(1.2 * a - 1.25 * a) / 2)
    # clip_high=0.3: 1.25 is inside [0.8, 1.3]: nothing is clipped
    loss, frac = _loss(0.2, 0.3)
    assert frac == 0.0 and loss == pytest.approx(-(1.25 * a - 1.25 * a) / 2, abs=1e-7)


def test_embodied_learning_rate_warms_up_per_optimizer_step_then_decays():
    from types import SimpleNamespace

    from rltrain.workers.embodied import EmbodiedActorWorker

    run = RunConfig()
    run.optimizer.lr, run.optimizer.warmup_steps = 0.1, 4
    run.env.lr_final_fraction, run.trainer.total_steps = 0.5, 10
    worker = SimpleNamespace(run=run)
    lr = [EmbodiedActorWorker.lr_at(worker, 0, k) for k in range(5)]
    assert lr == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])
    # iteration 5 of 10: decayed to 1 - 0.5 * 0.5 = 0.75 of optimizer.lr, warmup over
    assert EmbodiedActorWorker.lr_at(worker, 5, 20) == pytest.approx(0.075)
