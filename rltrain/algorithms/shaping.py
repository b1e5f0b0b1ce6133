"""DAPO's batch shaping (Yu et al. 2025): which rows train, and the overlong reward penalty.

- **Dynamic sampling** (``algorithm.filter_groups``): a prompt group whose rewards are all
  equal has zero advantage under a group estimator and gives no gradient; such groups are
  dropped and more are generated (:func:`informative_groups`, used by the runner's batch
  stage).
- **Overlong shaping** (``algorithm.overlong_buffer``, ``algorithm.overlong_penalty``):
  :func:`overlong_penalties`.
- **Overlong filtering** (``algorithm.mask_truncated``): :func:`without_truncated`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rltrain.algorithms.batch import RolloutBatch
from rltrain.errors import ConfigError


def informative_groups(rewards: Tensor, group_size: int, scored: Tensor | None = None) -> Tensor:
    """Which prompt groups have rewards that differ (a group-based advantage is not all 0).

    With ``scored``, only the scored rows count: the advantage step leaves unscored
    (infra-failed) rows out of the group statistics and gives them no advantage, so their
    placeholder reward must not make a group of equal scored rewards look informative; a group
    then needs two scored rows whose rewards differ.

    Args:
        rewards: ``[B]`` rewards, groups of ``group_size`` consecutive rows.
        group_size: samples per prompt.
        scored: ``[B]`` bool, True where the row has a reward; None: every row.

    Returns:
        ``[B / group_size]`` bool, True where the group's (scored) rewards are not all equal.

    Raises:
        ConfigError: ``B`` is not a multiple of ``group_size``.
    """
    if group_size < 1 or rewards.numel() % group_size:
        raise ConfigError(
            f"{rewards.numel()} rewards do not split into groups of rollout.n_samples_per_prompt"
            f"={group_size}"
        )
    g = rewards.reshape(-1, group_size)
    if scored is None:
        return (g != g[:, :1]).any(dim=1)
    ok = scored.reshape(-1, group_size)
    high = torch.where(ok, g, torch.full_like(g, -torch.inf)).max(dim=1).values
    low = torch.where(ok, g, torch.full_like(g, torch.inf)).min(dim=1).values
    return (ok.sum(dim=1) >= 2) & (high > low)


def overlong_penalties(response_mask: Tensor, budget: int, buffer: int, penalty: float) -> Tensor:
    """DAPO's soft overlong punishment, one reward term per response.

    With ``L`` the response's tokens (EOS included), ``b`` the buffer and the budget
    ``L_max``: ``0`` for ``L <= L_max - b``, then ``-penalty * (L - (L_max - b)) / b``, reaching
    ``-penalty`` at the budget.

    Args:
        response_mask: ``[B, R]``, 1 on response tokens.
        budget: ``rollout.max_new_tokens``.
        buffer: ``algorithm.overlong_buffer`` (0: no penalty).
        penalty: ``algorithm.overlong_penalty``.

    Returns:
        ``[B]`` penalties (``<= 0``; all zero when ``overlong_buffer`` is 0).
    """
    lengths = response_mask.float().sum(dim=1)
    if buffer <= 0:
        return torch.zeros_like(lengths)
    over = ((lengths - (budget - buffer)) / buffer).clamp(0.0, 1.0)
    return -float(penalty) * over


def without_truncated(batch: RolloutBatch) -> RolloutBatch:
    """The batch with the responses the token budget cut (``truncated``) out of the loss: their
    response mask is zeroed, so no loss term, KL or entropy reads them and token-mean
    aggregations do not count their tokens. Call it after the advantages are computed: the
    rows still count in their groups' statistics.

    Raises:
        ConfigError: the batch does not say which rows were cut.
    """
    if batch.truncated is None:
        raise ConfigError(
            "algorithm.mask_truncated=true but the batch carries no truncated flags (both "
            "generation engines set them; a batch built by hand needs truncated=[B] bool)"
        )
    keep = (~batch.truncated.bool()).to(batch.response_mask.dtype)
    loss = None if batch.loss_mask is None else batch.loss_mask * keep[:, None]  # multi-turn
    return batch.replace(response_mask=batch.response_mask * keep[:, None], loss_mask=loss)
