"""Whose checkpoint is whose: a lost pointer, a shared directory, a restart.

A driver killed between moving a checkpoint into place and moving ``latest`` leaves the
checkpoint published and the pointer missing or stale: resuming takes that checkpoint. Every
temporary write names its writer (host, pid, process start time), so a run removes its own
leftovers and those of gone processes, never the write a live run sharing the directory is
doing; a restart resumes from the run's own newest checkpoint whatever ``latest`` names.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import subprocess
import sys

import pytest
from reliability_helpers import auto_run

from rltrain import app
from rltrain.errors import ConfigError, WorkerError
from rltrain.runners import checkpoint as ck
from rltrain.runners.checkpoint import (
    CheckpointManager,
    model_fingerprint,
    resolve_resume,
    training_record,
)


def publish(mgr: CheckpointManager, step: int, run=None) -> str:
    pending = mgr.begin(step)
    os.makedirs(os.path.join(pending.path, "model"))
    with open(os.path.join(pending.path, "model", "model.safetensors"), "wb") as f:
        f.write(b"weights" * 10)
    run = run or auto_run()
    return mgr.commit(pending, {"model": model_fingerprint(run), **training_record(run)})


def other_experiment():
    run = auto_run()
    return dataclasses.replace(run, seed=run.seed + 1)


def with_checkpoint_dir(run, root: str, resume: str | None = "auto"):
    trainer = dataclasses.replace(run.trainer, checkpoint_dir=root, resume=resume)
    return dataclasses.replace(run, trainer=trainer)


# ------------------------------------------------------------------ a missing or stale pointer
def test_without_the_pointer_auto_resumes_the_newest_published_checkpoint(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "checkpoints"), keep=0)
    publish(mgr, 2)
    newest = publish(mgr, 3)
    os.remove(tmp_path / "checkpoints" / "latest")  # killed before the first pointer moved
    assert mgr.latest() == newest
    assert resolve_resume(auto_run(), str(tmp_path)).path == newest


def test_a_stale_pointer_gives_way_to_a_later_checkpoint_of_its_experiment(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "checkpoints"), keep=0)
    publish(mgr, 2)
    newest = publish(mgr, 3)
    (tmp_path / "checkpoints" / "latest").write_text("step-000002")  # the pointer never moved
    assert mgr.latest() == newest
    assert resolve_resume(auto_run(), str(tmp_path)).path == newest


def test_a_later_checkpoint_of_another_experiment_is_not_taken_past_the_pointer(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "checkpoints"), keep=0)
    ours = publish(mgr, 2)
    publish(mgr, 3, other_experiment())
    (tmp_path / "checkpoints" / "latest").write_text("step-000002")
    assert mgr.latest() == ours
    assert resolve_resume(auto_run(), str(tmp_path)).path == ours


def test_every_checkpoint_damaged_without_a_pointer_names_each_real_reason(tmp_path):
    mgr = CheckpointManager(str(tmp_path / "checkpoints"), keep=0)
    for step in (2, 3):
        os.remove(os.path.join(publish(mgr, step), "model", "model.safetensors"))
    os.remove(tmp_path / "checkpoints" / "latest")
    with pytest.raises(ConfigError) as info:
        resolve_resume(auto_run(), str(tmp_path))
    text = str(info.value)
    assert text.count("model.safetensors is missing") == 2 and "None" not in text


# ------------------------------------------------------------------------ temporary writes
def test_a_temporary_write_names_this_host_and_process(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    found = ck._WRITER.search(posixpath.basename(mgr.begin(4).path))
    assert found is not None
    assert int(found["pid"]) == os.getpid() and found["host"] == ck._host_hash()
    assert int(found["start"]) == ck._start_time(os.getpid())


def temporary(root, pid: int, start: int | None, host: str | None = None) -> str:
    name = f".tmp-step-000004-0a1b2c3d-h{host or ck._host_hash()}-p{pid}-s{start or 0}"
    os.makedirs(os.path.join(root, name))
    return name


@pytest.fixture
def live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process start times from /proc")
def test_only_leftovers_of_this_or_gone_processes_are_removed(tmp_path, live_process):
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid exists no more
    start = ck._start_time(live_process)
    mine = temporary(tmp_path, os.getpid(), ck._start_time(os.getpid()))
    dead = temporary(tmp_path, gone.pid, 12345)
    live = temporary(tmp_path, live_process, start)
    reused = temporary(tmp_path, live_process, start + 1)  # the pid now is another process
    elsewhere = temporary(tmp_path, gone.pid, 12345, host="0123abcd")
    unnamed = ".tmp-step-000004-0a1b2c3d"
    os.makedirs(tmp_path / unnamed)
    removed = CheckpointManager(str(tmp_path)).discard_unpublished()
    assert sorted(posixpath.basename(p) for p in removed) == sorted([mine, dead, reused])
    assert sorted(os.listdir(tmp_path)) == sorted([live, elsewhere, unnamed])
    assert CheckpointManager(str(tmp_path)).discard_unpublished(unnamed=True) == [
        str(tmp_path / unnamed)
    ]


WRITER = """
import sys, time
from rltrain.runners.checkpoint import CheckpointManager
print(CheckpointManager(sys.argv[1]).begin(4).path, flush=True)
time.sleep(120)
"""


def test_a_run_sharing_the_directory_keeps_its_write_until_it_is_gone(tmp_path):
    # another run writes a checkpoint into the shared trainer.checkpoint_dir while this one
    # starts, and while this one's attempt fails: its write survives both; once that run is
    # gone (killed), the next start removes what it left
    root = tmp_path / "shared"
    run = with_checkpoint_dir(auto_run(), str(root), resume=None)
    other = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = other.stdout.readline().strip()
        ours = CheckpointManager(str(root)).begin(6).path
        leftover = root / ".tmp-step-000002-0a1b2c3d"  # no writer named: kept in a shared dir
        leftover.mkdir()
        app._discard_unpublished(run, str(tmp_path / "run"))
        assert os.path.isdir(theirs) and not os.path.exists(ours) and leftover.is_dir()
    finally:
        other.kill()
        other.wait()
    app._discard_unpublished(run, str(tmp_path / "run"))
    assert sorted(os.listdir(root)) == [leftover.name]


# ------------------------------------------------------------------------------- restarts
def test_a_restart_resumes_the_runs_own_newest_checkpoint_not_what_latest_names(tmp_path):
    root = str(tmp_path / "shared")
    run = with_checkpoint_dir(auto_run(), root)
    mgr = CheckpointManager(root, keep=0)
    ours = publish(mgr, 2, run)
    # a run of the same experiment with another learning rate shares the directory
    optimizer = dataclasses.replace(run.optimizer, lr=run.optimizer.lr * 2)
    publish(mgr, 6, dataclasses.replace(run, optimizer=optimizer))
    assert mgr.latest() != ours
    point = app._restart_point(run, str(tmp_path / "run"), WorkerError("died"), 1)
    assert point["checkpoint"] == ours and point["resumed_from_step"] == 2


def test_a_restart_before_any_checkpoint_of_an_auto_run_starts_at_step_0(tmp_path):
    run = with_checkpoint_dir(auto_run(), str(tmp_path / "empty"))
    point = app._restart_point(run, str(tmp_path / "run"), WorkerError("died"), 1)
    assert point["checkpoint"] is None and point["resumed_from_step"] == 0
