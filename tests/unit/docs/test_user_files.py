"""The README's own-checkpoint command without its ``task.generate=null`` line loses nothing.

``experiment=gsm8k_tiny`` generates its data set and base checkpoint; pointed at a reader's
checkpoint and GSM8K files it must refuse (exit 2, naming ``task.generate=null``) before it
writes or deletes anything, in ``mode=plan`` and in training alike.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from user_files import chat_checkpoint, data_file, fingerprint


@pytest.mark.parametrize("mode", ["plan", "train"])
def test_the_generator_refuses_a_readers_checkpoint_and_data(tmp_path, mode):
    mine = tmp_path / "mine"
    ckpt = chat_checkpoint(mine / "Qwen2.5-0.5B-Instruct")
    train = data_file(mine / "gsm8k" / "train.parquet")
    test = data_file(mine / "gsm8k" / "test.parquet")
    before = fingerprint(mine)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "rltrain",
        f"mode={mode}",
        "experiment=gsm8k_tiny",
        f"model.path={ckpt}",
        f"task.path={train}",
        f"task.eval_path={test}",
    ]
    env = {**os.environ, "RLTRAIN_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    for key, path in (("model.path", ckpt), ("task.path", train), ("task.eval_path", test)):
        assert f"{key}='{path}' exists and task.generate='gsm8k_tiny' did not write it" in (
            out.stderr
        )
    assert "set task.generate=null" in out.stderr
    assert fingerprint(mine) == before  # not a byte written, replaced or deleted
    assert sorted(os.listdir(tmp_path)) == ["cwd", "mine"]  # no cache, no lock file
    assert os.listdir(cwd) == []  # the refused run leaves no run directory
