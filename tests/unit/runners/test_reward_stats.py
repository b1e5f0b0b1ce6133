"""A step's reward metrics leave infra-failed episodes out (they have no score)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.runners.stages import reward_stats
from rltrain.workers.reward import Scores, scored_rows


def _scores(rewards, scored=None) -> Scores:
    r = torch.tensor(rewards)
    s = None if scored is None else torch.tensor(scored)
    return Scores(r, torch.ones(len(rewards), dtype=torch.long), {}, s)


def test_failed_episodes_are_left_out_of_the_mean_and_std():
    # shard 1: rewards 1, 0 (the 0 failed); shard 2: 0, 1, 1 all scored -> scored 1, 0, 1, 1
    stats = reward_stats([_scores([1.0, 0.0], [True, False]), _scores([0.0, 1.0, 1.0])])
    assert stats["reward/mean"] == pytest.approx(0.75)
    assert stats["reward/std"] == pytest.approx(0.5)  # sample std of 1, 0, 1, 1


def test_every_row_scored_is_the_plain_mean():
    stats = reward_stats([_scores([1.0, 0.0, 0.5])])
    assert stats == {"reward/mean": pytest.approx(0.5), "reward/std": pytest.approx(0.5)}


def test_a_step_where_every_episode_failed_reports_no_reward():
    assert reward_stats([_scores([0.0, 0.0], [False, False])]) == {}


def test_scored_rows_follow_the_batch_infra_failed_mask():
    ids = torch.zeros(3, 2, dtype=torch.long)
    batch = RolloutBatch(ids, torch.ones_like(ids), ids, torch.ones_like(ids), group_size=3)
    assert scored_rows(batch) is None
    failed = dataclasses.replace(batch, infra_failed=torch.tensor([False, True, False]))
    assert scored_rows(failed).tolist() == [True, False, True]
