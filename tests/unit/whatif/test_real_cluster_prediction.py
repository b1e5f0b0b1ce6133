"""Without ``whatif.hardware`` a cluster of real GPUs gets no simulated-device step time."""

from __future__ import annotations

import json

from rltrain.config.schema import RunConfig
from rltrain.placement.plan import build_plan
from rltrain.placement.types import ClusterSpec
from rltrain.whatif.predict import hardware_needed
from rltrain.whatif.report import TRACE_FILE, plan_prediction


def planned(simulate: bool, hardware: str | None = None):
    run = RunConfig()
    run.cluster.devices_per_node = 2
    run.cluster.device_memory_gib = 80.0
    run.cluster.simulate_devices = simulate
    run.whatif.hardware = hardware
    run.whatif.rank_candidates = False
    run.placement.component_placement = {"actor,rollout": "0-1"}
    return run, build_plan(run, ClusterSpec.from_config(run.cluster), check_fit=False)


def test_real_gpus_without_hardware_print_what_to_set(tmp_path, capsys):
    run, plan = planned(simulate=False)
    assert plan_prediction(run, plan, str(tmp_path), lambda r, p: False) == {}
    out = capsys.readouterr().out
    assert "predicted: none: the cluster's devices are real GPUs" in out
    assert "set whatif.hardware to the GPU the cluster runs on (one of ['a100'," in out
    assert " s/step on sim" not in out and not (tmp_path / TRACE_FILE).exists()


def test_simulated_devices_and_catalogue_hardware_are_predicted(tmp_path, capsys):
    for simulate, hardware, device in ((True, None, "sim"), (False, "h100", "h100")):
        run, plan = planned(simulate, hardware)
        assert hardware_needed(run, plan.cluster) == ""
        data = plan_prediction(run, plan, str(tmp_path), lambda r, p: False)
        assert data["predicted"]["hardware"] == device
        assert f" s/step on {device} " in capsys.readouterr().out
        assert json.loads((tmp_path / TRACE_FILE).read_text())["otherData"]["predicted"]
