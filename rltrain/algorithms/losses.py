"""Policy, value, KL and entropy terms (pure torch).

Every per-token term is ``[B, R]`` over response tokens and reduced by :func:`aggregate`, so the
same aggregation mode applies to the policy loss, the KL loss and the entropy bonus.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rltrain.errors import ConfigError

LOSS_AGGS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


def aggregate(values: Tensor, mask: Tensor, mode: str, norm_len: int | None = None) -> Tensor:
    """Reduce a per-token term to a scalar.

    Modes (``m`` the mask, ``B`` rows, ``R`` columns):
      - ``token_mean``: ``sum(v*m) / sum(m)``: every token weighs the same.
      - ``seq_mean_token_sum``: ``mean_b sum_t v*m``: sum per sequence, mean over sequences.
      - ``seq_mean_token_mean``: ``mean_b (sum_t v*m / sum_t m)``: every sequence weighs the same.
      - ``seq_mean_token_sum_norm``: ``sum(v*m) / (B * norm_len)``: Dr. GRPO's constant
        normaliser (``norm_len`` defaults to ``R``), free of a length bias.

    Args:
        values: ``[B, R]``.
        mask: ``[B, R]``, 1 on tokens that count.
        mode: one of :data:`LOSS_AGGS` (``algorithm.loss_agg``).
        norm_len: the constant length of ``seq_mean_token_sum_norm``.

    Returns:
        A scalar tensor (0 when the mask is empty).

    Raises:
        ConfigError: an unknown mode.
    """
    m = mask.to(values.dtype)
    masked = values * m
    if mode == "token_mean":
        return masked.sum() / m.sum().clamp(min=1.0)
    if mode == "seq_mean_token_sum":
        return masked.sum(dim=1).mean()
    if mode == "seq_mean_token_mean":
        return (masked.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)).mean()
    if mode == "seq_mean_token_sum_norm":
        length = norm_len if norm_len is not None else values.shape[1]
        return masked.sum() / (values.shape[0] * length)
    raise ConfigError(f"algorithm.loss_agg={mode!r} is not valid: choose one of {list(LOSS_AGGS)}")


@dataclass(frozen=True)
class PolicyLossOutput:
    """The clipped surrogate and its diagnostics (scalars)."""

    loss: Tensor
    clip_frac: Tensor  # share of response tokens whose ratio was clipped
    approx_kl: Tensor  # k3 estimate of KL(old || new) over response tokens
    ratio_mean: Tensor


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    loss_agg: str = "token_mean",
    norm_len: int | None = None,
    is_weights: Tensor | None = None,
) -> PolicyLossOutput:
    """PPO's clipped surrogate with separate lower and upper clip ranges.

    Per token, with ``ratio = exp(logprobs - old_logprobs)``:
    ``w * max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``, then aggregated;
    ``w`` is the token's importance weight (:func:`truncated_is_weights`), 1 without one.

    Args:
        logprobs: ``[B, R]`` under the policy being trained (with grad).
        old_logprobs: ``[B, R]`` under the policy that generated the batch.
        advantages: ``[B, R]``.
        response_mask: ``[B, R]``.
        clip_low: lower clip range (``algorithm.clip_low``).
        clip_high: upper clip range (``algorithm.clip_high``; larger is DAPO's clip-higher).
        loss_agg: see :func:`aggregate`.
        norm_len: see :func:`aggregate`.
        is_weights: ``[B, R]`` per-token importance weights, no gradient (the truncated
            ``pi_old / pi_rollout`` of ``algorithm.tis_cap``), or None.

    Returns:
        The loss and its diagnostics.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    mask = response_mask.to(per_token.dtype)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        clip_frac = ((clipped > unclipped).to(mask.dtype) * mask).sum() / n
        approx_kl = ((torch.exp(-log_ratio) - 1 + log_ratio) * mask).sum() / n
        ratio_mean = (ratio * mask).sum() / n
    loss = aggregate(per_token, mask, loss_agg, norm_len)
    return PolicyLossOutput(loss, clip_frac, approx_kl, ratio_mean)


def truncated_is_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance weights of the tokens: ``min(pi_old / pi_rollout, cap)``.

    They correct for the rollout sampling from ``pi_rollout`` (another engine's numerics, or
    older weights) while the clipped ratio is taken against ``pi_old`` (verl's TIS). No
    gradient flows through them.

    Args:
        old_logprobs: ``[B, R]`` log pi_old of the sampled tokens.
        rollout_logprobs: ``[B, R]`` log pi_rollout, as the rollout recorded them.
        cap: ``C`` (``algorithm.tis_cap``, at least 1).

    Returns:
        ``[B, R]`` weights in ``(0, cap]`` (masked tokens, whose log-probs are both 0, get 1).
    """
    return torch.exp(old_logprobs.detach() - rollout_logprobs).clamp(max=cap)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens.

    With ``d = logprobs - ref_logprobs`` (log of ``pi/pi_ref`` at the sampled token):
    ``k1 = d``; ``k2 = d**2 / 2``; ``k3 = exp(-d) - 1 + d`` (unbiased and non-negative).

    Args:
        logprobs: ``[B, R]`` under the policy.
        ref_logprobs: ``[B, R]`` under the reference.
        kind: ``k1`` | ``k2`` | ``k3`` (``algorithm.kl_estimator``).

    Returns:
        ``[B, R]`` per-token KL estimates.

    Raises:
        ConfigError: an unknown kind.
    """
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return torch.exp(-d) - 1.0 + d
    raise ConfigError(
        f"algorithm.kl_estimator={kind!r} is not valid: choose one of {list(KL_ESTIMATORS)}"
    )


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position.

    Args:
        logits: ``[..., V]``.

    Returns:
        ``[...]`` entropies in nats.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    clip: float | None = 0.2,
    loss_agg: str = "token_mean",
) -> Tensor:
    """PPO's clipped value loss: ``0.5 * max((V - G)^2, (clip(V, V_old +- clip) - G)^2)``.

    Args:
        values: ``[B, R]`` current critic values (with grad).
        old_values: ``[B, R]`` critic values at rollout time.
        returns: ``[B, R]`` value targets.
        response_mask: ``[B, R]``.
        clip: value clip range; None or 0 disables clipping.
        loss_agg: see :func:`aggregate`.

    Returns:
        A scalar loss.
    """
    err = (values - returns).square()
    if clip:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped - returns).square())
    return 0.5 * aggregate(err, response_mask, loss_agg)
