"""The time-to-accuracy extras: sums over seeds, per-seed ratios, per-step cost (hand-computed)."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.trainer import _training_part


def test_training_part_sums_seeds_and_keeps_each_seed():
    seen = {
        "plain": [(1, 200, 10.0), (2, 300, 20.0)],
        "rltrain": [(1, 250, 15.0), (2, 250, 21.0)],
    }
    out = _training_part(seen)
    assert out["plain_steps"] == 500 and out["plain_training_s"] == 30.0
    assert out["rltrain_steps"] == 500 and out["rltrain_training_s"] == 36.0
    assert out["rltrain_training_time_ratio"] == pytest.approx(1.2)
    assert out["rltrain_per_step_ratio"] == pytest.approx((36 / 500) / (30 / 500))
    assert out["rltrain_seed1_ratio"] == pytest.approx(1.5)
    assert out["rltrain_seed2_ratio"] == pytest.approx(1.05)
    assert out["rltrain_seed2_steps"] == 250 and out["plain_seed1_steps"] == 200
    assert out["rltrain_seed2_training_s"] == 21.0 and out["plain_seed2_training_s"] == 20.0
    assert "one_device_steps" not in out


def test_training_part_is_empty_until_both_loops_ran():
    assert _training_part({"plain": [(1, 200, 10.0)]}) == {}
