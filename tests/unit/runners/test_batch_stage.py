"""The runner's batch stage: which scored rows a step trains on (DAPO's dynamic sampling)."""

from __future__ import annotations

import torch

from rltrain.runners.batch_stage import AllRows, GroupFilter


def test_group_filter_generates_until_the_batch_is_full():
    stage = GroupFilter(groups=2, group_size=2, rounds=3)
    first = [torch.tensor([1.0, 1, 0, 1])]  # one informative group of 2
    assert stage.select(first, final=False) is None
    sel = stage.select([*first, torch.tensor([0.0, 0, 1, 0])], final=False)
    assert sel.rows.tolist() == [2, 3, 6, 7]
    assert sel.metrics["batch/dropped_group_share"] == 0.5
    assert sel.metrics["batch/generation_rounds"] == 2.0
    assert sel.metrics["batch/topped_up_groups"] == 0.0
    assert (stage.data_index(5, 0), stage.data_index(5, 2)) == (15, 17)


def test_group_filter_tops_up_with_dropped_groups_when_rounds_run_out():
    sel = GroupFilter(groups=2, group_size=2, rounds=1).select([torch.tensor([1.0, 1, 0, 0])], True)
    assert sel.rows.tolist() == [0, 1, 2, 3]
    assert sel.metrics["batch/topped_up_groups"] == 2.0


def test_all_rows_is_the_identity():
    stage = AllRows()
    assert stage.select([torch.ones(4)], final=True).rows is None
    assert (stage.rounds, stage.data_index(7, 0), stage.needs_scores) == (1, 7, False)


def test_group_filter_counts_only_scored_rows():
    # a failed episode's reward is a 0.0 placeholder: three 1.0 and one failed row are no signal
    stage = GroupFilter(groups=1, group_size=4, rounds=4)
    first = torch.tensor([1.0, 1, 1, 0])
    assert stage.select([first], final=False, scored=[torch.tensor([1, 1, 1, 0]).bool()]) is None
    # one scored row is no signal either; two scored rows that differ are
    lone, pair = torch.tensor([1.0, 0, 0, 0]), torch.tensor([1.0, 0, 0, 0])
    masks = [torch.tensor([1, 1, 1, 0]).bool(), torch.tensor([1, 0, 0, 0]).bool()]
    assert stage.select([first, lone], final=False, scored=masks) is None
    masks.append(torch.tensor([1, 1, 0, 0]).bool())
    sel = stage.select([first, lone, pair], final=False, scored=masks)
    assert sel.rows.tolist() == [8, 9, 10, 11]
    assert sel.metrics["batch/dropped_group_share"] == 2 / 3


def test_group_filter_without_masks_scores_every_row():
    stage = GroupFilter(groups=1, group_size=2, rounds=1)
    sel = stage.select([torch.tensor([1.0, 0]), torch.tensor([1.0, 1])], True, [None, None])
    assert sel.rows.tolist() == [0, 1]
    assert sel.metrics["batch/dropped_group_share"] == 0.5
