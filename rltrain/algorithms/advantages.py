"""Advantage estimators (pure torch, no model).

Outcome rewards are one number per sequence. Group estimators (GRPO, Dr. GRPO, RLOO) compare the
``n`` samples of a prompt, which sit in consecutive rows; the sequence advantage is then given to
every response token. REINFORCE++ and GAE work on per-token rewards (the outcome reward on the
last response token, minus a KL penalty per token when the KL is in the reward).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.registry import get_advantage_estimator, register_advantage_estimator
from rltrain.config.algorithms import ADVANTAGE_ESTIMATORS, group_estimators, is_group_based
from rltrain.errors import ConfigError

GROUP_ESTIMATORS = group_estimators()
ESTIMATORS = tuple(ADVANTAGE_ESTIMATORS)


def _groups(scores: Tensor, group_size: int) -> Tensor:
    if group_size < 2:
        raise ConfigError(
            f"rollout.n_samples_per_prompt={group_size}: group-based estimators need >= 2 "
            f"samples per prompt; raise it or use reinforce_pp / gae"
        )
    if scores.numel() % group_size:
        raise ConfigError(
            f"{scores.numel()} sequences do not split into groups of rollout."
            f"n_samples_per_prompt={group_size}"
        )
    return scores.view(-1, group_size)


def grpo_advantages(
    scores: Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: each score minus its group's mean, divided by the group's std.

    The std is the sample std (Bessel-corrected, as ``torch.std``); a group whose scores are all
    equal gets advantage 0.

    Args:
        scores: ``[B]`` sequence scores, groups of ``group_size`` consecutive rows.
        group_size: samples per prompt.
        norm_by_std: divide by the group std (GRPO); False gives Dr. GRPO's advantage.
        eps: added to the std.

    Returns:
        ``[B]`` advantages.

    Raises:
        ConfigError: ``group_size < 2`` or ``B`` is not a multiple of it.
    """
    g = _groups(scores.float(), group_size)
    adv = g - g.mean(dim=1, keepdim=True)
    if norm_by_std:
        adv = adv / (g.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)


def dr_grpo_advantages(scores: Tensor, group_size: int) -> Tensor:
    """Dr. GRPO: each score minus its group's mean (no std division). Shapes as GRPO's."""
    return grpo_advantages(scores, group_size, norm_by_std=False)


