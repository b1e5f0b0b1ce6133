"""A worker's checkpoint write that fills the disk is a ResourceError, and no restart.

The actor and critic write their checkpoint files inside :class:`local_dir`; a write that runs
out of space — ``ENOSPC``, or torch's zip writer failing (``inline_container.cc ... unexpected
pos``, no errno) while the filesystem has no room — is raised as a ResourceError naming the
directory and the fix. The driver's save hook raises it as itself, not as a worker failure, so
``trainer.max_restarts`` is not spent on a disk that is still full. The full filesystem is
``/dev/full`` for the write (torch's own failure) and a stand-in ``shutil.disk_usage`` for the
free space reported after it.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest
import torch

from rltrain.errors import ResourceError, WorkerError
from rltrain.runners.checkpoint import CheckpointManager, save_state
from rltrain.workers.common import local_dir


@pytest.fixture
def full_disk(monkeypatch):
    real = shutil.disk_usage

    def usage(path):
        total, used, _ = real(path)
        return shutil._ntuple_diskusage(total, total, 0)  # noqa: SLF001 - its own result type

    monkeypatch.setattr(shutil, "disk_usage", usage)


def torch_save_onto_a_full_device(directory: str) -> None:
    os.symlink("/dev/full", os.path.join(directory, "optimizer.pt"))
    torch.save({"exp_avg": torch.zeros(10_000)}, os.path.join(directory, "optimizer.pt"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_torchs_failed_write_on_a_full_filesystem_names_the_directory(tmp_path, full_disk):
    with pytest.raises(ResourceError) as info:
        with local_dir(str(tmp_path)) as local:
            torch_save_onto_a_full_device(local)
    text = str(info.value)
    assert str(tmp_path) in text and "filesystem is full (0 bytes free" in text
    assert "inline_container" in text and "trainer.checkpoint_dir" in text
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_the_same_failure_with_room_left_is_not_called_a_full_disk(tmp_path):
    """Guards unchanged behaviour: a failed write with room left raised as itself before
    full disks were recognised, and must still."""
    if shutil.disk_usage(tmp_path).free < 64 << 20:
        pytest.skip("the test's own filesystem is nearly full")
    with pytest.raises(RuntimeError, match="inline_container") as info:
        with local_dir(str(tmp_path)) as local:
            torch_save_onto_a_full_device(local)
    assert not isinstance(info.value, ResourceError)


def test_enospc_is_a_full_disk_whatever_free_space_is_reported(tmp_path):
    with pytest.raises(ResourceError, match="filesystem is full"):
        with local_dir(str(tmp_path / "critic")):
            raise OSError(errno.ENOSPC, "No space left on device", "model.safetensors")


def test_a_full_disk_in_a_workers_save_ends_the_run_as_a_resource_error(tmp_path):
    # what the driver's save hook gets from a worker group whose save ran out of space
    inner = ResourceError("cannot write the checkpoint into /x: its filesystem is full")
    failed = WorkerError("group 'actor' rank 0 (...): 'save' raised: ResourceError: ...")
    failed.cause, failed.where = inner, "group 'actor' rank 0 'save'"

    def write(path: str) -> None:
        raise failed

    run = pytest.importorskip("reliability_helpers").auto_run()
    mgr = CheckpointManager(str(tmp_path))
    with pytest.raises(ResourceError, match="filesystem is full.*group 'actor' rank 0") as info:
        save_state(mgr, run, 4, "m", write)
    assert not isinstance(info.value, WorkerError) and info.value.__cause__ is failed
    assert mgr.published() == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_the_embodied_actors_save_on_a_full_filesystem_names_the_directory(tmp_path, full_disk):
    from types import SimpleNamespace

    from rltrain.workers.embodied import EmbodiedActorWorker

    model = torch.nn.Linear(4, 2)
    rank0 = SimpleNamespace(rank=0, model=model, optimizer=torch.optim.AdamW(model.parameters()))
    os.symlink("/dev/full", tmp_path / "policy.pt")
    with pytest.raises(ResourceError, match="filesystem is full") as info:
        EmbodiedActorWorker.save(rank0, str(tmp_path))
    assert str(tmp_path) in str(info.value)
    # written with room, it reads back (the load goes through the same local copy)
    os.unlink(tmp_path / "policy.pt")
    EmbodiedActorWorker.save(rank0, str(tmp_path))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    rank0.device = "cpu"
    EmbodiedActorWorker.load(rank0, str(tmp_path))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_another_error_on_a_nearly_full_filesystem_is_not_called_a_full_disk(tmp_path, full_disk):
    # a ZeRO gather failing while the checkpoint is written: the disk is not what failed
    with pytest.raises(RuntimeError, match="NCCL error") as info:
        with local_dir(str(tmp_path)):
            raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error")
    assert not isinstance(info.value, ResourceError)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_remote_checkpoint_dirs_full_temporary_filesystem_is_named_with_its_fix(monkeypatch):
    # the local copy uploaded to s3://... is written under TMPDIR: that filesystem filled, and
    # its free space is read while the partial copy is still there (it is removed after)
    real, copy = shutil.disk_usage, []

    def usage(path):
        total, used, free = real(path)
        if copy and os.path.abspath(path) == copy[0]:  # full while the partial copy holds it
            return shutil._ntuple_diskusage(total, total, 0)  # noqa: SLF001 - its own type
        return shutil._ntuple_diskusage(total, used, free)  # noqa: SLF001

    monkeypatch.setattr(shutil, "disk_usage", usage)
    with pytest.raises(ResourceError) as info:
        with local_dir("memory://ckpts/step-000004") as local:
            copy.append(os.path.abspath(local))
            torch_save_onto_a_full_device(local)
    text = str(info.value)
    assert "memory://ckpts/step-000004" in text and "0 bytes free" in text
    assert "TMPDIR" in text and os.path.dirname(copy[0]) in text
    assert "trainer.checkpoint_dir" not in text
    assert not os.path.exists(copy[0])  # the partial copy is removed all the same
