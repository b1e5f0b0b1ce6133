"""Scored rollout rows of uneven response lengths for the engine tests, built the same way by
every test (and by every spawned rank, which imports this module by name).

A uniquely named module (not conftest) so test files and spawned ranks can import it.
"""

from __future__ import annotations

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.update import UpdateSettings, add_advantages
from rltrain.config.schema import RunConfig


def scored_rows(
    run: RunConfig, lengths: list[int], rewards: list[float], group_size: int, seed: int = 0
) -> RolloutBatch:
    """Rows with 3 prompt tokens and responses of ``lengths`` tokens (padded to 4), their
    ``rewards`` in groups of ``group_size``, advantages computed by ``run``'s algorithm.

    Args:
        run: the run config (its algorithm computes the advantages).
        lengths: response tokens per row (at most 4).
        rewards: one reward per row.
        group_size: samples per prompt.
        seed: draws the token ids.

    Returns:
        The batch, advantages set.
    """
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    mask = (torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]).float()
    batch = RolloutBatch(
        prompt_ids=torch.randint(3, 20, (n, 3), generator=g),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        response_ids=torch.randint(3, 20, (n, 4), generator=g) * mask.long(),
        response_mask=mask,
        group_size=group_size,
        rewards=torch.tensor(rewards),
    )
    return add_advantages(batch, UpdateSettings.from_config(run))
