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
import shutil
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
    """Guards unchanged behaviour: a checkpoint past the pointer was never taken before, and
    taking the later ones of the pointer's experiment must not take another's."""
    mgr = CheckpointManager(str(tmp_path / "checkpoints"), keep=0)
    ours = publish(mgr, 2)
    publish(mgr, 3, other_experiment())
    (tmp_path / "checkpoints" / "latest").write_text("step-000002")
    assert mgr.latest() == ours
    assert resolve_resume(auto_run(), str(tmp_path)).path == ours


def test_without_the_pointer_auto_resumes_its_own_experiment_past_anothers_newer_one(tmp_path):
    root = str(tmp_path / "shared")
    run = with_checkpoint_dir(auto_run(), root)
    mgr = CheckpointManager(root, keep=0)
    ours = publish(mgr, 2, run)
    publish(mgr, 3, with_checkpoint_dir(other_experiment(), root))
    os.remove(os.path.join(root, "latest"))
    assert resolve_resume(run, str(tmp_path / "run")).path == ours


def test_without_the_pointer_only_another_experiments_checkpoint_is_refused_as_its(tmp_path):
    """Guards unchanged behaviour: with none of its own, auto still refuses another
    experiment's checkpoint in the run's checkpoint directory (it never starts at step 0)."""
    root = str(tmp_path / "shared")
    mgr = CheckpointManager(root, keep=0)
    publish(mgr, 3, other_experiment())
    os.remove(os.path.join(root, "latest"))
    with pytest.raises(ConfigError, match="seed"):
        resolve_resume(with_checkpoint_dir(auto_run(), root), str(tmp_path / "run"))


def test_its_own_checkpoints_all_damaged_without_a_pointer_are_named_not_anothers(tmp_path):
    # another experiment's intact checkpoint shares the directory: it is neither resumed nor
    # listed as a damaged one of this run (its reason would read "None")
    root = str(tmp_path / "shared")
    run = with_checkpoint_dir(auto_run(), root)
    mgr = CheckpointManager(root, keep=0)
    for step in (2, 3):
        os.remove(os.path.join(publish(mgr, step, run), "model", "model.safetensors"))
    publish(mgr, 4, other_experiment())
    os.remove(os.path.join(root, "latest"))
    with pytest.raises(ConfigError) as info:
        resolve_resume(run, str(tmp_path / "run"))
    text = str(info.value)
    assert "every checkpoint" in text and text.count("model.safetensors is missing") == 2
    assert "None" not in text and "step-000004" not in text


def test_without_a_pointer_its_checkpoint_whose_state_is_unreadable_is_named_not_skipped(
    tmp_path,
):
    # its only checkpoint lost trainer_state.json (the experiment is unreadable): verifying it
    # names the missing file; another experiment's intact checkpoint is not offered instead
    root = str(tmp_path / "shared")
    run = with_checkpoint_dir(auto_run(), root)
    mgr = CheckpointManager(root, keep=0)
    os.remove(os.path.join(publish(mgr, 2, run), "trainer_state.json"))
    publish(mgr, 3, other_experiment())
    os.remove(os.path.join(root, "latest"))
    assert mgr.candidates(ck.experiment_identity(run))[0].endswith("step-000002")


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


def test_the_run_directorys_own_checkpoints_lose_every_leftover_whoever_wrote_it(
    tmp_path, live_process
):
    # a driver requeued onto another node (or a pod recreated with a new hostname) runs into
    # the same hydra.run.dir: what the killed driver left there is no live run's
    elsewhere = ".tmp-step-000004-0a1b2c3d-h0123abcd-p4242-s999"
    os.makedirs(tmp_path / elsewhere)
    live = temporary(tmp_path, live_process, ck._start_time(live_process))
    unnamed = ".tmp-step-000004-0a1b2c3d"
    os.makedirs(tmp_path / unnamed)
    removed = CheckpointManager(str(tmp_path)).discard_unpublished(own=True)
    assert sorted(posixpath.basename(p) for p in removed) == sorted([elsewhere, live, unnamed])
    assert os.listdir(tmp_path) == []


