"""``mode=plan whatif.hardware=<name>`` resolves the plan on that accelerator's memory: the
table, the fit check and the prediction describe the hardware asked about, not the configured
cluster's 4 GiB simulated devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _plan(tmp_path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env["COLUMNS"] = "160"
    return subprocess.run(
        [sys.executable, "-m", "rltrain", "mode=plan", f"hydra.run.dir={tmp_path}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )


def test_a_model_too_big_for_the_simulated_devices_plans_on_the_named_hardware(tmp_path):
    # qwen2-0.5B's actor needs ~8 GiB: over the default cluster's 4 GiB devices, within an
    # H100's 80 GiB
    out = _plan(
        tmp_path,
        "whatif.hardware=h100",
        "model=qwen2_0_5b",
        "placement=disaggregated",
        "whatif.rank_candidates=false",
    )
    assert out.returncode == 0, out.stderr
    assert "does not fit" not in out.stderr
    assert "of 80.00 GiB" in out.stdout and "of 4.00 GiB" not in out.stdout
    # null micro-batch sizes are chosen on the same hardware as the plan
    assert "none fits" not in out.stdout + out.stderr
    assert "micro_batch_size=" in out.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["predicted"]["hardware"] == "h100"
