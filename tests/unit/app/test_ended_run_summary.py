"""A run that ends with an exception (a worker failure with no restart left, Ctrl-C) replaces
what an earlier invocation left in its run directory: its ``summary.json`` says what this
invocation did, the reward curve is drawn again, the earlier timeline files are gone, and the
exception is still what the run raises.

The job is a stand-in that records how far it got (as the loop does) and raises; the run
directory holds an earlier completed invocation's outputs (steps 0-29) and this invocation's
records (steps 30-33), as after ``trainer.resume=auto``.
"""

from __future__ import annotations

import json
import os

import pytest
from composed import composed_run

from rltrain import app
from rltrain.errors import WorkerError
from rltrain.runners import loop
from rltrain.telemetry.summary import read_job_summary

#: The outputs only a completed run writes; the earlier invocation's must not survive.
TIMELINE = ("trace.json", "utilization.json", "trace.png")
LONG_AGO = 1_000_000_000.0  # 2001: older than any invocation of the tests


def earlier_run(run_dir) -> None:
    """An earlier completed invocation's outputs (steps 0-29) and this one's records (30-33):
    earlier steps 1,000 tokens/s, this invocation's 100 tokens/s over 2 s steps."""
    records = [
        {"step": s, "reward/mean": 0.1, "perf/tokens_per_s": 1000.0, "time/step_s": 1.0}
        for s in range(30)
    ] + [
        {"step": s, "reward/mean": s / 100, "perf/tokens_per_s": 100.0, "time/step_s": 2.0}
        for s in range(30, 34)
    ]
    records[31]["eval/accuracy"] = 0.5
    with open(run_dir / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "steps": 27}))
    for name in (*TIMELINE, "reward_curve.png"):
        (run_dir / name).write_bytes(b"earlier")
        os.utime(run_dir / name, (LONG_AGO, LONG_AGO))


def job_ending_with(monkeypatch, exc: BaseException) -> None:
    """The job resumes at step 30, finishes steps 30-33 in 8 s, then ``exc`` ends it."""

    def attempt(run, out_dir, layout):
        loop.LAST_FIT[:] = [loop.Progress(30, 34, 8.0)]
        raise exc

    monkeypatch.setattr(app, "_train_once", attempt)


def worker_failure() -> WorkerError:
    err = WorkerError("group 'actor' rank 0 (node 0, pid 1234): 'train' raised:\nboom")
    err.cause = RuntimeError("boom")
    err.where = "group 'actor' rank 0 'train'"
    return err


def test_ctrl_c_writes_an_interrupted_summary_of_this_invocations_steps(monkeypatch, tmp_path):
    earlier_run(tmp_path)
    job_ending_with(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        app.train(composed_run("placement=disaggregated"), str(tmp_path))

    summary = read_job_summary(tmp_path)
    assert summary["status"] == "interrupted" and "cause" not in summary
    assert summary["placement_mode"] == "disaggregated"
    assert summary["steps"] == 4  # steps 30-33, not the earlier invocation's 27
    assert summary["wall_s"] == 8.0 and summary["steps_per_s"] == 0.5
    assert summary["tokens_per_s"] == 100.0  # 4 steps x 200 tokens / 8 s
    assert summary["final_reward"] == 0.33 and summary["final_accuracy"] == 0.5
    assert [a["status"] for a in summary["attempts"]] == ["interrupted"]
    for name in TIMELINE:
        assert not (tmp_path / name).exists(), name
    curve = tmp_path / "reward_curve.png"
    assert curve.read_bytes()[:4] == b"\x89PNG"  # drawn again over metrics.jsonl


def test_a_worker_failure_with_no_restart_left_writes_a_failed_summary(monkeypatch, tmp_path):
    earlier_run(tmp_path)
    failure = worker_failure()
    job_ending_with(monkeypatch, failure)
    with pytest.raises(WorkerError) as info:
        app.train(composed_run("placement=disaggregated", "trainer.max_restarts=0"), str(tmp_path))
    assert info.value is failure

    summary = read_job_summary(tmp_path)
    assert summary["status"] == "failed"
    assert summary["cause"] == "RuntimeError: boom in group 'actor' rank 0 'train'"
    assert summary["steps"] == 4 and summary["tokens_per_s"] == 100.0
    assert summary["attempts"][0]["cause"] == summary["cause"]


def test_a_failure_before_the_first_step_claims_no_steps(monkeypatch, tmp_path):
    earlier_run(tmp_path)

    def attempt(run, out_dir, layout):
        raise RuntimeError("Ray could not start\nits log says more")

    monkeypatch.setattr(app, "_train_once", attempt)
    with pytest.raises(RuntimeError, match="Ray could not start"):
        app.train(composed_run("placement=disaggregated"), str(tmp_path))
    summary = read_job_summary(tmp_path)
    assert summary["status"] == "failed" and summary["cause"] == "RuntimeError: Ray could not start"
    assert summary["steps"] == 0 and summary["wall_s"] == 0.0
    assert summary["steps_per_s"] is None and summary["tokens_per_s"] is None
    assert summary["final_reward"] is None


def test_what_cannot_be_written_does_not_replace_the_failure(monkeypatch, tmp_path):
    earlier_run(tmp_path)
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.json").mkdir()  # os.replace onto it fails
    failure = worker_failure()
    job_ending_with(monkeypatch, failure)
    with pytest.raises(WorkerError) as info:
        app.train(composed_run("placement=disaggregated", "trainer.max_restarts=0"), str(tmp_path))
    assert info.value is failure
