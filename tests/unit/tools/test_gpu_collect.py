"""tools/gpu/collect.py: step breakdowns, memory per stage, the plan comparison and the targets,
on hand-made run outputs with hand-computed expectations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "gpu"))
import collect  # noqa: E402  (tools/gpu is not a package)

RECORDS = [  # step 0 is the warm-up: slow, left out of the medians
    {"time/generate_s": 10.0, "time/train_s": 5.0, "time/sync_s": 1.0, "time/step_s": 16.0,
     "perf/samples_per_s": 8.0, "perf/tokens_per_s": 100.0, "response/length_mean": 4.0},
    {"time/generate_s": 2.0, "time/train_s": 1.0, "time/sync_s": 0.1, "time/step_s": 3.1,
     "perf/samples_per_s": 128 / 3.1, "perf/tokens_per_s": 1000.0, "response/length_mean": 4.0},
    {"time/generate_s": 4.0, "time/train_s": 3.0, "time/sync_s": 0.3, "time/step_s": 7.3,
     "perf/samples_per_s": 128 / 7.3, "perf/tokens_per_s": 500.0, "response/length_mean": 6.0},
    {"time/generate_s": 3.0, "time/train_s": 2.0, "time/sync_s": 0.2, "time/step_s": 5.2,
     "perf/samples_per_s": 128 / 5.2, "perf/tokens_per_s": 800.0, "response/length_mean": 8.0},
]  # fmt: skip


def test_stage_medians_leave_out_the_warmup_steps():
    m = collect.stage_medians(RECORDS, warmup=1)
    assert m["steps_measured"] == 3
    assert m["stages_s"] == pytest.approx({"generate": 3.0, "train": 2.0, "sync": 0.2})
    assert m["step_s"] == pytest.approx(5.2)
    assert m["tokens_per_s"] == pytest.approx(800.0)
    assert m["samples_per_step"] == 128
    assert m["response_length_mean"] == pytest.approx(6.0)
    # generate tokens/s per step: 4*128/2 = 256, 6*128/4 = 192, 8*128/3 = 341.3 -> median 256
    assert m["generate_tokens_per_s"] == pytest.approx(256.0)
    assert m["switch_s"] == pytest.approx(0.2)  # only sync moves state here
    assert m["switch_share"] == pytest.approx(0.2 / 5.2)
    assert m["actor_allocator_peak_gib"] == {"allocated": None, "reserved": None}  # not CUDA


def test_the_actors_allocator_peaks_are_the_largest_of_any_step_warmup_included():
    peaks = [{"actor/memory_allocated_peak_gib": a, "actor/memory_reserved_peak_gib": r}
             for a, r in ((66.0, 69.0), (64.5, 70.25), (63.0, 71.0), (60.0, 66.0))]  # fmt: skip
    m = collect.stage_medians([{**rec, **p} for rec, p in zip(RECORDS, peaks, strict=True)], 1)
    assert m["actor_allocator_peak_gib"] == {"allocated": 66.0, "reserved": 71.0}


def test_switching_stages_are_the_ones_that_move_state():
    assert [s for s in ("offload", "reload", "sync", "sleep", "wake_kv_cache", "generate",
                        "train", "reward") if collect.is_switch(s)] == [
        "offload", "reload", "sync", "sleep", "wake_kv_cache"]  # fmt: skip


def test_memory_by_stage_is_the_peak_inside_each_stages_spans_above_the_base():
    spans = [("generate", 10, 12), ("train", 12.5, 15), ("generate", 20, 22)]
    samples = [(9, 100), (10.5, 500), (11, 700), (13, 900), (14, 800), (21, 750), (30, 100)]
    assert collect.memory_by_stage(spans, samples, base=100) == {"generate": 650, "train": 800}


def test_a_spans_first_samples_belong_to_the_stage_before():
    """The lease's vLLM run: training began as vLLM slept, and its first sample still held
    vLLM's 52 GB; without the settling time the train stage read 52.3 GB for 11-12."""
    spans = [("generate", 0.0, 4.0), ("offload", 4.0, 4.08), ("train", 4.1, 7.4)]
    samples = [(3.9, 53_000), (4.05, 52_990), (4.12, 51_990), (4.4, 12_370), (6.0, 11_850)]
    got = collect.memory_by_stage(spans, samples, base=0)
    assert got == {"generate": 53_000, "offload": 52_990, "train": 12_370}
    assert collect.memory_by_stage(spans, samples, base=0, settle_s=0)["train"] == 51_990


