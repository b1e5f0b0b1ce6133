"""Ctrl-C (SIGINT to the process group, as a terminal sends it) is never lost: at any moment of a
run, and of a sweep, the command exits 130 and leaves no process, shared-memory file or half
written checkpoint behind; the last published checkpoint stays usable.

Every command starts with SIGINT *ignored*, as a CI runner's background job (or ``cmd &`` in a
non-interactive shell) starts its children: Python then installs no KeyboardInterrupt handler
unless rltrain restores it, and an interrupt would be lost.

The stress test interrupts one tiny run per moment (each interrupt ends its run, so no run can
serve two). The moments are drawn with a seeded RNG from every phase of a run: start-up before
Ray, Ray starting, workers starting, training steps, checkpoint writes, and the teardown after
the last step. Cost: one tiny run started per moment, mostly start-up: 8 moments took 96 s on the
2-core development VM (2026-11-26, lightly loaded), the sweep test 22 s.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import psutil
import pytest

from rltrain.runners.checkpoint import CheckpointManager

pytestmark = [pytest.mark.timeout(1500), pytest.mark.spread]  # spread: no module fixture
QUIET = ["logging.progress=false", "trainer.eval_every=0", "trainer.train_batch_size=4"]

#: A run as small as a real one gets: one device, one fused worker, a checkpoint every step.
TINY = [
    "cluster.devices_per_node=1",
    "trainer.total_steps=12",
    "trainer.save_every=1",
    "rollout.n_samples_per_prompt=4",
]

#: The phases a moment is drawn from, each a condition on the run seen from outside.
PHASES = ("start-up", "ray", "workers", "steps", "checkpoint write", "teardown")
MOMENTS = 8
SEED = 2026


def ignore_sigint() -> None:
    """The child starts with SIGINT ignored, as a shell's background job does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(cwd: pathlib.Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rltrain", *args, *QUIET],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the test plays the terminal
        preexec_fn=ignore_sigint,
    )


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, what: str, timeout=400):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in time"
        time.sleep(0.02)


def interrupt(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGINT to the whole group; returns the processes that existed then."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGINT)
    return family


def processes_using(path: str) -> list[psutil.Process]:
    """Live processes whose command line names ``path`` as a flag's value (Ray's, under its
    temp dir; not the driver, whose ``cluster.temp_dir=`` override names it too)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            parts = p.info["cmdline"] or ()
            if any(path in part and "cluster.temp_dir=" not in part for part in parts):
                found.append(p)
        except psutil.Error:
            continue
    return found


def assert_nothing_left(family: list[psutil.Process], shm_before: set[str], ray_dir: str = ""):
    _, alive = psutil.wait_procs(family, timeout=60)
    assert not alive, f"left running: {[p.pid for p in alive]}"
    if ray_dir:
        _, alive = psutil.wait_procs(processes_using(ray_dir), timeout=60)
        assert not alive, f"Ray processes left running: {[p.pid for p in alive]}"
    new = set(os.listdir("/dev/shm")) - shm_before
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # another test process runs beside this one and owns its files: rltrain's own
        # (the host all-reduce's, named rltrain-*) are the ones a run could leave
        new = {name for name in new if name.startswith("rltrain-")}
    # other work on the machine makes short-lived files: what is still there after 1 s stays
    deadline = time.monotonic() + 1.0
    while (left := new & set(os.listdir("/dev/shm"))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, left


def moments(seed: int = SEED, count: int = MOMENTS) -> list[tuple[str, float]]:
    """Every phase once, then phases at random; each with a random delay or step within it."""
    rng = random.Random(seed)
    phases = list(PHASES) + [rng.choice(PHASES) for _ in range(count - len(PHASES))]
    return [(phase, rng.random()) for phase in phases]


#: Ray's own processes titled ``ray::...`` (started with Ray, before any worker).
RAY_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE")


def handles_sigint(driver: subprocess.Popen) -> bool:
    """Whether the driver has a SIGINT handler installed (/proc's caught-signals mask)."""
    try:
        with open(f"/proc/{driver.pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split(":")[1], 16) >> (signal.SIGINT - 1) & 1)


def workers_of(driver: subprocess.Popen) -> list[psutil.Process]:
    """The driver's Ray workers (Ray titles them ``ray::<class>``; its agents left out)."""
    found = []
    try:
        children = psutil.Process(driver.pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            title = " ".join(child.cmdline())
            if title.startswith("ray::") and not title.startswith(RAY_AGENTS):
                found.append(child)
        except psutil.Error:
            continue
    return found


def reached(
    phase: str, u: float, driver: subprocess.Popen, run_dir: pathlib.Path, ray_dir: str
) -> Callable[[], bool]:
    """When the moment ``(phase, u)`` has come (``u`` in [0, 1) places it within the phase)."""
    ckpt = run_dir / "checkpoints"
    metrics = run_dir / "metrics.jsonl"

    def lines() -> int:
        try:
            return len(metrics.read_text().splitlines())
        except OSError:
            return 0

    def after(condition: Callable[[], bool], delay: float) -> Callable[[], bool]:
        since: list[float] = []

        def check() -> bool:
            if not since and condition():
                since.append(time.monotonic())
            return bool(since) and time.monotonic() - since[0] >= delay

        return check

    if phase == "start-up":
        # from the moment rltrain handles SIGINT (before that, Python itself is starting with
        # the inherited SIG_IGN: no program can see a signal sent then)
        return after(lambda: handles_sigint(driver), 2.5 * u)
    if phase == "ray":
        return after(lambda: bool(processes_using(ray_dir)), 1.0 * u)
    if phase == "workers":
        return after(lambda: bool(workers_of(driver)), 0.5 * u)
    if phase == "steps":
        return after(lambda: lines() >= 1 + int(8 * u), 0.2 * u)
    if phase == "checkpoint write":

        def writing() -> bool:
            try:
                return any(n.startswith(".tmp-step-") for n in os.listdir(ckpt))
            except OSError:
                return False

        return writing
    return after(lambda: lines() >= 12, 0.3 * u)  # teardown: after the last step


@pytest.mark.parametrize("moment", moments(), ids=lambda m: f"{m[0]}-{m[1]:.2f}")
def test_ctrl_c_at_any_moment_of_a_run(tmp_path, moment):
    phase, u = moment
    shm = set(os.listdir("/dev/shm"))
    run_dir = tmp_path / "run"
    ray_dir = tempfile.mkdtemp(prefix="rlint-", dir="/tmp")  # short: Ray's socket paths
    proc = start(tmp_path, f"hydra.run.dir={run_dir}", f"cluster.temp_dir={ray_dir}", *TINY)
    try:
        wait_for(reached(phase, u, proc, run_dir, ray_dir), proc, f"the {phase} moment")
        family = interrupt(proc)
        code = proc.wait(timeout=180)
        assert code == 130, f"exit {code} after Ctrl-C at {phase}:\n{proc.stderr.read()[-2000:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert_nothing_left(family, shm, ray_dir)
    shutil.rmtree(ray_dir, ignore_errors=True)
    ckpt = run_dir / "checkpoints"
    if ckpt.exists():
        assert not [n for n in os.listdir(ckpt) if n.startswith((".tmp-", ".latest-"))]
        manager = CheckpointManager(str(ckpt))
        if manager.published():
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