def rloo_advantages(scores: Tensor, group_size: int) -> Tensor:
    """RLOO: each score minus the mean of the *other* samples of its group.

    Args:
        scores: ``[B]`` sequence scores in groups of ``group_size`` consecutive rows.
        group_size: samples per prompt.

    Returns:
        ``[B]`` advantages, ``n/(n-1) * (r_i - mean)``.
    """
    g = _groups(scores.float(), group_size)
    others = (g.sum(dim=1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(-1)


def outcome_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Place each sequence's outcome reward on its last response token.

    Args:
        rewards: ``[B]`` outcome rewards.
        response_mask: ``[B, R]``, 1 on response tokens.

    Returns:
        ``[B, R]`` per-token rewards, zero except at each row's last response token (rows with
        no response token get nothing).
    """
    mask = response_mask.float()
    out = torch.zeros_like(mask)
    has = mask.sum(dim=1) > 0
    last = (mask.cumsum(dim=1) * mask).argmax(dim=1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows[has], last[has]] = rewards.float()[has]
    return out


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + gamma * G_{t'}`` over response tokens, ``t'`` the next masked token;
    zero outside the mask.

    Tokens outside the mask inside a response (a multi-turn episode's tool results) are not
    steps of the policy: the return passes through them unchanged, so an earlier turn's tokens
    get the outcome the episode ends with (as verl's multi-turn estimators skip them).

    Args:
        token_rewards: ``[B, R]`` (read on masked tokens only).
        response_mask: ``[B, R]``.
        gamma: discount, once per masked token.

    Returns:
        ``[B, R]`` returns.
    """
    mask = response_mask.float()
    out = torch.zeros_like(mask)
    running = torch.zeros_like(mask[:, 0])
    for t in reversed(range(mask.shape[1])):
        on = mask[:, t] > 0
        running = torch.where(on, token_rewards[:, t] + gamma * running, running)
        out[:, t] = running * mask[:, t]
    return out


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Normalise ``x`` to zero mean and unit variance over masked entries (population variance).

    Args:
        x: ``[B, R]`` values.
        mask: ``[B, R]``, 1 where ``x`` counts.
        eps: added to the variance.

    Returns:
        ``[B, R]`` whitened values, zero outside the mask.
    """
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m


def reinforce_pp_advantages(
    token_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0
) -> Tensor:
    """REINFORCE++: discounted returns of per-token rewards, whitened over the whole batch.

    Args:
        token_rewards: ``[B, R]`` (outcome on the last token, minus KL per token if in reward).
        response_mask: ``[B, R]``.
        gamma: discount.

    Returns:
        ``[B, R]`` advantages, zero outside the mask.
    """
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask)


def gae_advantages(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens.

    ``delta_t = r_t + gamma * V_{t'} - V_t`` with ``t'`` the next masked token and ``V`` zero
    past the last one; ``A_t = delta_t + gamma * lam * A_{t'}``; returns ``A_t + V_t``. Tokens
    outside the mask inside a response (a multi-turn episode's tool results) are not steps: the
    recursion passes through them, so an earlier turn bootstraps from the next turn's first
    token (as verl's multi-turn GAE skips them).

    Args:
        token_rewards: ``[B, R]``.
        values: ``[B, R]`` critic values of the state before each response token.
        response_mask: ``[B, R]``.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, each ``[B, R]`` and zero outside the mask (advantages are not
        whitened here; see :func:`masked_whiten`).
    """
    mask = response_mask.float()
    values = values.float() * mask
    adv = torch.zeros_like(mask)
    next_value = torch.zeros_like(mask[:, 0])
    next_adv = torch.zeros_like(mask[:, 0])
    for t in reversed(range(mask.shape[1])):
        on = mask[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = torch.where(on, delta + gamma * lam * next_adv, next_adv)
        next_value = torch.where(on, values[:, t], next_value)
        adv[:, t] = next_adv * mask[:, t]
    return adv, (adv + values) * mask


# Registered estimators: ``fn(token_rewards, mask, *, group_size, norm_by_std, values, gamma,
# lam) -> (advantages, returns or None)``, each taking the keywords it needs and ``**_``:
# valid_group_advantages calls a group estimator with group_size and norm_by_std only.
@register_advantage_estimator("grpo")
def _grpo(rewards: Tensor, mask: Tensor, *, group_size: int, norm_by_std: bool, **_: Any):
    return grpo_advantages(rewards.sum(dim=1), group_size, norm_by_std)[:, None] * mask, None


@register_advantage_estimator("dr_grpo")
def _dr_grpo(rewards: Tensor, mask: Tensor, *, group_size: int, **_: Any):
    return dr_grpo_advantages(rewards.sum(dim=1), group_size)[:, None] * mask, None


@register_advantage_estimator("rloo")
def _rloo(rewards: Tensor, mask: Tensor, *, group_size: int, **_: Any):
    return rloo_advantages(rewards.sum(dim=1), group_size)[:, None] * mask, None


@register_advantage_estimator("reinforce_pp")
def _reinforce_pp(rewards: Tensor, mask: Tensor, *, gamma: float, **_: Any):
    return reinforce_pp_advantages(rewards, mask, gamma), None


@register_advantage_estimator("gae")
def _gae(
    rewards: Tensor, mask: Tensor, *, values: Tensor | None, gamma: float, lam: float, **_: Any
):
    if values is None:
        raise ConfigError("algorithm.advantage_estimator='gae' needs critic values")
    adv, returns = gae_advantages(rewards, values, mask, gamma, lam)
    return masked_whiten(adv, mask), returns


def valid_group_advantages(
    scores: Tensor, valid: Tensor, group_size: int, estimator: str, norm_by_std: bool = True
) -> Tensor:
    """A group estimator over each group's valid rows only (infra-failed episodes left out).

    The estimator's registered function runs on each group's valid rows as a group of their
    own, so a row left out neither moves its group's mean or std nor gets an advantage (0); a
    group with fewer than two valid rows gives 0 to all. With every row valid this equals the
    estimator over the whole batch (:func:`grpo_advantages`, :func:`rloo_advantages`, ...).

    Args:
        scores: ``[B]`` sequence scores in groups of ``group_size`` consecutive rows.
        valid: ``[B]`` bool, False on the rows to leave out.
        group_size: samples per prompt.
        estimator: a group-based estimator's name (``grpo``, ``dr_grpo``, ``rloo``, or one
            registered later).
        norm_by_std: GRPO's std division.

    Returns:
        ``[B]`` advantages.
    """
    fn = get_advantage_estimator(estimator)
    scores = scores.float()
    out = torch.zeros_like(scores)
    for start in range(0, scores.shape[0], group_size):
        rows = start + torch.nonzero(valid[start : start + group_size]).flatten()
        if rows.numel() < 2:
            continue
        ones = torch.ones(rows.numel(), 1)
        adv, _ = fn(scores[rows, None], ones, group_size=rows.numel(), norm_by_std=norm_by_std)
        out[rows] = adv[:, 0]
    return out


def compute_advantages(
    estimator: str,
    rewards: Tensor,
    response_mask: Tensor,
    *,
    group_size: int = 1,
    norm_by_std: bool = True,
    token_kl: Tensor | None = None,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    valid: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token advantages (and value targets for GAE) of one batch.

    The estimator is the function registered under ``estimator``
    (:func:`~rltrain.algorithms.registry.register_advantage_estimator`); it receives the
    per-token rewards (the outcome on each row's last response token, minus ``token_kl``) and
    the mask; group estimators score each row by its rewards' sum.

    Args:
        estimator: ``grpo`` | ``dr_grpo`` | ``rloo`` | ``reinforce_pp`` | ``gae`` (the names
            of :data:`rltrain.config.algorithms.ADVANTAGE_ESTIMATORS`).
        rewards: ``[B]`` outcome rewards.
        response_mask: ``[B, R]``.
        group_size: samples per prompt (group estimators).
        norm_by_std: GRPO's std division (``algorithm.norm_adv_by_std``).
        token_kl: ``[B, R]`` KL penalty already scaled by ``kl_coef``, subtracted from the
            per-token rewards (``algorithm.kl_in=reward``); group estimators use the sequence sum.
        values: ``[B, R]`` critic values (GAE only).
        gamma: discount (REINFORCE++, GAE).
        lam: GAE lambda.
        valid: ``[B]`` bool, False on infra-failed rows (see below); None: every row counts.

    Returns:
        ``(advantages [B, R], returns [B, R] or None)``; advantages are zero outside the mask.

    Raises:
        ConfigError: an unknown estimator, too small groups, or GAE without values.

    Rows where ``valid`` is False (infra-failed episodes) are left out: of a group
    estimator's group statistics (:func:`valid_group_advantages`), and of a per-token
    estimator's returns and whitening (their mask is zeroed); they get no advantage.
    """
    fn = get_advantage_estimator(estimator)
    mask = response_mask.float()
    token_rewards = outcome_token_rewards(rewards, mask)
    if token_kl is not None:
        token_rewards = token_rewards - token_kl * mask
    if valid is not None and not bool(valid.all()):  # infra-failed episodes (task.env)
        if is_group_based(estimator):  # their groups' statistics must leave the rows out
            scores = token_rewards.sum(dim=1)
            seq = valid_group_advantages(scores, valid, group_size, estimator, norm_by_std)
            return seq[:, None] * mask, None
        # Per-token estimators read rows through the mask alone (their whitening too): a row
        # whose mask is zero is left out of every statistic and gets no advantage or return.
        mask = mask * valid[:, None].to(mask.dtype)
        token_rewards = token_rewards * mask
    return fn(
        token_rewards,
        mask,
        group_size=group_size,
        norm_by_std=norm_by_std,
        values=values,
        gamma=gamma,
        lam=lam,
    )
