"""The gsm8k_tiny generator end to end: it writes Parquet files and a chat checkpoint, and the
run loads them as it loads a user's (``model.path``, ``task.path``). The run is
``experiment=gsm8k_tool`` (the same generator with ``task.params.tool``): its episodes call
PythonEnv's ``python`` tool through the chat template's BPE tokens, which the base checkpoint
learned from its supervised demonstrations.

Short (two steps, short responses): that the path works through Ray, workers, the chat
template and the tool; the learning curves are measured by hand (docs/data.md,
docs/agents.md), not asserted here; plain ``experiment=gsm8k_tiny`` learns in
``test_gsm8k_tiny_learns.py``. The README's
own-checkpoint command (``task.generate=null``) is put through the pre-Ray checks by
``tests/unit/docs/test_doc_commands.py``. The run joins the test session's Ray
(``cluster.address``, the shape of the default local one) instead of starting its own: its
subject is the generator and the run, not Ray's start (``test_entry_point.py`` runs the main
command end to end with its own Ray).
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
    "trainer.total_steps=2",
    "trainer.eval_every=2",
    "trainer.train_batch_size=4",
    "rollout.n_samples_per_prompt=4",
    "rollout.max_new_tokens=24",  # a call and an answer each fit
    "logging.progress=false",
    "logging.trace=false",
]


def rltrain(run_dir: pathlib.Path, cache: pathlib.Path, *overrides: str):
    cmd = [sys.executable, "-m", "rltrain", f"hydra.run.dir={run_dir}", *SHORT, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLTRAIN_CACHE": str(cache)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)


@pytest.mark.timeout(600)
def test_gsm8k_tiny_generates_its_checkpoint_and_trains_from_it(tmp_path, ray_address):
    cache = tmp_path / "cache"
    sizes = ["task.params.num_train=256", "task.params.num_eval=8", "task.params.sft_steps=60"]
    joined = f"cluster.address={ray_address}"
    out = rltrain(tmp_path / "run", cache, "experiment=gsm8k_tool", *sizes, joined)
    assert out.returncode == 0, out.stderr[-3000:]
    shown = out.stdout + out.stderr  # each stage of the generator is logged as it starts
    assert "gsm8k_tiny: writing 256 training and 8 evaluation problems" in shown
    assert "gsm8k_tiny: supervising the base checkpoint (60 steps of 32 solutions)" in shown
    data = cache / "gsm8k_tool"
    assert {p.name for p in data.iterdir()} >= {"train.parquet", "eval.parquet", "base_model"}
    assert (data / "base_model" / "tokenizer.json").is_file()  # a plain save_pretrained dir
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    records = read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
    assert 0.0 <= records[-1]["eval/accuracy"] <= 1.0
    assert records[-1]["response/length_mean"] > 0
    steps = [r for r in records if "rollout/turns" in r]
    assert len(steps) == 2
    assert all(r["rollout/tool_calls"] > 0 for r in steps)  # the demonstrations taught the call
    # the sampled tokens themselves, results masked: float32 noise only (4e-5 seen in 200 steps)
    assert all(r["rollout/logprob_gap_max"] <= 1e-4 for r in steps)
