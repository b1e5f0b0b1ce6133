"""A worker on a real local Ray trains and offloads under spans; the run's timeline files follow."""

from __future__ import annotations

import json

import pytest

from rltrain.placement.strategies import PackedPlacementStrategy
from rltrain.scheduler import Worker
from rltrain.telemetry import timeline
from rltrain.telemetry import trace as spans_api
from rltrain.telemetry.trace import device_label

pytestmark = pytest.mark.timeout(180)


class OffloadingActor(Worker):
    """A tiny model that trains, offloads and reloads its state, each under its span."""

    def __init__(self) -> None:
        import torch

        from rltrain.backends.offload import StateMover

        self.model = torch.nn.Linear(256, 256)
        self.opt = torch.optim.AdamW(self.model.parameters())
        self.mover = StateMover(self.model, self.opt)

    def step(self) -> int:
        import torch

        lanes = self.device_labels
        with spans_api.span("train", "actor", lanes):
            self.model(torch.randn(32, 256)).square().mean().backward()
            self.opt.step()
        with spans_api.span("offload", "actor", lanes):
            moved = self.mover.offload()
        with spans_api.span("reload", "actor", lanes):
            self.mover.reload()
        return moved


def test_run_timeline_from_real_workers(cluster, tmp_path):
    spans_api.drain()
    group = OffloadingActor.create_group().launch(
        cluster, name="actor", placement_strategy=PackedPlacementStrategy(0, 0)
    )
    with spans_api.span("wait", "driver"):
        moved = group.call(OffloadingActor.step).wait(timeout=60)
    assert moved[0] > 4 * 256 * 256 * 4  # weights, grads and two moments went to the host

    devices = [device_label(n.rank, d) for n in cluster.spec.nodes for d in range(n.num_devices)]
    assert devices == ["node0/dev0", "node0/dev1"]
    summary = timeline.write_run_timeline(tmp_path, cluster.collect_spans(), devices)

    doc = json.loads((tmp_path / timeline.TRACE_FILE).read_text())
    lanes = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert lanes == {"device node0/dev0", "device node0/dev1", "process actor[0]", "process driver"}
    for e in doc["traceEvents"]:
        assert e["ph"] in ("M", "X") and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert {"name", "cat", "ts", "dur", "tid"} <= set(e) and e["dur"] >= 0

    dev0, dev1 = summary["devices"]["node0/dev0"], summary["devices"]["node0/dev1"]
    assert set(dev0["by_stage_s"]) == {"train", "offload", "reload"}
    assert 0 < dev0["memory_s"] < dev0["busy_s"] <= summary["window_s"]
    assert dev1["busy_s"] == 0 and dev1["idle_s"] == pytest.approx(summary["window_s"])
    assert summary["processes"]["driver"]["wait_s"] == pytest.approx(summary["window_s"])
    assert timeline.read_utilization(tmp_path) == json.loads(json.dumps(summary))

    from rltrain.telemetry import draw as render

    assert render.main([str(tmp_path)]) == 0
    assert (tmp_path / timeline.TRACE_PNG).stat().st_size > 1000
