"""PPO with GAE for embodied runs: episode-aware advantages and the clipped update over an epoch.

- :func:`episode_gae`: GAE over ``[T, N]`` time-major rewards with episode ends inside the epoch.
- :func:`build_transitions`: values, time-limit bootstraps and GAE for the env processes' epochs.
- :func:`ppo_loss` / :func:`ppo_epochs`: the clipped surrogate (``clip_low`` / ``clip_high``),
  value and entropy terms, minibatch epochs over one rank's share.

Pure torch: the embodied actor worker (:mod:`rltrain.workers.embodied`) calls these on its own
model; tests check them against hand-computed numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algorithms.losses import policy_loss, value_loss
from rltrain.config.schema import RunConfig

#: One env process's epoch (``rltrain.workers.env.EnvRollout``): arrays ``obs``, ``actions``,
#: ``logprobs``, ``rewards``, ``dones``, ``truncated``, ``final_obs``, ``last_obs``; read by
#: field name, so this layer does not import the worker layer's record.
EnvRollout = Any


class ActorCritic(Protocol):
    """What GAE needs of the worker's policy network (``rltrain.workers.embodied.ActorCritic``),
    without this layer importing the worker layer."""

    def value(self, obs: Tensor) -> Tensor: ...


def episode_gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    last_values: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over time-major transitions with episode ends.

    ``delta_t = r_t + gamma * V_{t+1} * (1 - d_t) - V_t`` and
    ``A_t = delta_t + gamma * lam * (1 - d_t) * A_{t+1}``, where ``d_t`` marks a step that ended
    its episode (the next observation belongs to a new one) and ``V_T`` is ``last_values``.

    Args:
        rewards: ``[T, N]`` rewards (a truncated step's reward already holds its bootstrap).
        values: ``[T, N]`` values of the observations before each step.
        dones: ``[T, N]`` 1.0 where the step ended the episode.
        last_values: ``[N]`` values of the observations after the last step.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, each ``[T, N]``, with ``returns = advantages + values``.
    """
    steps = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    next_value, next_adv = last_values, torch.zeros_like(last_values)
    for t in reversed(range(steps)):
        live = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * live - values[t]
        next_adv = delta + gamma * lam * live * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


