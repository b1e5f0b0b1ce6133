"""Gather what tools/gpu/run.sh left in its results directory into one JSON, with the targets.

    python3 tools/gpu/collect.py RESULTS_DIR [--out results.json]

RESULTS_DIR holds one directory per step of run.sh (``unpack``, ``env``, ``plain``,
``vllm_engine``, ``gpu_vllm``, and one per rltrain run: ``a_fused``, ``b_turns_ipc``,
``c_vllm``, ``d_deepspeed``), each with its ``rc`` (exit status; 124 = timed out) or
``rc.skipped`` (why it did not run) or ``rc.rehearsed`` (a CPU rehearsal), ``seconds`` (wall)
and ``time.txt`` (wall, user and system seconds), ``switches.json`` (the short-run switches it
ran with) and ``log.txt``. A run's directory also holds ``run/`` (the rltrain run directory:
``metrics.jsonl``, ``summary.json``, ``trace.json``), ``plan/plan.json`` (``mode=plan`` of the
same overrides) and ``mem.tsv`` (tools/gpu/memwatch.py).

For every run: the median seconds of each stage over the steps after the warm-up ones, tokens/s,
the share of the step spent switching the GPU between training and generation (offload,
reload, sleep, wake, weight sync), and the GPU memory the driver saw during each stage's spans
against the plan's prediction for that stage. Then the issue's targets, each with its value,
goal, whether it was met (``null`` when a needed step did not run) and the switches its
figures ran with. Prints one line per step and per target. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: The rltrain runs of run.sh, in order, with what each exercises.
RUNS = {
    "a_fused": "fused torch workers (placement.fuse=true)",
    "b_turns_ipc": "separate actor and torch rollout taking turns, weights over ipc",
    "c_vllm": "vLLM rollout, sleep/wake after every stage, weights over ipc",
    "d_deepspeed": "DeepSpeed ZeRO-2 actor offloaded after every stage",
}
#: Stage names that move state rather than compute (rltrain's timeline kinds, plus vLLM's).
SWITCH_WORDS = ("offload", "reload", "sleep", "wake", "sync")


def step_status(step_dir: Path) -> str:
    """``ok``, ``timeout``, ``failed (rc N)``, ``skipped: WHY``, ``rehearsed`` or ``not run``."""
    rc_file = step_dir / "rc"
    if not rc_file.is_file():
        skipped = step_dir / "rc.skipped"
        if skipped.is_file():
            return f"skipped: {skipped.read_text().strip()}"
        return "rehearsed" if (step_dir / "rc.rehearsed").is_file() else "not run"
    rc = rc_file.read_text().strip()
    if rc == "0":
        return "ok"
    return "timeout" if rc in ("124", "137") else f"failed (rc {rc})"


def step_facts(step_dir: Path) -> dict[str, Any]:
    """A step's status, wall and CPU seconds, and the switches it ran with (where recorded)."""
    facts: dict[str, Any] = {"status": step_status(step_dir)}
    secs = step_dir / "seconds"
    if secs.is_file():
        facts["seconds"] = int(secs.read_text().strip() or 0)
    timing = step_dir / "time.txt"  # bash's `time`: wall, user, system seconds
    if timing.is_file():
        fields = timing.read_text().split()
        if len(fields) >= 3:
            facts["wall_seconds"] = float(fields[0])
            facts["cpu_seconds"] = round(float(fields[1]) + float(fields[2]), 1)
    switches = step_dir / "switches.json"
    if switches.is_file():
        facts["switches"] = json.loads(switches.read_text())
    return facts


def pytest_counts(xml_file: Path) -> dict[str, int]:
    """passed / failed / errors / skipped of a pytest JUnit XML report."""
    suite = ET.parse(xml_file).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    total, failed, errors, skipped = (
        int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")
    )
    return {
        "passed": total - failed - errors - skipped,
        "failed": failed,
        "errors": errors,
        "skipped": skipped,
    }


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def is_switch(stage: str) -> bool:
    """Whether a stage moves state between training and generation (not compute)."""
    return any(w in stage for w in SWITCH_WORDS)


