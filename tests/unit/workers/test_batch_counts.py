"""The rollout counts the reward worker reports per shard: continued and discarded tokens."""

from __future__ import annotations

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.workers.reward import batch_counts

T = torch.tensor


def _batch(**over) -> RolloutBatch:
    fields = dict(
        prompt_ids=T([[5], [5]]),
        prompt_mask=T([[1], [1]]),
        response_ids=T([[1, 2, 3], [4, 0, 0]]),
        response_mask=T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
        truncated=T([True, False]),
        token_versions=T([[3, 4, 4], [4, -1, -1]]),
    )
    return RolloutBatch(**{**fields, **over})


def test_a_pipelined_shard_counts_continued_and_discarded_tokens():
    counts = batch_counts(_batch(discarded_tokens=6))
    # row 0 started with version 3 and went on with 4 (2 tokens); row 1 is all version 4;
    # the oldest version any token was sampled with is 3 (the -1 outside the mask is no token)
    assert counts == {
        "response/truncated": 1,
        "rollout/discarded_tokens": 6,
        "rollout/continued_tokens": 2,
        "rollout/oldest_version": 3,
    }


def test_a_synchronous_shard_reports_no_rollout_counts():
    assert batch_counts(_batch()) == {"response/truncated": 1}
