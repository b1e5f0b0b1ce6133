"""The summary keys both runners share, by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rltrain.runners.loop import job_summary, stage_means


def _job(accelerator: str):
    nodes = [SimpleNamespace(accelerator_type=accelerator)]
    plan = SimpleNamespace(
        mode=SimpleNamespace(value="collocated"), cluster=SimpleNamespace(nodes=nodes)
    )
    return SimpleNamespace(plan=plan, residency=SimpleNamespace(peak={(0, 1): 512}))


RECORDS = [
    {"time/generate_s": 1.0, "time/train_s": 2.0, "time/step_s": 3.0},
    {"time/generate_s": 3.0, "time/step_s": 3.0},
]


def test_stage_means_count_a_missing_stage_as_zero():
    assert stage_means(RECORDS, {"generate", "train"}) == {"generate": 2.0, "train": 1.0}
    assert stage_means([], {"sync"}) == {"sync": 0.0}


def test_job_summary_by_hand():
    out = job_summary(_job("sim"), RECORDS, steps=2, seconds=4.0, status="completed")
    assert out == {
        "placement_mode": "collocated",
        "steps": 2,
        "steps_per_s": pytest.approx(0.5),
        "seconds_per_stage": {"generate": 2.0, "train": 1.0},  # time/step_s is not a stage
        "peak_memory_bytes_per_device": {"0:1": 512},
        "simulated_devices": True,
        "status": "completed",
        "wall_s": 4.0,
    }
    assert job_summary(_job("cuda"), [], 0, 0.0, "stopped")["steps_per_s"] is None
    assert job_summary(_job("cuda"), [], 0, 0.0, "stopped")["simulated_devices"] is False
