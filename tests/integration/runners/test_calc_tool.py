"""experiment=calc_tool end to end, briefly: the generator writes its sums and a checkpoint
supervised on tool-call demonstrations, and multi-turn episodes with the calculator run through
Ray on both generation paths (the fused worker, and the separate rollout worker), with 10 %
injected tool failures on one of them.

Two steps each, on small sums: that the tool is called, turns and failures are counted and the
rollout's log-probs are the trainer's (token-exact trajectories); the learning curve is measured
by hand (docs/agents.md), not asserted here. Both runs join the test session's Ray
(``cluster.address``, the shape of the default local one: one node, 2 simulated devices) instead
of starting one each: their subject is the episodes, not Ray's start.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from rltrain.telemetry.metrics import read_metrics

SHORT = [
    "experiment=calc_tool",
    "trainer.total_steps=2",
    "trainer.eval_every=2",
    "trainer.train_batch_size=4",
    "rollout.n_samples_per_prompt=4",
    "task.params.num_train=60",
    "task.params.num_eval=8",
    "task.params.num_terms=2",
    "task.params.digits=1",
    "task.params.sft_steps=60",
    "logging.progress=false",
    "logging.trace=false",
    "cluster.startup_timeout_s=600",  # the shared 2-core machine starts 5 workers slowly
]


def rltrain(run_dir: pathlib.Path, cache: pathlib.Path, *overrides: str):
    cmd = [sys.executable, "-m", "rltrain", f"hydra.run.dir={run_dir}", *SHORT, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLTRAIN_CACHE": str(cache)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)


@pytest.mark.timeout(900)
def test_calc_tool_episodes_call_the_tool_on_both_generation_paths(tmp_path, ray_address):
    cache = tmp_path / "cache"
    joined = f"cluster.address={ray_address}"
    for name, extra in (
        ("fused", ["placement.fuse=auto"]),
        ("separate", ["placement.fuse=false", "simulate.tool_failure_rate=0.1"]),
    ):
        out = rltrain(tmp_path / name, cache, *extra, joined)
        assert out.returncode == 0, out.stderr[-3000:]
        records = read_metrics(str(tmp_path / name / "metrics.jsonl"))
        steps = [r for r in records if "rollout/turns" in r]
        assert len(steps) == 2
        samples = 4 * 4
        for r in steps:
            assert r["rollout/tool_calls"] > 0  # the supervised model calls the calculator
            assert samples <= r["rollout/turns"] <= 3 * samples
            # observation tokens masked out (unmasked, the gap is O(1)); the batch shapes and the
            # caches kept across tool waits round differently: ~2e-5 at most (the 1e-5 exactness
            # test is tests/unit/agents/test_tool_episodes.py on one batch)
            assert r["rollout/logprob_gap_max"] <= 1e-4
        assert 0.0 <= records[-1]["eval/accuracy"] <= 1.0
        if name == "separate":
            assert all("rollout/infra_failed" in r for r in steps)
        # the tool pool's actors (component tools, on the node the plan gave) ran the calls
        pool = json.loads((tmp_path / name / "summary.json").read_text())["tool_pool"]
        assert pool["workers"] == 2 and pool["nodes"] == [0, 0]
        assert all(n > 0 for n in pool["steps"])
    assert {p.name for p in (cache / "calc_tool").iterdir()} >= {"train.jsonl", "base_model"}
