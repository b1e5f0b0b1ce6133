"""The summary of an embodied run that ended with an exception has the fields a finished
embodied run's has, over the steps it finished: its three stages (not ``env_step`` and
``infer``, parts of ``generate``), simulator steps per second, the last returns, the simulator."""

from __future__ import annotations

import pytest
from composed import composed_run

from rltrain import app


def _record(step: int, generate: float, train: float, sync: float, **extra) -> dict:
    total = generate + train + sync
    return {
        "step": step,
        "time/generate_s": generate,
        "time/train_s": train,
        "time/sync_s": sync,
        "time/env_step_s": generate / 2,  # a part of generate
        "time/infer_s": generate / 4,  # a part of generate
        "time/step_s": total,
        "perf/env_steps_per_s": 64 / total,  # 64 simulator steps an update
        **extra,
    }


def test_a_failed_embodied_run_summarises_what_it_finished_as_a_finished_one_would():
    run = composed_run("experiment=cartpole_hybrid")
    records = [
        _record(0, 1.0, 0.5, 0.5, **{"env/return_mean": 10.0, "eval/return_mean": 12.0}),
        _record(1, 2.0, 1.0, 1.0, **{"env/return_mean": 20.0}),
    ]
    attempts = [{"attempt": 1, "first_step": 0, "done_steps": 2, "training_s": 8.0}]
    summary = app.ended_summary(run, RuntimeError("EnvWorker died"), attempts, [], records)
    assert summary["status"] == "failed" and summary["steps"] == 2
    assert summary["steps_per_s"] == pytest.approx(2 / 8.0)
    # 64 simulator steps an update at 0.25 updates a second
    assert summary["env_steps_per_s"] == pytest.approx(64 * 0.25)
    assert summary["seconds_per_stage"] == pytest.approx(
        {"generate": 1.5, "train": 0.75, "sync": 0.75}
    )
    assert summary["final_reward"] == 20.0 and summary["final_return"] == 12.0
    assert summary["env_id"] == run.task.env_id == "CartPole-v1"


def test_a_reasoning_run_that_failed_gets_no_embodied_fields():
    records = [{"step": 0, "time/generate_s": 1.0, "time/train_s": 1.0, "reward/mean": 0.5}]
    attempts = [{"attempt": 1, "first_step": 0, "done_steps": 1, "training_s": 2.0}]
    summary = app.ended_summary(composed_run(), RuntimeError("x"), attempts, [], records)
    assert "env_id" not in summary and "final_return" not in summary
    assert summary["seconds_per_stage"] == {"generate": 1.0, "train": 1.0}
