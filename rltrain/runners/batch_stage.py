"""The batch stage: which of the scored rows a step trains on.

Between scoring and training, :meth:`BatchStage.select` turns what a step generated and scored
(the *generation batch*, one or more rounds of ``prompts_per_step`` prompts) into the rows of the
*training batch* (``samples_per_step`` rows: ``sizes.samples_per_actor_rank`` per actor rank).

- :class:`AllRows` (the default): the generation batch is the training batch; the driver does
  not wait for the scores before the update starts.
- :class:`GroupFilter` (``algorithm.filter_groups=true``, DAPO's dynamic sampling): prompt groups
  whose rewards are all equal are dropped (only scored rows count: an infra-failed episode's 0.0 is
  a placeholder, so a group needs two scored rows whose rewards differ); while fewer informative
  groups than the training batch holds were found, another round of prompts is generated (at most
  ``algorithm.max_generation_batches`` rounds). When the rounds run out, the batch is topped up with
  the earliest dropped groups (their group advantage is zero).

Round ``j`` of step ``s`` generates the task's prompts of data index ``s * rounds + j``
(:meth:`BatchStage.data_index`): a pure function of the step, so a resumed run sees the same
prompts without a cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from rltrain.algorithms.shaping import informative_groups


@dataclass(frozen=True)
class Selection:
    """The training batch's rows within the generation batch.

    Attributes:
        rows: ``[samples_per_step]`` row indices into the generation batch (its shards joined
            in order), or None: every row, in order.
        metrics: the stage's step metrics (``batch/*``).
    """

    rows: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class BatchStage(Protocol):
    """Chooses the training rows of a step from its scored generation rounds."""

    #: True when :meth:`select` reads the scores (the driver then waits for them).
    needs_scores: bool
    #: Generation rounds a step may take (1: one).
    rounds: int

    def data_index(self, step: int, round_: int) -> int:
        """The task's data index of round ``round_`` of ``step``."""
        ...

    def select(
        self,
        rewards: Sequence[torch.Tensor],
        final: bool,
        scored: Sequence[torch.Tensor | None] | None = None,
    ) -> Selection | None:
        """The training rows, or None when another round must be generated first.

        Args:
            rewards: ``[b]`` rewards per shard of every round so far, in generation order.
            final: no round is left; a selection must be made.
            scored: per shard, ``[b]`` bool marking the rows that have a reward (False: an
                infra-failed episode, whose reward is a placeholder), or None: every row; None
                for all shards: every row of every shard.
        """
        ...


class AllRows:
    """Every generated row trains (the default)."""

    needs_scores = False
    rounds = 1

    def data_index(self, step: int, round_: int) -> int:
        return step

    def select(
        self,
        rewards: Sequence[torch.Tensor],
        final: bool,
        scored: Sequence[torch.Tensor | None] | None = None,
    ) -> Selection | None:
        return Selection()


class GroupFilter:
    """DAPO's dynamic sampling: keep the groups whose rewards differ.

    Args:
        groups: prompt groups the training batch holds (``sizes.prompts_per_step``).
        group_size: samples per prompt.
        rounds: at most this many generation rounds per step
            (``algorithm.max_generation_batches``).
    """

    needs_scores = True

    def __init__(self, groups: int, group_size: int, rounds: int) -> None:
        self.groups, self.group_size, self.rounds = groups, group_size, rounds

    def data_index(self, step: int, round_: int) -> int:
        return step * self.rounds + round_

    def select(
        self,
        rewards: Sequence[torch.Tensor],
        final: bool,
        scored: Sequence[torch.Tensor | None] | None = None,
    ) -> Selection | None:
        keep = informative_groups(
            torch.cat(list(rewards)).float(), self.group_size, _joined(rewards, scored)
        )
        kept = torch.nonzero(keep).flatten()
        if len(kept) < self.groups and not final:
            return None
        dropped = torch.nonzero(~keep).flatten()
        topped_up = max(self.groups - len(kept), 0)
        chosen = torch.cat([kept[: self.groups], dropped[:topped_up]]).sort().values
        rows = (chosen[:, None] * self.group_size + torch.arange(self.group_size)).flatten()
        generated = len(keep)
        return Selection(
            rows,
            {
                "batch/dropped_group_share": float((~keep).sum()) / generated,
                "batch/generation_rounds": generated / self.groups,
                "batch/topped_up_groups": float(topped_up),
            },
        )


def _joined(
    rewards: Sequence[torch.Tensor], scored: Sequence[torch.Tensor | None] | None
) -> torch.Tensor:
    """Every shard's ``scored`` mask joined (a None shard or None list: all rows scored)."""
    masks = scored if scored is not None else [None] * len(rewards)
    return torch.cat(
        [
            torch.ones(len(r), dtype=torch.bool) if m is None else m.bool()
            for r, m in zip(rewards, masks, strict=True)
        ]
    )


def batch_stage_for(run: Any, sizes: Any) -> BatchStage:
    """The run's batch stage: :class:`GroupFilter` with ``algorithm.filter_groups``, else
    :class:`AllRows`."""
    a = run.algorithm
    if a.filter_groups:
        n = run.rollout.n_samples_per_prompt
        return GroupFilter(sizes.prompts_per_step, n, a.max_generation_batches)
    return AllRows()