def test_the_own_checkpoints_of_a_run_directory_are_emptied_by_the_run(tmp_path):
    run = auto_run()  # no trainer.checkpoint_dir: <run dir>/checkpoints
    root = tmp_path / "run" / "checkpoints"
    leftover = root / ".tmp-step-000006-0a1b2c3d-h0123abcd-n4026531836-p1-s77"
    leftover.mkdir(parents=True)
    app._discard_unpublished(run, str(tmp_path / "run"))
    assert os.listdir(root) == []


# ---------------------------------------------------- writers in containers and hidden processes
def test_a_temporary_write_names_its_pid_namespace(tmp_path):
    if ck._pid_namespace() is None:
        pytest.skip("no /proc/self/ns/pid here")
    found = ck._WRITER.search(posixpath.basename(CheckpointManager(str(tmp_path)).begin(4).path))
    assert found is not None and int(found["ns"]) == ck._pid_namespace()


def test_names_without_a_namespace_still_name_their_writer():
    found = ck._WRITER.search(".latest-0a1b2c3d-h0123abcd-p4242-s999")
    assert found is not None and found["ns"] is None
    assert (found["host"], found["pid"], found["start"]) == ("0123abcd", "4242", "999")


def test_another_pid_namespaces_write_is_kept_even_when_its_pid_is_gone_here():
    if ck._pid_namespace() is None:
        pytest.skip("no /proc/self/ns/pid here")
    gone = subprocess.Popen(["true"])
    gone.wait()
    other_ns = ck._pid_namespace() + 1  # a container sharing this host's name
    name = f".tmp-step-000004-0a1b2c3d-h{ck._host_hash()}-n{other_ns}-p{gone.pid}-s12345"
    assert not ck._writer_gone(name)
    same_ns = name.replace(f"-n{other_ns}-", f"-n{ck._pid_namespace()}-")
    assert ck._writer_gone(same_ns)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="process start times from /proc")
def test_this_pid_with_another_start_time_is_kept_in_a_name_without_its_namespace():
    # pid 1 of two containers sharing the host's name: only the start time tells them apart
    pid, start = os.getpid(), ck._start_time(os.getpid())
    name = f".tmp-step-000004-0a1b2c3d-h{ck._host_hash()}-p{pid}-s{start + 1}"
    assert not ck._writer_gone(name)
    assert ck._writer_gone(name.replace(f"-s{start + 1}", f"-s{start}"))


def test_a_live_writer_that_proc_does_not_show_is_kept(tmp_path, monkeypatch, live_process):
    # /proc mounted with hidepid (another user's run) or from another namespace: the pid is
    # missing there though the process lives; the kernel is asked instead
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "proc" / "self").mkdir(parents=True)  # a /proc that shows neither
    monkeypatch.setattr(ck, "_PROC", str(tmp_path / "proc"))
    writer = f".tmp-step-000004-0a1b2c3d-h{ck._host_hash()}-p{{}}-s12345"
    assert not ck._writer_gone(writer.format(live_process))
    assert ck._writer_gone(writer.format(gone.pid))


WRITER_IN_A_CONTAINER = """
import sys, time
from rltrain.runners.checkpoint import CheckpointManager
print(CheckpointManager(sys.argv[1]).begin(4).path, flush=True)
time.sleep(120)
"""
#: A new PID namespace with its own /proc, as a container has; the child dies with unshare.
CONTAINER = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


def test_a_live_writer_in_another_pid_namespace_keeps_its_write(tmp_path):
    # a container sharing the host's name and filesystem: its writer is pid 1 there, and pid 1
    # here is another process (init), started at another time
    root = tmp_path / "shared"
    root.mkdir()
    can = shutil.which("unshare") and subprocess.run([*CONTAINER, "true"], check=False)
    if not can or can.returncode != 0:
        pytest.skip("cannot make a PID namespace here (unshare, as root)")
    other = subprocess.Popen(
        [*CONTAINER, sys.executable, "-c", WRITER_IN_A_CONTAINER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = other.stdout.readline().strip()
        assert "-p1-s" in theirs
        assert CheckpointManager(str(root)).discard_unpublished() == []
        assert os.path.isdir(theirs)
    finally:
        other.kill()
        other.wait()


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
