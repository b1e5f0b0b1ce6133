"""Utilization summary of a timeline, checked against hand-computed numbers."""

from __future__ import annotations

import json

import pytest

from rltrain.errors import ConfigError
from rltrain.telemetry import timeline
from rltrain.telemetry.trace import Span, to_chrome_trace

S = 1e6  # microseconds per second


def sp(name, component, devices, process, start_s, dur_s):
    return Span(name, component, tuple(devices), process, start_s * S, dur_s * S, 1)


def collocated_step():
    """One 10 s step on dev0 (dev1 is in the plan but never used; a CPU reward process).

    dev0: generate 0-4, offload 4-5, reload 5-6, train 6-8 (with an overlapping logprob 7-8.5
    from the reference), idle 8.5-9, weight sync ("sync") 9-9.5, idle 9.5-10.
    The driver waits 0-10, the reward process works 4-5.
    """
    return [
        sp("generate", "rollout", ["node0/dev0"], "rollout[0]", 0, 4),
        sp("offload", "rollout", ["node0/dev0"], "rollout[0]", 4, 1),
        sp("reload", "actor", ["node0/dev0"], "actor[0]", 5, 1),
        sp("train", "actor", ["node0/dev0"], "actor[0]", 6, 2),
        sp("logprobs", "reference", ["node0/dev0"], "reference[0]", 7, 1.5),
        sp("sync", "actor", ["node0/dev0"], "actor[0]", 9, 0.5),
        sp("reward", "reward", [], "reward[0]", 4, 1),
        sp("wait_rollout", "driver", [], "driver", 0, 10),
    ]


def test_interval_arithmetic_by_hand():
    merged = timeline.merge([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)])
    assert merged == [(0, 4), (5, 6)]  # overlapping and touching join; empty dropped
    assert timeline.covered(merged) == 5
    assert timeline.gaps(merged, -1, 10) == [1, 1, 4]  # leading, middle, trailing
    assert timeline.gaps([], 0, 3) == [3]


def test_stage_names_and_kinds():
    assert timeline.canonical_stage("sync") == "weight_sync"
    assert timeline.canonical_stage("logprobs") == "logprob"
    assert timeline.canonical_stage("wait_lease") == "wait"
    assert timeline.stage_kind("offload") == timeline.stage_kind("weight_sync") == "memory"
    assert timeline.stage_kind("generate") == timeline.stage_kind("my_custom") == "compute"
    for stage in ("generate", "env_step", "reward", "logprob", "train", "offload", "reload"):
        assert stage in timeline.STAGES


def test_summary_of_a_collocated_step_by_hand():
    s = timeline.summarize(collocated_step(), ["node0/dev0", "node0/dev1"])
    assert s["window_s"] == pytest.approx(10.0)
    dev0 = s["devices"]["node0/dev0"]
    # busy: 0-8.5 and 9-9.5 = 9 s; memory: offload 1 + reload 1 + sync 0.5
    assert dev0["busy_s"] == pytest.approx(9.0)
    assert dev0["busy_fraction"] == pytest.approx(0.9)
    assert dev0["idle_s"] == pytest.approx(1.0)
    assert dev0["idle_gaps"] == 2 and dev0["longest_idle_gap_s"] == pytest.approx(0.5)
    assert dev0["mean_idle_gap_s"] == pytest.approx(0.5)
    assert dev0["memory_s"] == pytest.approx(2.5) and dev0["memory_fraction"] == pytest.approx(0.25)
    assert dev0["wait_s"] == 0
    assert dev0["by_component_s"] == pytest.approx({"actor": 3.5, "reference": 1.5, "rollout": 5.0})
    assert dev0["by_stage_s"] == pytest.approx(
        {"generate": 4, "logprob": 1.5, "offload": 1, "reload": 1, "train": 2, "weight_sync": 0.5}
    )
    dev1 = s["devices"]["node0/dev1"]  # in the plan, never used: idle the whole window
    assert dev1["busy_fraction"] == 0 and dev1["idle_gaps"] == 1
    assert dev1["longest_idle_gap_s"] == pytest.approx(10.0)
    driver = s["processes"]["driver"]  # a wait is not work
    assert driver["busy_s"] == 0 and driver["wait_s"] == pytest.approx(10.0)
    assert s["processes"]["reward[0]"]["busy_fraction"] == pytest.approx(0.1)
    assert s["stages_s"]["generate"] == pytest.approx(4.0)
    assert s["stages_s"]["reward"] == pytest.approx(1.0)


def test_chrome_trace_gives_the_same_summary_as_spans():
    spans = collocated_step()
    doc = json.loads(json.dumps(to_chrome_trace(spans)))
    assert timeline.summarize(doc) == timeline.summarize(spans)
    assert timeline.summarize(doc["traceEvents"]) == timeline.summarize(spans)


def test_devices_outside_the_list_are_added_and_short_gaps_not_counted():
    spans = [
        sp("train", "actor", ["node0/dev2"], "actor[0]", 0, 1),
        sp("train", "actor", ["node0/dev2"], "actor[0]", 1.0005, 1),
        sp("train", "actor", ["node0/dev10"], "actor[1]", 0, 2.0005),
    ]
    s = timeline.summarize(spans, ["node0/dev0"])
    assert list(s["devices"]) == ["node0/dev0", "node0/dev2", "node0/dev10"]  # natural order
    dev2 = s["devices"]["node0/dev2"]
    assert dev2["idle_gaps"] == 0  # a 0.5 ms gap is below MIN_GAP_S ...
    assert dev2["idle_s"] == pytest.approx(0.0005)  # ... but its time is still idle


