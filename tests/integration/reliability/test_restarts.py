"""``trainer.max_restarts``: faults injected for real into a running job.

A rollout worker and, later in the same run, one of the restarted job's actor workers are killed
with SIGKILL (the second kill waits for the first restart in the run's log and a checkpoint after
the step it resumed from: killing one of the dying first attempt's workers would fault nothing).
With ``trainer.max_restarts=2`` the driver tears the job down, starts it again from its latest
checkpoint and finishes; every step's record then equals the uninterrupted run's (exact
resume), the summary lists both restarts with their cause and the step resumed from and
describes the whole run, and each run's ``rltrain.log`` holds what its terminal showed. A worker
raising a ``TypeError`` is not restarted at all: a replay would raise it again.

The runs whose workers are killed keep a Ray of their own (the test finds those workers among
the driver's children); the uninterrupted reference run and the run whose reward raises join the
test session's Ray (``cluster.address``) instead of starting one each. The latter ships its
reward's module to the session's workers as a user would ship theirs to a running cluster:
``+cluster.runtime_env={env_vars: {PYTHONPATH: ...}}``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet

import psutil
import pytest

from rltrain.telemetry.metrics import read_metrics, without_timings

pytestmark = [pytest.mark.timeout(900), pytest.mark.spread]  # spread: no module fixture

COMMON = [
    "placement.fuse=false",  # actor and rollout as separate processes, so each can be killed
    "trainer.train_batch_size=4",
    # 12 steps of ~0.2 s: a kill lands a step or two after its checkpoint is seen (more under
    # load), and the second must still land before the run's end
    "trainer.total_steps=12",
    "trainer.save_every=2",
    "trainer.eval_every=0",
    "logging.progress=false",
    "logging.trace=false",
]


HERE = pathlib.Path(__file__).resolve().parent


def broken_reward(prompt: str, response: str, answer: str) -> float:
    """A reward with a bug: it pays the right answer and raises on any other response (the
    check before Ray scores right answers and an empty one only, so it passes)."""
    if response.strip() and response.strip() != answer.strip():
        raise TypeError(f"broken_reward cannot score {response!r}")
    return 1.0 if response.strip() == answer.strip() else 0.0


#: The driver's (and, through ``cluster.runtime_env``, a joined Ray's workers') import path:
#: this directory holds :func:`broken_reward`.
PATH = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE)) if p)


def rltrain(run_dir: pathlib.Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rltrain", f"hydra.run.dir={run_dir}", *COMMON, *overrides]
    return subprocess.Popen(
        cmd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": PATH},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def latest(run_dir: pathlib.Path) -> str | None:
    try:
        return (run_dir / "checkpoints" / "latest").read_text().strip()
    except OSError:
        return None


def worker(driver: subprocess.Popen, cls: str, skip: AbstractSet[int]) -> psutil.Process | None:
    """A live Ray worker process of ``cls`` under this driver (Ray titles them ``ray::<cls>``),
    other than the pids in ``skip``."""
    for child in psutil.Process(driver.pid).children(recursive=True):
        try:
            if child.pid not in skip and " ".join(child.cmdline()).startswith(f"ray::{cls}"):
                return child
        except psutil.Error:
            continue
    return None


def workers(driver: subprocess.Popen) -> set[int]:
    """The pids of every Ray worker process under this driver now."""
    pids = set()
    for child in psutil.Process(driver.pid).children(recursive=True):
        try:
            if child.cmdline() and child.cmdline()[0].startswith("ray::"):
                pids.add(child.pid)
        except psutil.Error:
            continue
    return pids


def restarted_from(driver: subprocess.Popen, run_dir: pathlib.Path, count: int) -> int:
    """The step restart ``count`` resumed from, once the run's log records it."""
    pattern = re.compile(rf"restart {count} of \d+ .*?resuming from step (\d+)")
    while True:
        assert driver.poll() is None, f"the run ended before restart {count}"
        try:
            found = pattern.search((run_dir / "rltrain.log").read_text())
        except OSError:
            found = None
        if found:
            return int(found.group(1))
        time.sleep(0.05)


def kill_when(
    driver: subprocess.Popen,
    run_dir: pathlib.Path,
    ready: Callable[[str | None], bool],
    cls: str,
    skip: AbstractSet[int] = frozenset(),
) -> int:
    """SIGKILL a ``cls`` worker (not one of ``skip``) once ``ready(latest checkpoint)``; returns
    the killed pid."""
    deadline = time.monotonic() + 400
    while True:
        assert driver.poll() is None, "the run ended before the fault could be injected"
        assert time.monotonic() < deadline, f"no checkpoint ready with a live {cls} in time"
        if ready(latest(run_dir)) and (proc := worker(driver, cls, skip)) is not None:
            proc.send_signal(signal.SIGKILL)
            return proc.pid
        time.sleep(0.05)