def stage_medians(records: Sequence[Mapping[str, Any]], warmup: int) -> dict[str, Any]:
    """Median step breakdown over ``records[warmup:]`` (all records if that leaves none).

    Returns:
        ``stages_s`` (stage -> median seconds, from the ``time/<stage>_s`` keys), ``step_s``,
        ``tokens_per_s``, ``samples_per_step``, ``generate_tokens_per_s`` (response tokens per
        second of the generate stage), ``switch_s`` and ``switch_share`` (the switching stages'
        medians over the median step), ``steps_measured``, ``actor_allocator_peak_gib``
        (the largest ``actor/memory_{allocated,reserved}_peak_gib`` of any step, warm-up
        included: an update's first steps are where Adam's moments appear).
    """
    kept = list(records[warmup:]) or list(records)
    stages = sorted(
        {k[5:-2] for r in kept for k in r if k.startswith("time/") and k.endswith("_s")}
    )
    stages_s = {s: _median(r.get(f"time/{s}_s") for r in kept) for s in stages if s != "step"}
    step_s = _median(r.get("time/step_s") for r in kept)
    samples = _median(
        r["perf/samples_per_s"] * r["time/step_s"]
        for r in kept
        if r.get("perf/samples_per_s") and r.get("time/step_s")
    )
    gen_tps = _median(
        r["response/length_mean"] * samples / r["time/generate_s"]
        for r in kept
        if samples and r.get("response/length_mean") and r.get("time/generate_s")
    )
    switch_s = sum(v for s, v in stages_s.items() if is_switch(s) and v is not None)
    peaks = {k: f"actor/memory_{k}_peak_gib" for k in ("allocated", "reserved")}
    return {
        "steps_measured": len(kept),
        "stages_s": stages_s,
        "step_s": step_s,
        "tokens_per_s": _median(r.get("perf/tokens_per_s") for r in kept),
        "samples_per_step": round(samples) if samples else None,
        "response_length_mean": _median(r.get("response/length_mean") for r in kept),
        "generate_tokens_per_s": gen_tps,
        "switch_s": switch_s,
        "switch_share": switch_s / step_s if step_s else None,
        # the actor's allocator in its update: live tensors at most, and what it held
        "actor_allocator_peak_gib": {
            k: max((r[m] for r in records if m in r), default=None) for k, m in peaks.items()
        },
    }


def read_samples(path: Path) -> list[tuple[float, int]]:
    """``(unix seconds, used bytes)`` pairs of a memwatch file, in time order."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 2:
            out.append((float(parts[0]), int(parts[1])))
    return sorted(out)


def device_spans(trace: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """``(stage, start s, end s)`` of every span on a device lane of a Chrome trace."""
    lanes = {
        e["pid"]: e["args"]["name"]
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    return [
        (e["name"], e["ts"] / 1e6, (e["ts"] + e.get("dur", 0)) / 1e6)
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and str(lanes.get(e.get("pid"), "")).startswith("device")
    ]


#: Seconds at the start of a span whose samples still show the stage before: the driver's
#: memory counter trails a release (on the 2026-11-26 H200 lease a training span's first
#: sample still held the 38 GiB vLLM had just put to sleep; 0.1 s later it was gone).
SETTLE_S = 0.2


def memory_by_stage(
    spans: Sequence[tuple[str, float, float]],
    samples: Sequence[tuple[float, int]],
    base: int,
    settle_s: float = SETTLE_S,
) -> dict[str, int]:
    """The most memory in use (above ``base``) seen during each stage's spans, leaving out
    the first ``settle_s`` of a span (see :data:`SETTLE_S`) unless the span is too short to.

    Args:
        spans: ``(stage, start s, end s)``.
        samples: ``(s, used bytes)`` in time order.
        base: bytes in use before the run (other processes, the idle driver).
        settle_s: seconds at a span's start whose samples belong to the stage before.

    Returns:
        stage -> peak bytes above ``base``; stages without a sample inside a span are left out.
    """
    out: dict[str, int] = {}
    for stage, lo, hi in spans:
        start = lo + settle_s if hi - lo > 2 * settle_s else lo
        inside = [used for t, used in samples if start <= t <= hi]
        if inside:
            out[stage] = max(out.get(stage, 0), max(inside) - base)
    return out


def plan_memory(plan: Mapping[str, Any], device: int = 0) -> dict[str, Any]:
    """The plan's predicted bytes for one device: ``peak_bytes`` and ``stages`` (stage -> peak)."""
    profiles = plan.get("memory_profiles") or []
    devices = plan.get("devices") or []
    if not devices or not profiles:
        return {}
    profile = profiles[devices[device].get("memory_profile", 0)]
    return {
        "peak_bytes": profile.get("peak_bytes"),
        "capacity_bytes": profile.get("capacity_bytes"),
        "stages": {s["stage"]: s.get("peak_bytes") for s in profile.get("stages", [])},
    }


def _stage_alias(stage: str) -> str:
    return {"weight_sync": "sync"}.get(stage, stage)


_VLLM_ASLEEP = re.compile(r"It took ([0-9.]+) seconds to fall asleep")
_VLLM_AWAKE = re.compile(r"It took ([0-9.]+) seconds to wake up tags \['(\w+)'\]")
_VLLM_BACKED_UP = re.compile(r"of which ([0-9.]+) GiB is backed up in CPU")


