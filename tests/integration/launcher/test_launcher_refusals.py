"""Sweeps check every job as a single run does, and a sweep that only plans starts no Ray.

Each sweep runs with a ``ray`` package on the path that fails to import: a sweep that needs no
Ray must never import it (let alone start it).
"""

from __future__ import annotations

import csv
import os
import pathlib
import subprocess
import sys

import pytest

from hydra_plugins.rltrain_launcher._driver import _log_failure
from rltrain.errors import ConfigError

pytestmark = pytest.mark.timeout(600)

REFUSED = "trainer.train_batch_size=3 does not divide by the rollout's data-parallel size 2"


def _sweep_without_ray(tmp_path: pathlib.Path, *overrides: str):
    fake = tmp_path / "no_ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('this sweep must not import ray')\n")
    path = os.pathsep.join(p for p in (str(fake.parent), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "rltrain", "-m", *overrides, f"hydra.sweep.dir={tmp_path / 's'}"]
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)


def _statuses(sweep_dir: pathlib.Path) -> list[str]:
    with open(sweep_dir / "sweep_report.csv", newline="") as f:
        return [row["status"] for row in csv.DictReader(f)]


def test_a_planning_sweep_starts_no_ray_and_a_refused_job_says_only_why(tmp_path):
    out = _sweep_without_ray(tmp_path, "mode=plan", "trainer.train_batch_size=3,8")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]  # the first failed job's refusal, as a single run
    assert "Traceback" not in text and "must not import ray" not in text
    assert f"job #0 refused: {REFUSED}" in text
    assert _statuses(tmp_path / "s") == ["failed", "completed"]
    for job in ("0", "1"):  # a plan is written before its checks refuse it, as in a single run
        assert (tmp_path / "s" / job / "plan.json").is_file()


def test_training_jobs_are_refused_before_anything_runs_with_the_single_runs_message(tmp_path):
    out = _sweep_without_ray(tmp_path, "trainer.train_batch_size=3,5")
    text = out.stdout + out.stderr
    assert out.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "must not import ray" not in text
    assert f"job #0 cannot run: {REFUSED}" in text
    assert "job #1 cannot run: trainer.train_batch_size=5" in text
    assert _statuses(tmp_path / "s") == ["failed", "failed"]
    assert not (tmp_path / "s" / "0" / "rltrain.log").exists()  # no job's driver ran


def test_a_job_refused_in_its_driver_logs_the_message_and_a_crash_its_traceback(caplog):
    _log_failure(0, ConfigError(["first problem", "second problem"]))
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        _log_failure(1, exc)
    refused, crashed = (r.getMessage() for r in caplog.records)
    assert "first problem" in refused and "second problem" in refused
    assert "Traceback" not in refused
    assert "Traceback" in crashed and "RuntimeError: boom" in crashed