def at(checkpoint: str) -> Callable[[str | None], bool]:
    return lambda name: name == checkpoint


def test_killed_rollout_and_actor_workers_are_restarted_and_resume_exactly(tmp_path, ray_address):
    # The uninterrupted run (the reference, on the session Ray) and the faulty one (on a Ray of
    # its own, whose workers it kills) side by side: two jobs of one machine.
    steady = rltrain(tmp_path / "steady", f"cluster.address={ray_address}")
    faulty_dir = tmp_path / "faulty"
    faulty = rltrain(faulty_dir, "trainer.max_restarts=2")
    try:
        kill_when(faulty, faulty_dir, at("step-000002"), "RolloutWorker")
        # The first attempt's workers die with it (a kill among them would fault nothing): the
        # second fault waits for the restart to be logged and for a checkpoint past the step it
        # resumed from, then kills one of the second attempt's actor workers.
        first_attempt = workers(faulty)
        resumed = restarted_from(faulty, faulty_dir, 1)
        kill_when(
            faulty,
            faulty_dir,
            lambda name: name is not None and int(name.removeprefix("step-")) > resumed,
            "ActorWorker",
            skip=first_attempt,
        )
        assert faulty.wait(timeout=600) == 0, faulty.stdout.read()[-3000:]
        assert steady.wait(timeout=600) == 0, steady.stdout.read()[-3000:]
    finally:
        for driver in (faulty, steady):
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
    log = faulty.stdout.read()
    assert "restart 1 of 2" in log and "restart 2 of 2" in log

    summary = json.loads((faulty_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    restarts = summary["restarts"]
    assert [r["count"] for r in restarts] == [1, 2]
    assert "RolloutWorker" in restarts[0]["cause"] or "rollout" in restarts[0]["cause"]
    assert "ActorWorker" in restarts[1]["cause"] or "actor" in restarts[1]["cause"]
    assert restarts[0]["resumed_from_step"] >= 2 and restarts[1]["resumed_from_step"] >= 4
    # the whole run, not the last attempt: 12 steps from step 0, three attempts
    assert summary["steps"] == 12
    assert [a["status"] for a in summary["attempts"]] == ["failed", "failed", "completed"]
    # each restart really started from its checkpoint (the loop's own first step)
    firsts = [a["first_step"] for a in summary["attempts"]]
    assert firsts[0] == 0 and firsts[1] == restarts[0]["resumed_from_step"] >= 2
    assert firsts[2] == restarts[1]["resumed_from_step"] >= 4
    assert summary["wall_s"] >= sum(a["training_s"] for a in summary["attempts"][:2])
    # each run's log holds what its terminal showed
    assert "restart 2 of 2" in (faulty_dir / "rltrain.log").read_text()
    steady_log = (tmp_path / "steady" / "rltrain.log").read_text()
    assert "micro-batches chosen by the plan" in steady_log and "rltrain: completed" in steady_log

    expected = read_metrics(str(tmp_path / "steady" / "metrics.jsonl"))
    got = read_metrics(str(faulty_dir / "metrics.jsonl"))
    assert [r["step"] for r in got] == list(range(12))
    assert [without_timings(r) for r in got] == [without_timings(r) for r in expected]


def test_without_restarts_a_killed_worker_fails_the_run_naming_it(tmp_path):
    driver = rltrain(tmp_path, "trainer.total_steps=60")
    try:
        kill_when(driver, tmp_path, at("step-000002"), "RolloutWorker")
        assert driver.wait(timeout=300) != 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    out = driver.stdout.read()
    assert "group 'rollout'" in out and "died" in out
    assert latest(tmp_path) is not None  # the last checkpoint stays usable


def test_a_worker_error_a_replay_would_repeat_spends_no_restart(tmp_path, ray_address):
    driver = rltrain(
        tmp_path,
        "trainer.max_restarts=2",
        "task.reward_fn=test_restarts:broken_reward",
        f"cluster.address={ray_address}",
        f"+cluster.runtime_env={{env_vars: {{PYTHONPATH: '{PATH}'}}}}",
    )
    try:
        code = driver.wait(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    out = driver.stdout.read()
    assert code != 0, out[-3000:]
    assert "not restarting (trainer.max_restarts=2, 0 used)" in out, out[-3000:]
    assert "TypeError: broken_reward cannot score" in out
    assert "restart 1 of 2" not in out
