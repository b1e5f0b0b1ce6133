"""A small generated batch for the training engines' unit tests: 2 prompts x 4 samples of
3 prompt and 4 response tokens, made from a fixed seed."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rltrain.algorithms.batch import RolloutBatch

#: Response lengths of the 8 rows (at most 4 tokens) and their rewards.
LENGTHS = (1, 2, 4, 3, 4, 1, 2, 3)
REWARDS = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0)


def toy_batch(lengths: Sequence[int] = LENGTHS, rewards: Sequence[float] = REWARDS) -> RolloutBatch:
    """Eight rows in groups of 4, token ids 3-19 from seed 0, responses masked to ``lengths``."""
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(4)[None, :] < torch.tensor(list(lengths))[:, None]).float()
    return RolloutBatch(
        prompt_ids=torch.randint(3, 20, (8, 3), generator=g),
        prompt_mask=torch.ones(8, 3, dtype=torch.long),
        response_ids=torch.randint(3, 20, (8, 4), generator=g) * mask.long(),
        response_mask=mask,
        group_size=4,
        rewards=None if rewards is None else torch.tensor(list(rewards), dtype=torch.float32),
    )
