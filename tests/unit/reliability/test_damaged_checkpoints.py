"""A damaged or unwritable checkpoint never costs more than itself.

Truncated or corrupted files are found against the manifest each checkpoint carries; resuming
falls back to the previous intact checkpoint (naming the bad file) or refuses when none is left.
A checkpoint directory that stops accepting writes is a clear error and leaves the previous
checkpoint published and intact.
"""

from __future__ import annotations

import errno
import logging
import os

import pytest
from fsspec.implementations.local import LocalFileSystem

from rltrain.errors import ConfigError, ResourceError
from rltrain.runners.checkpoint import CheckpointManager, read_state


def publish(mgr: CheckpointManager, step: int, payload: bytes = b"weights" * 100) -> str:
    pending = mgr.begin(step)
    os.makedirs(os.path.join(pending.path, "model"))
    with open(os.path.join(pending.path, "model", "model.safetensors"), "wb") as f:
        f.write(payload)
    return mgr.commit(pending, {"model": "m"})


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=0)
    path = publish(mgr, 2, b"abc")
    import json

    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    entry = manifest["model/model.safetensors"]
    assert entry["size"] == 3
    # sha256("abc"), by hand from the standard's test vector
    assert entry["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert mgr.verify(path) is None


def test_truncated_latest_falls_back_and_names_the_file(tmp_path, caplog):
    mgr = CheckpointManager(str(tmp_path), keep=0)
    good = publish(mgr, 2)
    bad = publish(mgr, 4)
    weights = os.path.join(bad, "model", "model.safetensors")
    os.truncate(weights, 10)
    with caplog.at_level(logging.WARNING, logger="rltrain"):
        assert mgr.latest() == good
    assert weights in caplog.text and "truncated" in caplog.text
    assert read_state(mgr.resolve("auto"))["step"] == 2


def test_corrupted_bytes_of_the_same_size_are_found(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=0)
    good = publish(mgr, 2)
    bad = publish(mgr, 4)
    with open(os.path.join(bad, "model", "model.safetensors"), "r+b") as f:
        f.write(b"X")
    assert "corrupted" in mgr.verify(bad)
    assert mgr.latest() == good


def test_an_unreadable_state_file_is_damage_too(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=0)
    good = publish(mgr, 2)
    bad = publish(mgr, 4)
    with open(os.path.join(bad, "trainer_state.json"), "w") as f:
        f.write("{not json")
    assert mgr.latest() == good


def test_no_intact_checkpoint_left_is_refused_clearly(tmp_path):
    from reliability_helpers import auto_run

    mgr = CheckpointManager(str(tmp_path / "checkpoints"), keep=0)
    bad = publish(mgr, 2)
    os.remove(os.path.join(bad, "model", "model.safetensors"))
    from rltrain.runners.checkpoint import resolve_resume

    with pytest.raises(ConfigError, match="damaged.*model.safetensors is missing"):
        resolve_resume(auto_run(), str(tmp_path))


def test_an_explicit_damaged_checkpoint_is_refused(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=0)
    bad = publish(mgr, 2)
    os.truncate(os.path.join(bad, "model", "model.safetensors"), 1)
    with pytest.raises(ConfigError, match="damaged"):
        mgr.resolve(bad)


class FillingDisk(LocalFileSystem):
    """A local file system that runs out of space once ``full`` is set."""

    full = False

    def open(self, path, mode="rb", **kwargs):
        if FillingDisk.full and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return super().open(path, mode, **kwargs)


def test_a_full_disk_mid_commit_keeps_the_previous_checkpoint(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep=0)
    good = publish(mgr, 2)
    pending = mgr.begin(4)
    mgr.fs = FillingDisk()
    FillingDisk.full = True
    try:
        with pytest.raises(ResourceError, match="No space left.*writable.*intact"):
            mgr.commit(pending, {})
    finally:
        FillingDisk.full = False
    assert CheckpointManager(str(tmp_path)).latest() == good


def test_a_checkpoint_directory_that_cannot_be_created_is_named(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    mgr = CheckpointManager(str(blocker / "checkpoints"))
    with pytest.raises(ResourceError, match="checkpoints"):
        mgr.begin(1)
