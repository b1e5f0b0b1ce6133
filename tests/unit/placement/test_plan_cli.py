"""``python -m rltrain mode=plan`` in a subprocess: table, plan.json, plan.svg, no Ray, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

# Runs the real entry point, then reports which heavy modules the process imported.
PROBE = (
    "import sys; from rltrain.__main__ import main; sys.argv = ['rltrain', *sys.argv[1:]]; "
    "main(); print('HEAVY', sorted(m for m in ('ray', 'torch') if m in sys.modules))"
)


def plan_cli(tmp_path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["COLUMNS"] = "160"
    return subprocess.run(
        [sys.executable, "-c", PROBE, "mode=plan", f"hydra.run.dir={tmp_path}", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_plan_prints_writes_and_starts_nothing(tmp_path):
    out = plan_cli(tmp_path, "placement=hybrid", "cluster.devices_per_node=8")
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "hybrid plan: 1 node(s) x 8 device(s)" in out.stdout
    assert "shared with" in out.stdout and "rollout" in out.stdout
    assert "processes: one per planned process (placement.fuse=false)" in out.stdout
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["mode"] == "hybrid" and data["fits"] is True
    assert len(data["processes"]) == 10
    root = ET.parse(tmp_path / "plan.svg").getroot()
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "n0:d7" in texts and "generate" in texts and "train" in texts


def test_plan_for_a_cluster_far_larger_than_this_machine(tmp_path):
    # 1,024 prompts per step: the batch divides over the 1,024 actor ranks
    out = plan_cli(
        tmp_path, "cluster=ray", "cluster.num_nodes=128", "trainer.train_batch_size=1024"
    )
    assert out.returncode == 0, out.stderr
    assert "actor     │ 0-1023 │ 0-127" in out.stdout  # merged rows for alike processes
    assert "actor+rollout+reward fused, one process per actor rank" in out.stdout
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["cluster"]["num_devices"] == 1024 and len(data["devices"]) == 1024
    assert "showing the first 32 of 1024 devices" in (tmp_path / "plan.svg").read_text()


def test_plan_that_does_not_fit_exits_2_after_writing_it(tmp_path):
    out = plan_cli(
        tmp_path, "cluster=ray", "cluster.device_memory_gib=0.75", "placement=collocated"
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "does not fit" in out.stderr and "short by" in out.stderr
    assert "Traceback" not in out.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["fits"] is False


def test_bad_placement_names_the_component(tmp_path):
    out = plan_cli(tmp_path, "placement=disaggregated", "placement.component_placement.rollout=9")
    assert out.returncode == 2
    assert "component_placement['rollout']='9'" in out.stderr
    assert "ranks 0-1" in out.stderr


def test_placement_package_imports_neither_ray_nor_torch():
    code = (
        "import sys, rltrain.placement, rltrain.placement.plan, rltrain.runners.plan_command; "
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
