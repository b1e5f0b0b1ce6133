"""Ctrl-C (SIGINT to the process group, as a terminal sends it) during training and during a
sweep: exit code 130, no process and no shared-memory file left, the last checkpoint usable."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from rltrain.runners.checkpoint import CheckpointManager

pytestmark = pytest.mark.timeout(600)
QUIET = ["logging.progress=false", "trainer.eval_every=0", "trainer.train_batch_size=4"]


def start(cwd: pathlib.Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rltrain", *args, *QUIET],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the test plays the terminal
    )


def wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in time"
        time.sleep(0.1)


def interrupt(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGINT to the whole group; returns the processes that existed then."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGINT)
    return family


def assert_nothing_left(family: list[psutil.Process], shm_before: set[str]) -> None:
    gone, alive = psutil.wait_procs(family, timeout=60)
    assert not alive, f"left running: {[p.pid for p in alive]}"
    assert set(os.listdir("/dev/shm")) <= shm_before


def test_ctrl_c_during_training(tmp_path):
    shm = set(os.listdir("/dev/shm"))
    run_dir = tmp_path / "run"
    proc = start(
        tmp_path, f"hydra.run.dir={run_dir}", "trainer.total_steps=400", "trainer.save_every=2"
    )
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "latest").exists(), proc, "a checkpoint")
        family = interrupt(proc)
        assert proc.wait(timeout=120) == 130, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_nothing_left(family, shm)
    manager = CheckpointManager(str(run_dir / "checkpoints"))
    assert manager.latest() is not None and manager.verify(manager.latest()) is None


def test_ctrl_c_during_a_three_job_sweep(tmp_path):
    shm = set(os.listdir("/dev/shm"))
    proc = start(
        tmp_path, "-m", "placement=collocated,disaggregated,hybrid", "trainer.total_steps=400"
    )

    def first_job_trains() -> bool:
        found = list(tmp_path.glob("multirun/*/*/*/metrics.jsonl"))
        return bool(found) and len(found[0].read_text().splitlines()) >= 2

    try:
        wait_for(first_job_trains, proc, "a training sweep job")
        family = interrupt(proc)
        assert proc.wait(timeout=120) == 130, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_nothing_left(family, shm)