def test_device_spans_skip_lanes_that_are_not_devices():
    trace = {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "device node0/dev0"}},
            {"ph": "M", "name": "process_name", "pid": 5, "args": {"name": "driver"}},
            {"ph": "X", "name": "train", "pid": 1, "ts": 2_000_000, "dur": 500_000},
            {"ph": "X", "name": "generate", "pid": 5, "ts": 1_000_000, "dur": 100},
        ]
    }
    assert collect.device_spans(trace) == [("train", 2.0, 2.5)]


def test_plan_memory_reads_the_devices_profile():
    plan = {
        "devices": [{"node": 0, "device": 0, "memory_profile": 1}],
        "memory_profiles": [
            {"peak_bytes": 1, "stages": []},
            {"peak_bytes": 900, "capacity_bytes": 1000,
             "stages": [{"stage": "generate", "peak_bytes": 700},
                        {"stage": "train", "peak_bytes": 900}]},
        ],
    }  # fmt: skip
    assert collect.plan_memory(plan) == {
        "peak_bytes": 900,
        "capacity_bytes": 1000,
        "stages": {"generate": 700, "train": 900},
    }


@pytest.mark.parametrize(
    ("files", "status"),
    [
        ({"rc": "0\n"}, "ok"),
        ({"rc": "124\n"}, "timeout"),
        ({"rc": "137\n"}, "timeout"),
        ({"rc": "1\n"}, "failed (rc 1)"),
        ({"rc.skipped": "needs the vllm bundle\n"}, "skipped: needs the vllm bundle"),
        ({"rc.rehearsed": "rehearsed\n"}, "rehearsed"),
        ({}, "not run"),
    ],
)
def test_step_status(tmp_path, files, status):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert collect.step_status(tmp_path) == status


def test_pytest_counts_read_the_junit_report(tmp_path):
    xml = tmp_path / "pytest_x.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="1" failures="2" '
        'skipped="3" tests="10" time="1.0"></testsuite></testsuites>'
    )
    assert collect.pytest_counts(xml) == {"passed": 4, "failed": 2, "errors": 1, "skipped": 3}


def test_targets_from_collected_results():
    res = {
        "plain": {"summary": {"tokens_per_s": 1000.0, "step_s": 5.0}},
        "vllm_engine": {
            "tokens_per_s": 1000.0,
            "sleep_wake_summary": {
                "level1_tags": {"weights_GBps_sleep": 40.0, "weights_GBps_wake": 25.0}
            },
        },
        "runs": {
            "a_fused": {"tokens_per_s": 950.0, "step_s": 5.5, "memory": {}},
            "b_turns_ipc": {"stages_s": {"sync": 0.05}, "switch_share": 0.2,
                            "memory": {"plan_over_measured_peak": 1.04}},
            "c_vllm": {"generate_tokens_per_s": 900.0, "stages_s": {}, "switch_share": None,
                       "memory": {"plan_over_measured_peak": 0.9}},
        },
    }  # fmt: skip
    t = collect.targets(res)
    assert t["vllm_rollout_vs_engine_tokens_per_s"]["value"] == pytest.approx(0.9)
    assert t["vllm_rollout_vs_engine_tokens_per_s"]["met"] is True
    assert t["vllm_sleep_and_wake_GBps"] == {
        "value": 25.0, "goal": ">= 30 (slower of the two)", "met": False}  # fmt: skip
    assert t["ipc_sync_s_b_turns_ipc"]["met"] is True
    assert t["ipc_sync_s_c_vllm"]["met"] is None  # no sync stage recorded: not judged
    assert t["switch_share_b_turns_ipc"]["met"] is False
    assert t["switch_share_d_deepspeed"]["met"] is None  # run d did not run
    assert t["fused_step_vs_plain_per_token"]["value"] == pytest.approx(1000 / 950)
    assert t["fused_step_vs_plain_per_token"]["met"] is True
    assert t["fused_step_vs_plain_raw"]["value"] == pytest.approx(1.1)
    assert t["plan_peak_within_5pct_b_turns_ipc"]["met"] is True
    assert t["plan_peak_within_5pct_c_vllm"]["met"] is False
    assert t["plan_peak_within_5pct_a_fused"]["met"] is None


