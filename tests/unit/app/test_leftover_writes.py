"""A run with its own ``trainer.checkpoint_dir`` removes the temporary writes a killed run
left there when it starts (gone writers' only: a live run sharing the directory keeps its)."""

from __future__ import annotations

import signal
import subprocess
import sys

from test_restart_policy import attempts_of

from rltrain import app
from rltrain.runners.checkpoint import CheckpointManager

KILLED = """
import os, signal, sys
from rltrain.runners.checkpoint import CheckpointManager
pending = CheckpointManager(sys.argv[1]).begin(4)
open(os.path.join(pending.path, "model.safetensors"), "wb").write(b"half")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_runs_writes_in_a_checkpoint_dir_are_removed_when_the_next_run_starts(
    monkeypatch, tmp_path
):
    root = tmp_path / "ckpts"
    published = CheckpointManager(str(root)).commit(CheckpointManager(str(root)).begin(2), {})
    # a run sharing nothing with this process starts a checkpoint write and is killed
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, str(root)], capture_output=True, text=True, check=False
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len([p for p in root.iterdir() if p.name.startswith(".tmp-step-")]) == 1
    done = {"status": "completed", "steps": 1, "wall_s": 1.0, "steps_per_s": 1.0}
    _, run = attempts_of(
        monkeypatch, tmp_path, [(done, 1)], f"trainer.checkpoint_dir={root}", "trainer.resume=auto"
    )
    app.train(run, str(tmp_path / "run"))
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002"]
    assert published.endswith("step-000002")