def vllm_sleep_wake(log: str) -> dict[str, Any]:
    """vLLM's own sleep/wake timings in a run's log (level 1, woken by tag).

    Args:
        log: the run's output, vLLM's log lines in it.

    Returns:
        Empty when vLLM never slept; else ``backed_up_bytes`` (what one sleep copies to the
        host, the weights pool), the medians ``sleep_s`` (the first sleep, which pins its
        host buffers, left out when others follow), ``wake_weights_s``, ``wake_kv_cache_s``,
        ``sleeps``, and ``sleep_GBps`` / ``wake_GBps`` over the backed-up bytes.
    """
    asleep = [float(x) for x in _VLLM_ASLEEP.findall(log)]
    backed = [float(x) for x in _VLLM_BACKED_UP.findall(log)]
    if not asleep or not backed:
        return {}
    woke: dict[str, list[float]] = {}
    for secs, tag in _VLLM_AWAKE.findall(log):
        woke.setdefault(tag, []).append(float(secs))
    nbytes = int(max(backed) * 2**30)
    sleep_s = _median(asleep[1:] or asleep)
    wake_s = _median(woke.get("weights", []))
    return {
        "sleeps": len(asleep),
        "backed_up_bytes": nbytes,
        "sleep_s": sleep_s,
        "wake_weights_s": wake_s,
        "wake_kv_cache_s": _median(woke.get("kv_cache", [])),
        "sleep_GBps": nbytes / sleep_s / 1e9 if sleep_s else None,
        "wake_GBps": nbytes / wake_s / 1e9 if wake_s else None,
    }


def run_record(step_dir: Path, warmup: int) -> dict[str, Any]:
    """Everything about one rltrain run of run.sh."""
    rec: dict[str, Any] = step_facts(step_dir)
    cmd = step_dir / "cmd.txt"
    if cmd.is_file():
        rec["command"] = cmd.read_text().strip()
    run_dir = step_dir / "run"
    records = read_jsonl(run_dir / "metrics.jsonl")
    rec["steps_recorded"] = len(records)
    if records:
        rec.update(stage_medians(records, warmup))
    summary = run_dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        rec["summary"] = {
            k: s.get(k)
            for k in ("status", "steps", "fused", "fuse_blockers", "wall_s", "tokens_per_s")
            if k in s
        }
        rec["ledger_peak_bytes"] = s.get("peak_memory_bytes_per_device")
    log = step_dir / "log.txt"
    sw = vllm_sleep_wake(log.read_text(errors="replace")) if log.is_file() else {}
    if sw:
        rec["vllm_sleep_wake"] = sw
        # the switching the run's stages do not time: vLLM's sleep and its two wakes a step
        moved = sum(sw[k] or 0 for k in ("sleep_s", "wake_weights_s", "wake_kv_cache_s"))
        if rec.get("step_s"):
            rec["switch_share_with_vllm"] = ((rec.get("switch_s") or 0) + moved) / rec["step_s"]
    plan_file = step_dir / "plan" / "plan.json"
    predicted = plan_memory(json.loads(plan_file.read_text())) if plan_file.is_file() else {}
    rec["plan"] = predicted
    samples = read_samples(step_dir / "mem.tsv")
    trace_file = run_dir / "trace.json"
    if samples:
        base = samples[0][1]  # read before the run started any process on the GPU
        peak = max(u for _, u in samples) - base
        rec["memory"] = {"base_bytes": base, "peak_bytes": peak}
        if trace_file.is_file():
            spans = device_spans(json.loads(trace_file.read_text()))
            rec["memory"]["by_stage_bytes"] = memory_by_stage(spans, samples, base)
        if predicted.get("peak_bytes"):
            rec["memory"]["plan_over_measured_peak"] = (
                predicted["peak_bytes"] / peak if peak else None
            )
    return rec


