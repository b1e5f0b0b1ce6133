"""agent_faults' figures: learning-curve areas and the share lost, by hand."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.agent_faults import _figures


def test_areas_and_share_lost_by_hand():
    # per run: (reward/mean per step, eval accuracy per evaluation, infra-failed, records)
    seen = {
        0.0: [([0.5, 1.0], [0.5, 0.5], 0, 2), ([0.0, 0.5], [1.0], 0, 2)],
        0.1: [([0.5, 0.5], [0.5, 0.5], 3, 2), ([0.0, 0.5], [1.0], 1, 2)],
        ("episodes", 0.0): [20, 20],
        ("episodes", 0.1): [20, 20],
    }
    out = _figures(seen)
    assert out["reward_area_0.0"] == pytest.approx(0.75 + 0.25)
    assert out["reward_area_0.1"] == pytest.approx(0.5 + 0.25)
    assert out["reward_area_lost"] == pytest.approx(0.25)  # 1 - 0.75 / 1.0
    assert out["reward_goal_met"] == 0.0
    assert out["eval_area_lost"] == pytest.approx(0.0) and out["eval_goal_met"] == 1.0
    assert out["infra_failed_share_0.1"] == pytest.approx(4 / 40)


def test_quick_modes_failing_runs_alone_give_their_figures_and_no_share_lost():
    # --quick runs the 10 % rate only: no clean areas to compare with, so no share lost nor goal
    seen = {0.1: [([0.5, 0.25], [0.5], 1, 2)], ("episodes", 0.1): [16]}
    out = _figures(seen)
    assert out == pytest.approx(
        {"reward_area_0.1": 0.375, "eval_area_0.1": 0.5, "infra_failed_share_0.1": 1 / 16}
    )
