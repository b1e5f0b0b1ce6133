"""One RL update over a rollout batch: advantages, then epochs of minibatch steps.

:func:`actor_loss` is the per-minibatch objective (what a distributed actor calls between its
own backward and optimizer steps); :func:`ppo_update` is the single-process loop around it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.advantages import compute_advantages
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.critic import ValueModel, compute_values
from rltrain.algorithms.logprobs import compute_logprobs
from rltrain.algorithms.losses import aggregate, kl_penalty, policy_loss, value_loss
from rltrain.errors import ConfigError


@dataclass(frozen=True)
class UpdateSettings:
    """Everything an update needs from the config, fixed once per run.

    Field meanings are those of ``algorithm.*``; ``grad_clip`` is ``optimizer.grad_clip``,
    ``temperature`` and ``max_new_tokens`` are ``rollout.*``.
    """

    advantage_estimator: str = "grpo"
    norm_adv_by_std: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token_mean"
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    ppo_epochs: int = 1
    num_minibatches: int = 1
    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.2
    value_coef: float = 0.5
    grad_clip: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = 4

    @classmethod
    def from_config(cls, run_cfg: Any) -> UpdateSettings:
        """Collect the settings from a :class:`rltrain.config.schema.RunConfig`."""
        a, o, r = run_cfg.algorithm, run_cfg.optimizer, run_cfg.rollout
        names = (
            "advantage_estimator norm_adv_by_std clip_low clip_high loss_agg entropy_coef kl_coef "
            "kl_estimator kl_in ppo_epochs num_minibatches gamma lam value_clip value_coef"
        ).split()
        return cls(
            **{n: getattr(a, n) for n in names},
            grad_clip=o.grad_clip,
            temperature=r.temperature,
            max_new_tokens=r.max_new_tokens,
        )

    @property
    def uses_reference(self) -> bool:
        """True when a KL to the reference policy enters the reward or the loss."""
        return self.kl_coef > 0


def minibatch_indices(
    batch_size: int, num_minibatches: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """Split a shuffled ``0..batch_size-1`` into ``num_minibatches`` near-equal index sets.

    Raises:
        ConfigError: more minibatches than sequences.
    """
    if not 1 <= num_minibatches <= batch_size:
        raise ConfigError(
            f"algorithm.num_minibatches={num_minibatches} must be between 1 and the "
            f"{batch_size} sequences of a step (train_batch_size * n_samples_per_prompt)"
        )
    perm = torch.randperm(batch_size, generator=generator)
    return list(torch.tensor_split(perm, num_minibatches))


def add_advantages(batch: RolloutBatch, s: UpdateSettings) -> RolloutBatch:
    """Fill ``advantages`` (and ``returns`` for GAE) from rewards, reference and values.

    Args:
        batch: needs ``rewards``; ``ref_logprobs`` and ``old_logprobs`` when the KL is in the
            reward; ``values`` for GAE.
        s: the settings.

    Returns:
        The batch with ``advantages`` (and ``returns``) set.

    Raises:
        ConfigError: a field the settings need is missing.
    """
    if batch.rewards is None:
        raise ConfigError("the rollout batch has no rewards: score it before the update")
    token_kl = None
    if s.kl_in == "reward" and s.kl_coef > 0:
        if batch.ref_logprobs is None or batch.old_logprobs is None:
            raise ConfigError("algorithm.kl_in='reward' needs old and reference log-probs")
        token_kl = s.kl_coef * kl_penalty(batch.old_logprobs, batch.ref_logprobs, s.kl_estimator)
    adv, returns = compute_advantages(
        s.advantage_estimator,
        batch.rewards,
        batch.response_mask,
        group_size=batch.group_size,
        norm_by_std=s.norm_adv_by_std,
        token_kl=token_kl,
        values=batch.values,
        gamma=s.gamma,
        lam=s.lam,
    )
    return batch.replace(advantages=adv, returns=returns)


def actor_loss(
    model: torch.nn.Module, mb: RolloutBatch, s: UpdateSettings
) -> tuple[Tensor, dict[str, float]]:
    """The policy objective of one minibatch: clipped surrogate + KL loss - entropy bonus.

    Args:
        model: the policy being trained.
        mb: a minibatch with ``advantages``; ``old_logprobs`` (if missing, the current
            log-probs, detached, stand in: exact for one on-policy step); ``ref_logprobs`` when
            the KL is in the loss.
        s: the settings.

    Returns:
        ``(loss, metrics)``; call ``loss.backward()``.
    """
    logp, ent = compute_logprobs(
        model,
        mb.input_ids,
        mb.attention_mask,
        mb.response_mask,
        temperature=s.temperature,
        with_entropy=True,
    )
    old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
    mask = mb.response_mask
    pg = policy_loss(
        logp, old, mb.advantages, mask, s.clip_low, s.clip_high, s.loss_agg, s.max_new_tokens
    )
    entropy = aggregate(ent, mask, s.loss_agg, s.max_new_tokens)
    loss = pg.loss - s.entropy_coef * entropy
    metrics = {
        "actor/pg_loss": pg.loss.item(),
        "actor/clip_frac": pg.clip_frac.item(),
        "actor/approx_kl": pg.approx_kl.item(),
        "actor/entropy": entropy.item(),
    }
    if s.kl_in == "loss" and s.kl_coef > 0:
        if mb.ref_logprobs is None:
            raise ConfigError("algorithm.kl_in='loss' with kl_coef > 0 needs reference log-probs")
        kl = aggregate(kl_penalty(logp, mb.ref_logprobs, s.kl_estimator), mask, s.loss_agg)
        loss = loss + s.kl_coef * kl
        metrics["actor/kl_loss"] = kl.item()
    return loss, metrics


def critic_loss(critic: ValueModel, mb: RolloutBatch, s: UpdateSettings) -> tuple[Tensor, dict]:
    """The clipped value loss of one minibatch (scaled by ``value_coef``).

    Args:
        critic: the value model.
        mb: a minibatch with ``values`` (at rollout time) and ``returns``.
        s: the settings.

    Returns:
        ``(loss, metrics)``.
    """
    v = compute_values(critic, mb.input_ids, mb.attention_mask, mb.response_mask)
    vl = value_loss(v, mb.values, mb.returns, mb.response_mask, s.value_clip, "token_mean")
    return s.value_coef * vl, {"critic/value_loss": vl.item()}


def _step(params: Any, optimizer: torch.optim.Optimizer, loss: Tensor, grad_clip: float) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    return float(norm)


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    s: UpdateSettings,
    *,
    critic: ValueModel | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Train on one rollout batch: ``ppo_epochs`` passes of ``num_minibatches`` steps each.

    Args:
        model: the policy (put in train mode for the call).
        optimizer: its optimizer.
        batch: a batch with ``advantages`` (see :func:`add_advantages`).
        s: the settings.
        critic: the value model, trained alongside when given (needs ``returns`` and ``values``).
        critic_optimizer: its optimizer.
        generator: shuffles the minibatches.

    Returns:
        Metrics averaged over the minibatch steps.
    """
    if batch.old_logprobs is None and (s.ppo_epochs > 1 or s.num_minibatches > 1):
        # Later steps must compare against the policy that sampled, not the updated one.
        with torch.no_grad():
            old = compute_logprobs(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.response_mask,
                temperature=s.temperature,
            )
        batch = batch.replace(old_logprobs=old)
    model.train()
    sums: dict[str, float] = defaultdict(float)
    steps = 0
    for _ in range(s.ppo_epochs):
        for idx in minibatch_indices(batch.size, s.num_minibatches, generator):
            mb = batch.select(idx)
            loss, metrics = actor_loss(model, mb, s)
            metrics["actor/grad_norm"] = _step(model.parameters(), optimizer, loss, s.grad_clip)
            if critic is not None and critic_optimizer is not None:
                closs, cm = critic_loss(critic, mb, s)
                _step(critic.parameters(), critic_optimizer, closs, s.grad_clip)
                metrics.update(cm)
            for k, v in metrics.items():
                sums[k] += v
            steps += 1
    return {k: v / steps for k, v in sums.items()}