def test_window_clips_and_bad_window_is_refused():
    s = timeline.summarize(collocated_step(), window_us=(2 * S, 6 * S))
    dev0 = s["devices"]["node0/dev0"]
    assert s["window_s"] == pytest.approx(4.0) and dev0["busy_fraction"] == pytest.approx(1.0)
    assert dev0["by_stage_s"]["generate"] == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="end precedes"):
        timeline.summarize(collocated_step(), window_us=(5.0, 1.0))


def test_empty_trace_and_headline():
    s = timeline.summarize([], ["node0/dev0"])
    assert s["window_s"] == 0 and s["devices"]["node0/dev0"]["busy_fraction"] == 0
    assert timeline.headline({"devices": {}})["busy_fraction_mean"] is None
    h = timeline.headline(timeline.summarize(collocated_step(), ["node0/dev0", "node0/dev1"]))
    assert h["busy_fraction_mean"] == pytest.approx(0.45)
    assert h["busy_fraction_min"] == 0
    assert h["memory_fraction_mean"] == pytest.approx(0.125)
    assert h["longest_idle_gap_s"] == pytest.approx(10.0)


def test_text_table_has_a_row_per_lane():
    s = timeline.summarize(collocated_step(), ["node0/dev0", "node0/dev1"])
    table = timeline.format_table(s)
    lines = table.splitlines()
    assert lines[0].startswith("timeline: 10.000 s window, 2 lanes")
    dev0 = next(line for line in lines if line.startswith("node0/dev0"))
    assert "90.0%" in dev0 and "25.0%" in dev0 and "rollout 50.0%" in dev0
    assert "driver" in timeline.format_table(s, processes=True)


def test_trace_with_plan_devices_has_a_lane_for_each_in_order():
    spans = collocated_step()
    plan = ["node0/dev0", "node0/dev1", "node1/dev0"]
    doc = json.loads(json.dumps(timeline.chrome_trace_with_devices(spans, plan)))
    names = {
        e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"
    }
    order = {
        e["pid"]: e["args"]["sort_index"]
        for e in doc["traceEvents"]
        if e.get("name") == "process_sort_index"
    }
    lanes = [names[p] for p in sorted(names, key=order.get)]
    assert lanes[:3] == ["device node0/dev0", "device node0/dev1", "device node1/dev0"]
    assert set(lanes[3:]) == {
        "process rollout[0]",
        "process actor[0]",
        "process reference[0]",
        "process reward[0]",
        "process driver",
    }
    assert doc["otherData"]["devices"] == plan
    assert timeline.trace_devices(doc) == plan
    assert len([e for e in doc["traceEvents"] if e["ph"] == "X"]) == 6 * 2 + 2


def test_write_and_read_a_run_timeline(tmp_path):
    s = timeline.write_run_timeline(tmp_path, collocated_step(), ["node0/dev0", "node0/dev1"])
    assert timeline.read_utilization(tmp_path) == json.loads(json.dumps(s))
    doc = timeline.load_trace(tmp_path)
    assert doc == timeline.load_trace(tmp_path / timeline.TRACE_FILE)
    assert timeline.summarize(doc, timeline.trace_devices(doc)) == s
    assert timeline.read_utilization(tmp_path / "nowhere") is None


def test_unreadable_traces_are_refused_with_the_path(tmp_path):
    with pytest.raises(ConfigError, match="no timeline trace at .*trace.json"):
        timeline.load_trace(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        timeline.load_trace(bad)
    bad.write_text('{"events": []}')
    with pytest.raises(ConfigError, match="no 'traceEvents'"):
        timeline.load_trace(bad)
    bad.write_text('[{"ph": "X", "name": "train", "pid": 1, "ts": 0, "dur": 5}]')
    assert timeline.load_trace(bad)["traceEvents"][0]["dur"] == 5  # bare-array form
    with pytest.raises(ConfigError, match="ts='soon'"):
        timeline.intervals([{"ph": "X", "name": "train", "pid": 1, "ts": "soon", "dur": 1}])


def test_plan_devices_of_a_real_plan():
    from rltrain.config.schema import RunConfig
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    run = RunConfig()
    run.cluster.devices_per_node = 4
    run.placement.component_placement = {"actor": "0-1", "rollout": "2"}
    plan = build_plan(run, ClusterSpec.from_config(run.cluster))
    assert timeline.plan_devices(plan) == ["node0/dev0", "node0/dev1", "node0/dev2"]


def test_run_utilization_starts_where_worker_start_up_ends(tmp_path):
    # 10 s of start-up, then 2 s of which dev0 works 1 s: 50 % busy, not 1/12
    spans = [
        sp("launch", "actor", (), "driver", 0, 10),
        sp("train", "actor", ("node0/dev0",), "actor[0]", 10, 1),
        sp("generate", "rollout", ("node0/dev1",), "rollout[0]", 11, 1),
    ]
    s = timeline.write_run_timeline(tmp_path, spans, ["node0/dev0", "node0/dev1"])
    assert s["window_s"] == pytest.approx(2.0)
    assert s["devices"]["node0/dev0"]["busy_fraction"] == pytest.approx(0.5)
    assert len(json.loads((tmp_path / "trace.json").read_text())["traceEvents"]) >= 3