def test_collect_reads_a_run_directory(tmp_path):
    """One run as run.sh leaves it: rc, metrics, trace, memory samples and plan."""
    run = tmp_path / "b_turns_ipc"
    (run / "run").mkdir(parents=True)
    (run / "plan").mkdir()
    (run / "rc").write_text("0\n")
    (run / "seconds").write_text("42\n")
    switches = {"steps": 4, "max_new_tokens": 256, "vllm_eager": True}
    (run / "switches.json").write_text(json.dumps(switches))
    (run / "cmd.txt").write_text("python -m rltrain model=qwen2_0_5b\n")
    (run / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (run / "run" / "summary.json").write_text(json.dumps({"status": "completed", "steps": 4}))
    trace = {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "device node0/dev0"}},
            {"ph": "X", "name": "generate", "pid": 1, "ts": 100_000_000, "dur": 2_000_000},
            {"ph": "X", "name": "train", "pid": 1, "ts": 102_000_000, "dur": 1_000_000},
        ]
    }
    (run / "run" / "trace.json").write_text(json.dumps(trace))
    (run / "mem.tsv").write_text("99.0\t1000\n101.0\t5000\n102.5\t9000\n110.0\t1000\n")
    plan = {
        "devices": [{"memory_profile": 0}],
        "memory_profiles": [
            {"peak_bytes": 8200, "stages": [{"stage": "train", "peak_bytes": 8200}]}
        ],
    }
    (run / "plan" / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rc").write_text("124\n")
    res = collect.collect(tmp_path, warmup=1)
    assert res["steps"] == {
        "b_turns_ipc": {"status": "ok", "seconds": 42, "switches": switches},
        "plain": {"status": "timeout"},
    }
    rec = res["runs"]["b_turns_ipc"]
    assert rec["status"] == "ok" and rec["steps_recorded"] == 4
    assert rec["switches"] == switches
    assert rec["memory"]["base_bytes"] == 1000
    assert rec["memory"]["peak_bytes"] == 8000
    assert rec["memory"]["by_stage_bytes"] == {"generate": 4000, "train": 8000}
    assert rec["memory"]["plan_over_measured_peak"] == pytest.approx(8200 / 8000)
    assert res["targets"]["plan_peak_within_5pct_b_turns_ipc"]["met"] is True
    # each figure carries the short-run switches its run used
    assert res["targets"]["plan_peak_within_5pct_b_turns_ipc"]["switches"] == switches
    assert res["plain"] is None
    lines = collect.brief(res).splitlines()
    assert lines[0].split() == ["b_turns_ipc", "ok", "in", "42", "s"]


VLLM_LOG = "\n".join(
    ["(RolloutWorker pid=7) INFO 11-27 22:11:07 [cumem.py:271] CuMemAllocator: sleep freed "
     "23.65 GiB memory in total, of which 2.00 GiB is backed up in CPU and the rest 21.65 GiB "
     "is discarded directly."]
    + [f"(RolloutWorker pid=7) INFO [abstract.py:327] It took {s} seconds to fall asleep."
       for s in ("1.000", "0.100", "0.300", "0.200")]
    + [f"(RolloutWorker pid=7) INFO [abstract.py:345] It took {s} seconds to wake up tags "
       f"['{tag}']." for s, tag in (("0.05", "weights"), ("0.02", "kv_cache"), ("0.1", "weights"),
                                   ("0.1", "weights"))]
)  # fmt: skip


def test_vllm_sleep_and_wake_are_read_from_its_own_log_lines():
    """The first sleep (it pins its host buffers) is left out; rates are over the bytes vLLM
    backs up: 2 GiB in the median 0.2 s asleep, 0.1 s awake."""
    sw = collect.vllm_sleep_wake(VLLM_LOG)
    assert sw["sleeps"] == 4 and sw["backed_up_bytes"] == 2 * 2**30
    assert sw["sleep_s"] == pytest.approx(0.2) and sw["wake_weights_s"] == pytest.approx(0.1)
    assert sw["wake_kv_cache_s"] == pytest.approx(0.02)
    assert sw["sleep_GBps"] == pytest.approx(2 * 2**30 / 0.2 / 1e9)
    assert sw["wake_GBps"] == pytest.approx(2 * 2**30 / 0.1 / 1e9)
    assert collect.vllm_sleep_wake("no vLLM here") == {}


def test_the_vllm_runs_switching_share_counts_vllms_sleep_and_wakes(tmp_path):
    step = tmp_path / "c_vllm"
    (step / "run").mkdir(parents=True)
    (step / "log.txt").write_text(VLLM_LOG)
    (step / "run" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS))
    rec = collect.run_record(step, warmup=1)
    # step 5.2 s with sync 0.2 s; vLLM: sleep 0.2 + wake 0.1 + 0.02
    assert rec["switch_share_with_vllm"] == pytest.approx((0.2 + 0.32) / 5.2)
    t = collect.targets({"runs": {"c_vllm": rec}})
    assert t["vllm_sleep_and_wake_GBps_in_run"]["value"] == pytest.approx(2 * 2**30 / 0.2 / 1e9)
    assert t["vllm_sleep_and_wake_GBps_in_run"]["met"] is False  # 10.7 GB/s
    assert t["switch_share_c_vllm_with_sleep_wake"]["met"] is True
