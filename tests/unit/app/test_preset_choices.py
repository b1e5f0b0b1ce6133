"""The entry point refuses a group choice that the chosen preset would silently override."""

from __future__ import annotations

import os
import subprocess
import sys


def _rltrain(args: list[str], cwd) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "rltrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_single_run_is_refused_before_ray_and_leaves_no_run_dir(tmp_path):
    out = _rltrain(
        ["mode=plan", "experiment=reasoning_ppo_hybrid", "placement=collocated"], tmp_path
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("rltrain: error: experiment=reasoning_ppo_hybrid sets placement.")
    assert "drop placement=collocated" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # the refused run's directory is removed


def test_each_job_of_a_sweep_is_refused_and_nothing_is_planned(tmp_path):
    sweep = tmp_path / "sweep"
    out = _rltrain(
        ["-m", "mode=plan", "experiment=reasoning_ppo_hybrid",
         "placement=collocated,disaggregated", f"hydra.sweep.dir={sweep}"],
        tmp_path,
    )  # fmt: skip
    assert out.returncode != 0
    report = (sweep / "sweep_report.md").read_text()
    assert report.count("failed: ConfigError: experiment=reasoning_ppo_hybrid sets") == 2
    assert "drop placement=collocated" in report and "drop placement=disaggregated" in report
    assert not list(sweep.glob("*/plan.json"))
