"""The README's main command in a subprocess, and crash-resume through SIGKILL of the driver."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from rltrain.telemetry.metrics import read_metrics, without_timings

FAST = ["trainer.train_batch_size=4", "logging.progress=false"]


def rltrain(run_dir: pathlib.Path | None, *overrides: str, wait: bool = True, cwd=None):
    """Run the entry point; ``run_dir=None`` lets Hydra pick ``outputs/<date>/<time>`` in cwd."""
    where = [f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    cmd = [sys.executable, "-m", "rltrain", *where, *FAST, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not wait:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            cwd=cwd,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420, cwd=cwd)


def _run_dirs(cwd: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p.parent for p in cwd.glob("outputs/*/*/.hydra"))


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> pathlib.Path:
    """The README's main command, 3 steps: its outputs, and the uninterrupted run the crash test
    compares with (the last step is always evaluated)."""
    run_dir = tmp_path_factory.mktemp("main")
    out = rltrain(run_dir, "trainer.total_steps=3", "trainer.eval_every=0")
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.mark.timeout(480)
def test_readme_main_command_runs_and_writes_its_outputs(main_run):
    summary = json.loads((main_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert summary["placement_mode"] == "collocated"
    for name in ("metrics.jsonl", "reward_curve.png", "trace.json", "utilization.json"):
        assert (main_run / name).is_file(), name
    assert "eval/accuracy" in read_metrics(str(main_run / "metrics.jsonl"))[-1]


def _latest(run_dir: pathlib.Path) -> str | None:
    try:
        return (run_dir / "checkpoints" / "latest").read_text().strip()
    except OSError:
        return None


@pytest.mark.timeout(900)
def test_resume_after_sigkill_reproduces_the_next_step(main_run, tmp_path, ray_address):
    """SIGKILL of the driver, then the same command again with trainer.resume=auto: the new
    invocation (Hydra gives it a new run directory) finds the killed run's last checkpoint and
    reproduces the uninterrupted run's next step. The killed run has its own local Ray (killed
    with it); the resumed one joins the session's (the default shape), as its subject is the
    checkpoint, not Ray's start."""
    steady, work = main_run, tmp_path / "work"
    work.mkdir()
    proc = rltrain(
        None,
        "trainer.total_steps=60",
        "trainer.save_every=2",
        "trainer.eval_every=0",
        wait=False,
        cwd=work,
    )
    deadline = time.monotonic() + 400
    try:
        while not (_run_dirs(work) and _latest(_run_dirs(work)[0]) == "step-000002"):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within the deadline"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its local Ray, no clean-up
        proc.wait(timeout=60)
    crashed = _run_dirs(work)[0]
    # Hydra names run directories to the second (local time): the next run starts in another
    while time.strftime("%H-%M-%S") == crashed.name:
        time.sleep(0.05)

    out = rltrain(
        None,
        "trainer.total_steps=3",
        "trainer.eval_every=0",
        "trainer.resume=auto",
        f"cluster.address={ray_address}",
        cwd=work,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming from {crashed / 'checkpoints' / 'step-000002'}" in out.stdout + out.stderr
    resumed_dir = [d for d in _run_dirs(work) if d != crashed]
    assert len(resumed_dir) == 1
    expected = [r for r in read_metrics(str(steady / "metrics.jsonl")) if r["step"] == 2]
    resumed = read_metrics(str(resumed_dir[0] / "metrics.jsonl"))
    assert [r["step"] for r in resumed] == [2]
    assert without_timings(resumed[0]) == without_timings(expected[0])


@pytest.mark.spread  # uses no module fixture
@pytest.mark.timeout(480)
def test_sigterm_finishes_the_step_in_flight_checkpoints_it_and_exits(tmp_path, ray_address):
    """SIGTERM mid-run: the step running (and, fused, the one queued behind it) is recorded,
    the checkpoint holds exactly the recorded steps, the run exits cleanly as 'stopped'. The run
    joins the session's Ray (the default shape): its subject is the driver's handling of the
    signal, not Ray's start (Ctrl-C with a Ray of the run's own: tests/integration/reliability/
    test_interrupts.py)."""
    proc = rltrain(
        tmp_path,
        "trainer.total_steps=400",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        f"cluster.address={ray_address}",
        wait=False,
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 300
    try:
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, "the run ended before its third step"
            assert time.monotonic() < deadline, "no third step within the deadline"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    records = read_metrics(str(metrics))
    steps = [r["step"] for r in records]
    assert steps == list(range(len(steps))) and 3 <= len(steps) < 400
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["steps"] == len(steps)
    assert summary["fused"] is True
    assert _latest(tmp_path) == f"step-{len(steps):06d}"
