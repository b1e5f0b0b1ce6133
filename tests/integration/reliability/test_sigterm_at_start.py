"""SIGTERM to a real run while its workers start (after its own Ray started, before the first
step) stops it cleanly: exit 0, status ``stopped``, no step trained, no temporary checkpoint
write left, and no process of the run alive. Before, Ray's SIGTERM handler ended such a run
as ``failed: SystemExit: 15`` with exit 15.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = [pytest.mark.timeout(600), pytest.mark.spread]  # spread: no module fixture


def test_sigterm_while_the_workers_start_stops_the_run_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rltrain",
        f"hydra.run.dir={run_dir}",
        "trainer.total_steps=3",
        "trainer.save_every=1",
        "trainer.train_batch_size=4",
        "logging.progress=false",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log = run_dir / "rltrain.log"
    deadline = time.monotonic() + 300
    try:
        # the run's own Ray has started and its first worker process has taken its class's
        # name: ray.init has returned (a SIGTERM inside it can meet Ray's own C++ handler,
        # docs/reliability.md) and the workers are starting; the first step comes next
        while not (log.is_file() and "Started a local Ray instance" in log.read_text()):
            assert proc.poll() is None, "the run ended before Ray started"
            assert time.monotonic() < deadline, "Ray did not start within the deadline"
            time.sleep(0.05)
        while not _a_worker_started(proc.pid):
            assert proc.poll() is None, "the run ended before its workers started"
            assert time.monotonic() < deadline, "no worker started within the deadline"
            time.sleep(0.05)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and "cause" not in summary
    assert summary["steps"] <= 1  # the first step had not started (or had just begun)
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir():
        assert not [n for n in os.listdir(checkpoints) if n.startswith((".tmp-", ".latest-"))]
    _, alive = psutil.wait_procs(family, timeout=60)
    assert not alive, [p.pid for p in alive]


def _a_worker_started(pid: int) -> bool:
    """Whether a process under the run is one of its workers (Ray names it ``ray::<Class>``)."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            name = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if name.startswith("ray::") and "Worker" in name.split()[0]:
            return True
    return False
