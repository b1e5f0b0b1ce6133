"""Spans from workers and the driver end up in one Chrome trace, a lane per device and process."""

from __future__ import annotations

import json

import pytest

from rltrain.placement.strategies import PackedPlacementStrategy
from rltrain.scheduler import Worker
from rltrain.telemetry import trace

pytestmark = pytest.mark.timeout(120)


class Traced(Worker):
    def step(self) -> int:
        with trace.span("generate", "rollout", self.device_labels):
            return sum(range(1000))


def test_worker_and_driver_spans_in_one_trace(cluster, tmp_path):
    trace.drain()
    group = Traced.create_group().launch(
        cluster, name="rollout", placement_strategy=PackedPlacementStrategy(0, 1)
    )
    with trace.span("step", "driver"):
        group.call(Traced.step).wait(timeout=60)
    spans = cluster.collect_spans()
    assert sorted((s.name, s.process, s.devices) for s in spans) == [
        ("generate", "rollout[0]", ("node0/dev0",)),
        ("generate", "rollout[1]", ("node0/dev1",)),
        ("step", "driver", ()),
    ]
    driver = next(s for s in spans if s.process == "driver")
    for s in spans:  # worker spans happen inside the driver's span
        assert (
            driver.start_us <= s.start_us
            and s.start_us + s.dur_us <= driver.start_us + driver.dur_us + 1
        )

    doc = json.loads(trace.write_chrome_trace(spans, tmp_path / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert lanes == {
        "device node0/dev0",
        "device node0/dev1",
        "process rollout[0]",
        "process rollout[1]",
        "process driver",
    }
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 5  # each worker span on its device lane and its process lane
    assert cluster.collect_spans() == []  # drained
