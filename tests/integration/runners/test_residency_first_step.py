"""The first update's lease makes the room the plan makes, counting the optimizer state the step
creates: the command in a subprocess, its trace read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Two simulated devices of 0.0347 GiB: the actor's train stage (weights, grads, Adam moments and
# the activations of 64-row micro-batches) fits only with the rollout's weights away.
TIGHT = (
    "placement=collocated",
    "placement.fuse=false",
    "cluster.device_memory_gib=0.0347",
    "actor.micro_batch_size=64",
    "algorithm.entropy_coef=0.05",
    "trainer.total_steps=1",
    "trainer.eval_every=0",
    "logging.progress=false",
)


def spans(run_dir) -> list[tuple[float, str, str]]:
    """``(start, span name, process name)`` of every process span in the run's trace, in order."""
    with open(os.path.join(run_dir, "trace.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    return sorted(
        (e["ts"], e["name"], names.get(e["pid"], ""))
        for e in events
        if e.get("ph") == "X" and names.get(e["pid"], "").startswith("process ")
    )


@pytest.mark.timeout(420)
def test_step_0_train_runs_with_the_rollout_weights_offloaded(tmp_path):
    cmd = [sys.executable, "-m", "rltrain", f"hydra.run.dir={tmp_path}", *TIGHT]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = spans(tmp_path)
    for rank in (0, 1):
        train = next(
            ts for ts, name, proc in seen if (name, proc) == ("train", f"process actor[{rank}]")
        )
        moves = [
            name
            for ts, name, proc in seen
            if proc == f"process rollout[{rank}]" and ts < train and name in ("offload", "reload")
        ]
        assert moves and moves[-1] == "offload", moves  # away when the update began
