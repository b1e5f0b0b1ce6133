"""The lease's vLLM steps run with the vllm bundle alone (no Ray, Hydra or DeepSpeed), and the
plain baseline of its first call with the machine's own packages alone.

The GPU machine gets vLLM and the rest (Ray, Hydra, DeepSpeed) as separate bundles, and the
vLLM steps (tools/gpu/vllm_engine.py, tests/gpu/test_vllm_rollout_gpu.py) must run where
only the first is unpacked. Here, in a fresh interpreter that sees this environment's packages
less ``ray``, ``hydra`` and ``deepspeed`` (a site folder of links to the others, ``python -S``),
the code those steps run is imported and driven: the rollout worker generates (the worker path
the vLLM engine takes too: weight sync, the cancellation check), and the standalone baseline
writes its model directory and prompts.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
from pathlib import Path

from tiny_bundles import GPU_TOOLS, ROOT

BUNDLE = GPU_TOOLS / "bundles" / "vllm.txt"
WITHOUT = ("ray", "hydra", "deepspeed")

SCRIPT = r"""
import sys, tempfile
from pathlib import Path

WITHOUT = {without!r}
for name in WITHOUT:
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(f"{{name}} is importable: the site folder leaves nothing out")

# what the vLLM steps import: the rollout modules, the GPU test's imports, the baseline
import rltrain.algorithms.logprobs
import rltrain.backends.generation
import rltrain.backends.vllm_rollout
import rltrain.placement.transport_choice
import rltrain.backends.weight_sync.ipc
import rltrain.backends.weight_sync.transport
import rltrain.tasks.model
from rltrain.config.schema import RunConfig
from rltrain.workers.rollout import RolloutWorker

run = RunConfig()
run.rollout.n_samples_per_prompt = 2
run.rollout.max_new_tokens = 3
worker = RolloutWorker(run)
batch = worker.generate(["1+2=", "3+4="], step=0)
assert batch.size == 4, batch.size

sys.path.insert(0, {tools!r})
import vllm_engine

with tempfile.TemporaryDirectory() as d:
    facts = vllm_engine.write_model_dir(Path({model!r}), Path(d))
    assert (Path(d) / "config.json").is_file() and facts["params"] > 0
assert len(vllm_engine.prompts_of_step(0, 8)) == 8
print("imported:", sorted(m for m in sys.modules if m.split(".")[0] in WITHOUT))
"""


def site_without(dest: Path, names: tuple[str, ...]) -> Path:
    """A site folder of links to every package of this interpreter's but ``names`` (and their
    metadata): to an interpreter started with ``-S``, they are not installed."""
    dest.mkdir()
    for sp in map(Path, site.getsitepackages()):
        for entry in sp.iterdir():
            top = re.split(r"[-.]", entry.name, maxsplit=1)[0].lower()
            if top in names or top == "hydra_core" or (dest / entry.name).exists():
                continue
            (dest / entry.name).symlink_to(entry)
    return dest


def test_the_vllm_steps_run_without_ray_hydra_or_deepspeed(tmp_path):
    script = SCRIPT.format(
        without=WITHOUT, tools=str(GPU_TOOLS), model=str(ROOT / "conf/model/qwen2_0_5b.yaml")
    )
    sites = site_without(tmp_path / "site", WITHOUT)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{sites}"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "imported: []"


PLAIN = r"""
import sys

for name in {without!r}:
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(f"{{name}} is importable: the site folder leaves nothing out")
sys.path.insert(0, {tools!r})
import plain_loop_gpu

sys.exit(plain_loop_gpu.main(["--out", "plain.json", "--device", "cpu", "--steps", "1",
                              "--max-new-tokens", "3", "--batch", "2", "--samples", "2",
                              "--model-yaml", {model!r}]))
"""


def test_the_plain_baseline_runs_on_the_machines_own_packages(tmp_path):
    """The first call runs it before any bundle is unpacked: nothing beyond torch,
    transformers and pyyaml (on the machine), and rltrain's checkout."""
    without = (*WITHOUT, "omegaconf", "antlr4", "vllm")
    script = PLAIN.format(
        without=without, tools=str(GPU_TOOLS), model=str(ROOT / "conf/model/tiny_qwen2.yaml")
    )
    sites = site_without(tmp_path / "site", without)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{sites}"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "plain.json").is_file()


def test_the_vllm_bundle_holds_none_of_them():
    pinned = re.findall(r"^([A-Za-z0-9._-]+)==", BUNDLE.read_text(), flags=re.M)
    assert "vllm" in pinned and "omegaconf" in pinned
    assert not [p for p in pinned if p.split("-")[0].lower() in WITHOUT]
