"""A problem the config checks and preflight both find is reported once, whatever fix each
words."""

from __future__ import annotations

import os
import subprocess
import sys

from rltrain.app import _statement


def test_a_missing_data_file_is_listed_once(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("HYDRA_FULL_ERROR", None)
    out = subprocess.run(
        [sys.executable, "-m", "rltrain", "task.name=jsonl", "task.path=rows.jsonl",
         "hydra.job.chdir=true", "mode=plan", "trainer.total_steps=-1", "hydra.run.dir=r"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("task.path='rows.jsonl' does not exist") == 1, out.stderr
    assert "2 configuration problems" in out.stderr  # the other problem is still there


def test_problems_of_one_key_merge_only_when_they_state_the_same_thing():
    assert _statement("task.path='a.jsonl' does not exist: give a file") == (
        "task.path='a.jsonl' does not exist"
    )
    # "key=value: reason" states only the key: the whole message tells two problems apart
    assert _statement("trainer.x=3: must be even") == "trainer.x=3: must be even"
    assert _statement("no colon here") == "no colon here"
