"""Policy, value, KL and entropy terms (pure torch).

Every per-token term is ``[B, R]`` over response tokens and reduced by :func:`aggregate`, so the
same aggregation mode applies to the policy loss, the KL loss and the entropy bonus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.registry import PolicyLossInputs, register_policy_loss
from rltrain.config.algorithms import KL_ESTIMATORS, LOSS_AGGS
from rltrain.errors import ConfigError

__all__ = ["KL_ESTIMATORS", "LOSS_AGGS"]  # re-exported: the algorithms package names them


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
    is_weights: Tensor | None = None  # [B, R] the importance weights applied, no gradient


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
        # k3 for KL(old || new) from tokens sampled by old: (r - 1) - log r, r = new / old
        approx_kl = ((torch.expm1(log_ratio) - log_ratio) * mask).sum() / n
        ratio_mean = (ratio * mask).sum() / n
    loss = aggregate(per_token, mask, loss_agg, norm_len)
    return PolicyLossOutput(loss, clip_frac, approx_kl, ratio_mean)


@register_policy_loss("ppo_clip")
def ppo_clip_loss(x: PolicyLossInputs, algorithm: Any) -> PolicyLossOutput:
    """``algorithm.policy_loss=ppo_clip``: :func:`policy_loss` with the run's clip ranges and
    aggregation, each token weighted by ``min(pi_old / pi_rollout, tis_cap)`` when
    ``x.rollout_logprobs`` is given.

    Args:
        x: the tensors.
        algorithm: the run's :class:`~rltrain.config.schema.AlgorithmConfig`.

    Returns:
        The loss and its diagnostics.
    """
    weights = None
    if x.rollout_logprobs is not None and algorithm.tis_cap is not None:
        weights = truncated_is_weights(x.old_logprobs, x.rollout_logprobs, algorithm.tis_cap)
    out = policy_loss(
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        x.response_mask,
        algorithm.clip_low,
        algorithm.clip_high,
        algorithm.loss_agg,
        x.norm_len,
        is_weights=weights,
    )
    return PolicyLossOutput(out.loss, out.clip_frac, out.approx_kl, out.ratio_mean, weights)


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` log of GSPO's sequence ratio: the mean over a response's tokens of
    ``log pi_new - log pi_old``, i.e. ``log (pi_new(y) / pi_old(y)) ** (1 / |y|)`` (0 for an
    empty response)."""
    m = mask.to(logprobs.dtype)
    return ((logprobs - old_logprobs) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


#: GSPO's sequence log-ratio is clamped here before ``exp`` (a ratio of e^10 is clipped anyway).
_MAX_LOG_RATIO = 10.0


@register_policy_loss("gspo")
def gspo_loss(x: PolicyLossInputs, algorithm: Any) -> PolicyLossOutput:
    """``algorithm.policy_loss=gspo``: Group Sequence Policy Optimization (Zheng et al. 2025).

    One importance ratio per response, ``s_i = (pi_new(y_i) / pi_old(y_i)) ** (1 / |y_i|)``
    (:func:`sequence_log_ratio`), clipped to ``[1 - clip_low, 1 + clip_high]`` as a whole: per
    token, ``max(-A_t * s_i, -A_t * clip(s_i))`` with the gradient of GSPO-token,
    ``s_i * grad log pi(y_t)`` (the value is ``s_i``, the gradient flows through each token's
    own log-prob), then aggregated by ``algorithm.loss_agg`` (``seq_mean_token_mean`` is the
    paper's per-sequence mean; with an advantage constant over a response every choice gives
    the paper's objective up to the weighting of sequences). The paper's clip ranges are
    ``3e-4`` / ``4e-4`` (``conf/algorithm/gspo.yaml``).

    With a recomputed pi_old and the rollout's log-probs (``x.rollout_logprobs``), the
    truncated importance correction is taken at the same level as the ratio: one weight per
    response, ``min(exp(mean_t(log pi_old - log pi_rollout)), tis_cap)``, the geometric mean
    of its tokens' weights, capped; no gradient.

    Args:
        x: the tensors.
        algorithm: the run's :class:`~rltrain.config.schema.AlgorithmConfig`.

    Returns:
        The loss and its diagnostics (``ratio_mean`` is the token-weighted mean of ``s_i``).
    """
    mask = x.response_mask.to(x.logprobs.dtype)
    seq = sequence_log_ratio(x.logprobs.detach(), x.old_logprobs, mask).clamp(max=_MAX_LOG_RATIO)
    log_ratio = x.logprobs - x.logprobs.detach() + seq[:, None]
    ratio = torch.exp(log_ratio)
    unclipped = -x.advantages * ratio
    clipped = -x.advantages * torch.clamp(
        ratio, 1.0 - algorithm.clip_low, 1.0 + algorithm.clip_high
    )
    per_token = torch.maximum(unclipped, clipped)
    weights = None
    if x.rollout_logprobs is not None and algorithm.tis_cap is not None:
        seq_w = sequence_log_ratio(x.old_logprobs.detach(), x.rollout_logprobs, mask).exp()
        weights = seq_w.clamp(max=algorithm.tis_cap)[:, None].expand_as(per_token)
        per_token = per_token * weights
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        token_log_ratio = x.logprobs - x.old_logprobs
        clip_frac = ((clipped > unclipped).to(mask.dtype) * mask).sum() / n
        approx_kl = ((torch.expm1(token_log_ratio) - token_log_ratio) * mask).sum() / n
        ratio_mean = (ratio * mask).sum() / n
    loss = aggregate(per_token, mask, algorithm.loss_agg, x.norm_len)
    return PolicyLossOutput(loss, clip_frac, approx_kl, ratio_mean, weights)


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