def _target(
    value: float | None, goal: str, ok: bool | None, *sources: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One target; ``sources`` are the records its figures come from (their switches kept)."""
    out = {"value": value, "goal": goal, "met": ok if value is not None else None}
    switches = [s["switches"] for s in sources if s and s.get("switches")]
    if switches:
        out["switches"] = switches[0] if len(switches) == 1 else switches
    return out


def targets(res: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets from the collected results (None where a step is missing)."""
    runs, plain, engine = res.get("runs", {}), res.get("plain") or {}, res.get("vllm_engine") or {}
    out: dict[str, Any] = {}
    c = runs.get("c_vllm", {})
    e_tps = engine.get("tokens_per_s")
    c_tps = c.get("generate_tokens_per_s")
    ratio = c_tps / e_tps if c_tps and e_tps else None
    out["vllm_rollout_vs_engine_tokens_per_s"] = _target(
        ratio, ">= 0.9", ratio and ratio >= 0.9, c, engine
    )
    sw = (engine.get("sleep_wake_summary") or {}).get("level1_tags") or {}
    gbps = min(sw.get("weights_GBps_sleep") or 0, sw.get("weights_GBps_wake") or 0) or None
    out["vllm_sleep_and_wake_GBps"] = _target(
        gbps, ">= 30 (slower of the two)", gbps and gbps >= 30, engine
    )
    in_run = c.get("vllm_sleep_wake") or {}
    gbps = min(in_run.get("sleep_GBps") or 0, in_run.get("wake_GBps") or 0) or None
    out["vllm_sleep_and_wake_GBps_in_run"] = _target(
        gbps, ">= 30 (slower of the two, over the bytes vLLM backs up)", gbps and gbps >= 30, c
    )
    share = c.get("switch_share_with_vllm")
    out["switch_share_c_vllm_with_sleep_wake"] = _target(
        share, "<= 0.15", share is not None and share <= 0.15, c
    )
    for name in ("b_turns_ipc", "c_vllm"):
        run = runs.get(name, {})
        sync = (run.get("stages_s") or {}).get("sync")
        out[f"ipc_sync_s_{name}"] = _target(sync, "< 0.1", sync is not None and sync < 0.1, run)
    for name in ("b_turns_ipc", "c_vllm", "d_deepspeed"):
        run = runs.get(name, {})
        share = run.get("switch_share")
        out[f"switch_share_{name}"] = _target(
            share, "<= 0.15", share is not None and share <= 0.15, run
        )
    a = runs.get("a_fused", {})
    p = plain.get("summary") or {}
    by_tokens = p["tokens_per_s"] / a["tokens_per_s"] if a.get("tokens_per_s") and p else None
    out["fused_step_vs_plain_per_token"] = _target(
        by_tokens, "<= 1.1", by_tokens and by_tokens <= 1.1, a, plain
    )
    raw = a["step_s"] / p["step_s"] if a.get("step_s") and p.get("step_s") else None
    out["fused_step_vs_plain_raw"] = _target(
        raw, "<= 1.1 (responses end at EOS: see per_token)", None, a, plain
    )
    for name, rec in runs.items():
        ratio = (rec.get("memory") or {}).get("plan_over_measured_peak")
        ok = ratio is not None and abs(ratio - 1) <= 0.05
        out[f"plan_peak_within_5pct_{name}"] = _target(ratio, "0.95..1.05", ok, rec)
    return out


def collect(results: Path, warmup: int = 2) -> dict[str, Any]:
    """Read every step's output under ``results``."""
    res: dict[str, Any] = {"steps": {}}
    for d in sorted(p for p in results.iterdir() if p.is_dir()):
        res["steps"][d.name] = step_facts(d)
    env = results / "env"
    if (env / "machine.json").is_file():
        res["machine"] = json.loads((env / "machine.json").read_text())
    for deps in sorted(env.glob("deps_*.json")):
        res.setdefault("deps", {})[deps.stem[5:]] = json.loads(deps.read_text())
    for name in ("plain", "vllm_engine"):
        f = results / name / f"{name}.json"
        res[name] = json.loads(f.read_text()) if f.is_file() else None
        if res[name]:
            res[name].pop("steps", None)  # per-step rows stay in the step's own JSON
            res[name]["switches"] = res["steps"][name].get("switches")
    res["pytest"] = {x.stem[7:]: pytest_counts(x) for x in sorted(results.glob("pytest_*.xml"))}
    res["runs"] = {
        name: {"what": what, **run_record(results / name, warmup)}
        for name, what in RUNS.items()
        if (results / name).is_dir()
    }
    res["targets"] = targets(res)
    return res


def brief(res: Mapping[str, Any]) -> str:
    """One line per step and per target: what a device call's output tail ends with."""
    lines = []
    for step, facts in res["steps"].items():
        secs = f" in {facts['seconds']} s" if "seconds" in facts else ""
        lines.append(f"{step:14s} {facts['status'][:110]}{secs}")
    for name, counts in res["pytest"].items():
        lines.append(f"pytest {name}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for name, t in res["targets"].items():
        v = t["value"]
        shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        lines.append(f"target {name}: {shown} (goal {t['goal']}) met={t['met']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, help="write the JSON here (default: print only)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of medians")
    args = ap.parse_args(argv)
    res = collect(args.results, args.warmup)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(brief(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