@dataclass(frozen=True)
class Transitions:
    """An epoch's flat training batch (``B = T * N`` rows).

    Attributes:
        obs: ``[B, obs_dim]``.
        actions: ``[B]`` or ``[B, action_dim]``.
        logprobs: ``[B]`` behaviour log-probabilities.
        values: ``[B]`` values at rollout time (for value clipping).
        advantages: ``[B]``.
        returns: ``[B]`` value targets.
    """

    obs: Tensor
    actions: Tensor
    logprobs: Tensor
    values: Tensor
    advantages: Tensor
    returns: Tensor

    def rows(self, index: Tensor) -> Transitions:
        return Transitions(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def _cat(rollouts: list[EnvRollout], field: str, axis: int) -> Tensor:
    return torch.from_numpy(np.concatenate([getattr(r, field) for r in rollouts], axis=axis))


@torch.no_grad()
def build_transitions(
    model: ActorCritic, rollouts: list[EnvRollout], gamma: float, lam: float, device: torch.device
) -> Transitions:
    """Values, truncation bootstraps and GAE for the env processes' epochs (rank order).

    A step cut by a time limit ends the episode for GAE but its reward gains
    ``gamma * V(final observation)``: the episode would have gone on.
    """
    obs = _cat(rollouts, "obs", 1).to(device)
    steps, n, dim = obs.shape
    values = model.value(obs.reshape(-1, dim)).reshape(steps, n)
    last_values = model.value(_cat(rollouts, "last_obs", 0).to(device))
    rewards = _cat(rollouts, "rewards", 1).to(device)
    truncated = _cat(rollouts, "truncated", 1).to(device)
    if truncated.any():
        final = _cat(rollouts, "final_obs", 1).to(device).reshape(-1, dim)
        rewards = rewards + gamma * truncated * model.value(final).reshape(steps, n)
    dones = _cat(rollouts, "dones", 1).to(device)
    adv, ret = episode_gae(rewards, values, dones, last_values, gamma, lam)
    actions = _cat(rollouts, "actions", 1).to(device)
    return Transitions(
        obs=obs.reshape(-1, dim),
        actions=actions.reshape(steps * n, *actions.shape[2:]),
        logprobs=_cat(rollouts, "logprobs", 1).to(device).reshape(-1),
        values=values.reshape(-1),
        advantages=adv.reshape(-1),
        returns=ret.reshape(-1),
    )


@dataclass(frozen=True)
class PPOSettings:
    """The PPO knobs the actor uses, read once from the run config."""

    gamma: float
    lam: float
    clip: float  # algorithm.clip_low: the ratio is clipped below at 1 - clip
    value_clip: float
    value_coef: float
    entropy_coef: float
    epochs: int
    minibatches: int
    grad_clip: float
    clip_high: float | None = None  # algorithm.clip_high (above at 1 + clip_high); None: clip

    @classmethod
    def from_config(cls, run: RunConfig) -> PPOSettings:
        a = run.algorithm
        return cls(
            a.gamma,
            a.lam,
            a.clip_low,
            a.value_clip,
            a.value_coef,
            a.entropy_coef,
            a.ppo_epochs,
            a.num_minibatches,
            run.optimizer.grad_clip,
            a.clip_high,
        )


def ppo_loss(model: nn.Module, mb: Transitions, s: PPOSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate + clipped value loss - entropy bonus on one minibatch.

    Advantages are whitened per minibatch. Returns the loss and its parts (detached).
    """
    logp, ent, value = model(mb.obs, mb.actions)
    adv = (mb.advantages - mb.advantages.mean()) / (mb.advantages.std() + 1e-8)
    ones = torch.ones_like(logp)[:, None]
    high = s.clip if s.clip_high is None else s.clip_high
    pol = policy_loss(logp[:, None], mb.logprobs[:, None], adv[:, None], ones, s.clip, high)
    v_loss = value_loss(value[:, None], mb.values[:, None], mb.returns[:, None], ones, s.value_clip)
    entropy = ent.mean()
    loss = pol.loss + s.value_coef * v_loss - s.entropy_coef * entropy
    parts = {
        "loss/policy": pol.loss,
        "loss/value": v_loss,
        "loss/entropy": entropy,
        "loss/approx_kl": pol.approx_kl,
        "loss/clip_frac": pol.clip_frac,
    }
    return loss, {k: v.detach() for k, v in parts.items()}


def ppo_epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Transitions,
    s: PPOSettings,
    generator: torch.Generator,
    rank: int = 0,
    world: int = 1,
    before_step: Callable[[], None] | None = None,
) -> dict[str, float]:
    """``s.epochs`` passes of ``s.minibatches`` minibatches; this rank trains every
    ``world``-th row of each minibatch (the generator must be seeded alike on every rank).

    Args:
        before_step: called before every optimizer step (sets that step's learning rate).

    Returns:
        Mean of each loss part over the optimizer steps, and ``grad_norm``.
    """
    rows = batch.obs.shape[0]
    size = rows // s.minibatches
    sums: dict[str, float] = {}
    count = 0
    for _ in range(s.epochs):
        perm = torch.randperm(rows, generator=generator).to(batch.obs.device)
        for k in range(s.minibatches):
            index = perm[k * size : (k + 1) * size][rank::world]
            loss, parts = ppo_loss(model, batch.rows(index), s)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            params = [p for p in model.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, s.grad_clip or float("inf"))
            if before_step is not None:
                before_step()
            optimizer.step()
            parts["grad_norm"] = norm
            for key, v in parts.items():
                sums[key] = sums.get(key, 0.0) + float(v)
            count += 1
    return {k: v / count for k, v in sums.items()}
