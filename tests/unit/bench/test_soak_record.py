"""soak's per-process memory figures from hand-made samples (no runs)."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.soak import SoakRecord, is_ray_service

MIB = 2**20


def test_four_samples_the_quick_mode_takes_leave_out_the_warm_up_and_give_three_readings():
    # one sample per step of --quick's 4: the first is the warm-up's and is not a start
    rec = SoakRecord(
        rss=[
            {"driver[1]": 50 * MIB, "raylet[2]": 10 * MIB},
            {"driver[1]": 100 * MIB, "raylet[2]": 20 * MIB},
            {"driver[1]": 101 * MIB, "raylet[2]": 20 * MIB},
            {"driver[1]": 102 * MIB, "raylet[2]": 21 * MIB},
        ]
    )
    growth = rec.growth()
    assert growth["driver[1]"] == pytest.approx(0.02)  # 100 -> 102, not 50 -> 102
    assert growth["raylet[2]"] == pytest.approx(0.05)
    # after warm-up, half-way and end are samples 1, 2 and 3; largest growth first
    raylet, driver = rec.table().splitlines()
    assert "20.0 ->    20.0 ->    21.0 MiB" in raylet and "+5.00 %" in raylet
    assert "100.0 ->   101.0 ->   102.0 MiB" in driver and "second half +0.99 %" in driver


def test_too_few_samples_give_no_figure():
    rec = SoakRecord(rss=[{"driver[1]": MIB}, {"driver[1]": MIB}])
    assert rec.growth() == {} and rec.table() == "(too few samples)"


def test_ray_services_are_told_from_rltrains_processes():
    assert is_ray_service("raylet[2]") and is_ray_service("gcs_server[3]")
    assert not is_ray_service("driver[1]") and not is_ray_service("ray::FusedWorker[4]")
