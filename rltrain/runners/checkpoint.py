"""Atomic checkpoints on a local path or any fsspec URI.

A checkpoint is a directory ``step-000120/`` under the checkpoint root, holding the model in
Hugging Face format (safetensors), the optimizer, RNG states, the data cursor and the step. It is
written into a temporary directory first and renamed into place; then the ``latest`` pointer is
replaced. A crash at any moment leaves the previous ``latest`` pointing at a complete checkpoint.

Workers on other nodes cannot write into the driver's run directory: on a multi-node cluster
point ``trainer.checkpoint_dir`` at shared storage (NFS, or an fsspec URI such as ``s3://``).
"""

from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec

from rltrain.errors import ConfigError

STATE_FILE = "trainer_state.json"
LATEST = "latest"


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint being written: workers write into ``path``; :meth:`commit` publishes it."""

    root: str
    step: int
    path: str  # the temporary directory to write into

    @property
    def final_path(self) -> str:
        return posixpath.join(self.root, f"step-{self.step:06d}")


class CheckpointManager:
    """Writes, publishes and finds checkpoints under one root (a path or fsspec URI).

    Args:
        root: the checkpoint directory (``trainer.checkpoint_dir``).
        keep: how many published checkpoints to keep (older ones are deleted); 0 keeps all.
    """

    def __init__(self, root: str, keep: int = 2) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(root)
        self.url = root
        self.keep = keep

    def begin(self, step: int) -> PendingCheckpoint:
        """Create a fresh temporary directory for the checkpoint of ``step``."""
        tmp = posixpath.join(self.root, f".tmp-step-{step:06d}-{uuid.uuid4().hex[:8]}")
        self.fs.makedirs(tmp, exist_ok=True)
        return PendingCheckpoint(self.root, step, tmp)

    def commit(self, pending: PendingCheckpoint, state: dict[str, Any]) -> str:
        """Write the trainer state, move the directory into place and point ``latest`` at it.

        Args:
            pending: the checkpoint whose files the workers have written.
            state: JSON-serialisable trainer state (step, data cursor, model fingerprint, ...).

        Returns:
            The published checkpoint's path.
        """
        with self.fs.open(posixpath.join(pending.path, STATE_FILE), "w") as f:
            json.dump({**state, "step": pending.step}, f, indent=1)
        final = pending.final_path
        if self.fs.exists(final):
            self.fs.rm(final, recursive=True)
        self.fs.mv(pending.path, final, recursive=True)
        tmp_latest = posixpath.join(self.root, f".{LATEST}-{uuid.uuid4().hex[:8]}")
        with self.fs.open(tmp_latest, "w") as f:
            f.write(posixpath.basename(final))
        self.fs.mv(tmp_latest, posixpath.join(self.root, LATEST))
        self._prune()
        return self._url(final)

    def latest(self) -> str | None:
        """Path of the newest complete checkpoint, or None when there is none."""
        pointer = posixpath.join(self.root, LATEST)
        if not self.fs.exists(pointer):
            return None
        with self.fs.open(pointer) as f:
            name = f.read().decode().strip()
        path = posixpath.join(self.root, name)
        if not self.fs.exists(posixpath.join(path, STATE_FILE)):
            return None
        return self._url(path)

    def resolve(self, resume: str | None) -> str | None:
        """Turn ``trainer.resume`` (null, ``auto`` or a path) into a checkpoint path or None.

        Raises:
            ConfigError: when a given path holds no complete checkpoint.
        """
        if resume is None:
            return None
        if resume == "auto":
            return self.latest()
        fs, path = fsspec.core.url_to_fs(resume)
        if fs.exists(posixpath.join(path, LATEST)) and not fs.exists(
            posixpath.join(path, STATE_FILE)
        ):
            return CheckpointManager(resume).latest()
        if not fs.exists(posixpath.join(path, STATE_FILE)):
            raise ConfigError(
                f"trainer.resume={resume!r} holds no complete checkpoint ({STATE_FILE} missing): "
                f"give a step-NNNNNN directory, its parent, or resume=auto"
            )
        return resume

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        steps = sorted(
            p
            for p in self.fs.ls(self.root, detail=False)
            if posixpath.basename(p).startswith("step-")
        )
        for old in steps[: -self.keep]:
            self.fs.rm(old, recursive=True)

    def _url(self, path: str) -> str:
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return path if protocol in ("file", "local") else f"{protocol}://{path}"


def read_state(checkpoint: str) -> dict[str, Any]:
    """Read the trainer state of a published checkpoint."""
    fs, path = fsspec.core.url_to_fs(checkpoint)
    with fs.open(posixpath.join(path, STATE_FILE)) as f:
        return json.load(f)
