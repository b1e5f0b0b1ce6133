"""Where the time went: per-device utilization from a run's timeline trace.

The runtime records spans (:mod:`rltrain.telemetry.trace`); this module reads them — as
:class:`~rltrain.telemetry.trace.Span` objects or as the Chrome-trace file a run wrote — and
answers, for every device of the plan (and every process lane): what fraction of the run it was
busy, how long and how often it sat idle, and how much of its time went to moving memory
(offload, reload, weight sync) rather than computing.

Contract with the trainer (see ``docs/timeline.md``):

- spans are named by stage, one of :data:`STAGES` (aliases in :data:`ALIASES` are accepted);
  the component is the worker group (``actor``, ``rollout``...) or ``driver``;
- at the end of a run the trainer calls :func:`write_run_timeline` with the drained spans and
  the plan's devices (:func:`plan_devices`): it writes ``<run dir>/trace.json`` (a lane for every
  plan device, even one that never worked) and ``<run dir>/utilization.json``, and returns the
  summary; :func:`format_table` prints it, :func:`headline` gives the few numbers a sweep report
  shows per job.

Busy means covered by any span that is not a wait: a device moving memory is not free for
compute, so memory movement counts as busy and is also reported on its own. Waits (spans named
``wait`` or ``wait_*``) are reported separately and count as idle. The window is the whole trace
(first start to last end over every lane), so a device that starts late or finishes early shows
that as idle time.

No Ray, no torch: the sweep launcher and the timeline renderer (:mod:`rltrain.telemetry.draw`,
``python -m rltrain trace``) import it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rltrain.errors import ConfigError
from rltrain.telemetry.trace import DROPPED, Span, device_label, to_chrome_trace


class _UsesDevices(Protocol):
    """What :func:`plan_devices` reads of a plan (``rltrain.placement.plan.Plan``, a layer
    above this one)."""

    def devices_used(self) -> Any: ...


#: The trace file in a run directory (Chrome trace / Perfetto JSON).
TRACE_FILE = "trace.json"
#: The utilization summary in a run directory (the dict :func:`summarize` returns).
UTILIZATION_FILE = "utilization.json"
#: The picture ``python -m rltrain trace <run dir>`` writes by default.
TRACE_PNG = "trace.png"

#: Stage (span) names and their kind: ``compute``, ``memory`` (moving bytes) or ``wait``.
STAGES: Mapping[str, str] = {
    "generate": "compute",
    "env_step": "compute",
    "reward": "compute",
    "logprob": "compute",
    "train": "compute",
    "offload": "memory",
    "reload": "memory",
    "weight_sync": "memory",
    "wait": "wait",
}
#: Other spellings accepted for a stage.
ALIASES: Mapping[str, str] = {
    "logprobs": "logprob",
    "log_probs": "logprob",
    "sync": "weight_sync",
    "env": "env_step",
    "train_step": "train",
}
#: Idle gaps shorter than this are not counted as gaps (their time still counts as idle).
MIN_GAP_S = 1e-3


def canonical_stage(name: str) -> str:
    """The stage a span name stands for (``sync`` -> ``weight_sync``; unknown names unchanged)."""
    if name.startswith("wait"):
        return "wait"
    return ALIASES.get(name, name)


def stage_kind(name: str) -> str:
    """``compute``, ``memory`` or ``wait`` for a span name (unknown names are compute)."""
    return STAGES.get(canonical_stage(name), "compute")


@dataclass(frozen=True)
class Interval:
    """One span on one lane.

    Attributes:
        lane: the lane name (``node0/dev1`` for a device, ``actor[0]`` for a process).
        lane_kind: ``device`` or ``process``.
        name: the span (stage) name as recorded.
        component: the component that recorded it.
        start_us: start, microseconds (epoch for spans; whatever the trace uses otherwise).
        end_us: end, microseconds.
    """

    lane: str
    lane_kind: str
    name: str
    component: str
    start_us: float
    end_us: float


# ------------------------------------------------------------------------------------- reading
def _lane_names(events: Sequence[Mapping[str, Any]]) -> dict[Any, tuple[str, str]]:
    """pid -> (lane kind, lane name) from the ``process_name`` metadata of a Chrome trace."""
    out: dict[Any, tuple[str, str]] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            label = str(e.get("args", {}).get("name", e.get("pid")))
            kind, _, name = label.partition(" ")
            out[e.get("pid")] = (
                (kind, name) if kind in ("device", "process") else ("process", label)
            )
    return out


def intervals(trace: Any) -> list[Interval]:
    """Every span of a trace as one interval per lane it occupies.

    Args:
        trace: spans (:class:`Span`), a Chrome-trace document (``{"traceEvents": [...]}``) or
            its list of events. Only complete events (``"ph": "X"``) are read.

    Returns:
        The intervals, in input order (a span on two devices gives three: two devices, one
        process).

    Raises:
        ConfigError: when an event lacks a number for ``ts`` or ``dur``.
    """
    if isinstance(trace, Mapping):
        trace = trace.get("traceEvents", [])
    items = list(trace)
    if all(isinstance(s, Span) for s in items):
        out = []
        for s in items:
            end = s.start_us + s.dur_us
            for d in s.devices:
                out.append(Interval(d, "device", s.name, s.component, s.start_us, end))
            out.append(Interval(s.process, "process", s.name, s.component, s.start_us, end))
        return out
    lanes = _lane_names(items)
    out = []
    for e in items:
        if e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(ts, int | float) or not isinstance(dur, int | float):
            raise ConfigError(
                f"trace event {e.get('name')!r} has ts={ts!r} dur={dur!r}: both must be numbers "
                f"(microseconds); was the file written by rltrain.telemetry.trace?"
            )
        kind, lane = lanes.get(e.get("pid"), ("process", str(e.get("pid"))))
        out.append(
            Interval(lane, kind, str(e.get("name", "")), str(e.get("cat", "")), ts, ts + dur)
        )
    return out


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Chrome trace: a ``trace.json`` file, or a run directory holding one.

    Args:
        path: the file or the run directory.

    Returns:
        The document (``{"traceEvents": [...], ...}``).

    Raises:
        ConfigError: when there is no trace there or it is not a Chrome-trace JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / TRACE_FILE
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"no timeline trace at {p}: a run writes {TRACE_FILE} in its run directory when "
            f"logging.trace=true; pass that directory or the file itself"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{p} is not valid JSON ({exc}); is it a Chrome trace?") from None
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ConfigError(f"{p} has no 'traceEvents' list: it is not a Chrome trace")
    return doc


def trace_devices(doc: Mapping[str, Any]) -> list[str]:
    """The plan devices a trace was written for (``otherData.devices``), else its device lanes."""
    listed = doc.get("otherData", {}).get("devices")
    if isinstance(listed, list):
        return [str(d) for d in listed]
    lanes = _lane_names(doc.get("traceEvents", []))
    return sorted({name for kind, name in lanes.values() if kind == "device"}, key=lane_sort_key)


def lane_sort_key(name: str) -> tuple:
    """Natural order for lane names: ``node0/dev2`` before ``node0/dev10``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def plan_devices(plan: _UsesDevices) -> list[str]:
    """Device lane names of every device some process of the plan uses, in natural order."""
    return [device_label(n, d) for n, d in sorted(plan.devices_used())]


# --------------------------------------------------------------------------------- arithmetic
def merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals as sorted, disjoint ``(start, end)`` pairs (touching ones join)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def covered(merged: Iterable[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in merged)


def gaps(merged: Sequence[tuple[float, float]], lo: float, hi: float) -> list[float]:
    """Lengths of the uncovered stretches of ``[lo, hi]`` (leading and trailing included)."""
    out, cursor = [], lo
    for s, e in merged:
        if s > cursor:
            out.append(min(s, hi) - cursor)
        cursor = max(cursor, e)
    if hi > cursor:
        out.append(hi - cursor)
    return [g for g in out if g > 0]


# ---------------------------------------------------------------------------------- summary
def _lane_summary(ivs: list[Interval], lo: float, hi: float, min_gap_us: float) -> dict[str, Any]:
    window = hi - lo
    work = [i for i in ivs if stage_kind(i.name) != "wait"]
    busy = merge((i.start_us, i.end_us) for i in work)
    memory = merge((i.start_us, i.end_us) for i in work if stage_kind(i.name) == "memory")
    waits = merge((i.start_us, i.end_us) for i in ivs if stage_kind(i.name) == "wait")
    idle = [g for g in gaps(busy, lo, hi) if g >= min_gap_us]
    busy_us = covered(busy)

    def union_by(key) -> dict[str, float]:
        keys = sorted({key(i) for i in work})
        return {
            k: covered(merge((i.start_us, i.end_us) for i in work if key(i) == k)) / 1e6
            for k in keys
        }

    return {
        "busy_s": busy_us / 1e6,
        "busy_fraction": busy_us / window if window > 0 else 0.0,
        "idle_s": (window - busy_us) / 1e6,
        "idle_gaps": len(idle),
        "longest_idle_gap_s": max(idle, default=0.0) / 1e6,
        "mean_idle_gap_s": (sum(idle) / len(idle) / 1e6) if idle else 0.0,
        "memory_s": covered(memory) / 1e6,
        "memory_fraction": covered(memory) / window if window > 0 else 0.0,
        "wait_s": covered(waits) / 1e6,
        "by_component_s": union_by(lambda i: i.component),
        "by_stage_s": union_by(lambda i: canonical_stage(i.name)),
    }


def summarize(
    trace_events: Any,
    devices: Sequence[str] | None = None,
    *,
    window_us: tuple[float, float] | None = None,
    min_gap_s: float = MIN_GAP_S,
) -> dict[str, Any]:
    """Per-device (and per-process) utilization of a run.

    Args:
        trace_events: spans, a Chrome-trace document or its events (see :func:`intervals`).
        devices: the plan's device lanes (:func:`plan_devices`); each gets a row even if it
            never worked. Devices seen in the trace but not listed are added after them.
        window_us: ``(start, end)`` in the trace's microseconds; default: first start to last
            end over every lane.
        min_gap_s: idle stretches shorter than this are not counted as gaps.

    Returns:
        ``{"window_s", "start_us", "devices": {lane: row}, "processes": {lane: row},
        "stages_s": {stage: seconds on the busiest lane that ran it}}`` where a row holds
        ``busy_s``, ``busy_fraction``, ``idle_s``, ``idle_gaps``, ``longest_idle_gap_s``,
        ``mean_idle_gap_s``, ``memory_s``, ``memory_fraction``, ``wait_s``,
        ``by_component_s`` and ``by_stage_s``. Plain JSON types only.

    Raises:
        ConfigError: for a window whose end precedes its start, or an unreadable event.
    """
    ivs = intervals(trace_events)
    if window_us is None:
        lo = min((i.start_us for i in ivs), default=0.0)
        hi = max((i.end_us for i in ivs), default=0.0)
    else:
        lo, hi = window_us
        if hi < lo:
            raise ConfigError(f"timeline window_us={window_us}: the end precedes the start")
        ivs = [_clip(i, lo, hi) for i in ivs if i.end_us > lo and i.start_us < hi]
    by_lane: dict[tuple[str, str], list[Interval]] = {}
    for i in ivs:
        by_lane.setdefault((i.lane_kind, i.lane), []).append(i)
    listed = list(devices or [])
    seen = sorted({name for kind, name in by_lane if kind == "device"}, key=lane_sort_key)
    device_rows = {
        d: _lane_summary(by_lane.get(("device", d), []), lo, hi, min_gap_s * 1e6)
        for d in listed + [d for d in seen if d not in listed]
    }
    process_rows = {
        p: _lane_summary(by_lane[("process", p)], lo, hi, min_gap_s * 1e6)
        for p in sorted({n for k, n in by_lane if k == "process"}, key=lane_sort_key)
    }
    stages: dict[str, float] = {}
    for row in (*device_rows.values(), *process_rows.values()):
        for stage, s in row["by_stage_s"].items():
            stages[stage] = max(stages.get(stage, 0.0), s)
    return {
        "window_s": (hi - lo) / 1e6,
        "start_us": lo,
        "devices": device_rows,
        "processes": process_rows,
        "stages_s": dict(sorted(stages.items())),
    }


def _clip(i: Interval, lo: float, hi: float) -> Interval:
    return Interval(
        i.lane, i.lane_kind, i.name, i.component, max(i.start_us, lo), min(i.end_us, hi)
    )


def headline(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The few numbers a sweep report shows per job.

    Returns:
        ``busy_fraction_mean`` / ``busy_fraction_min`` over the devices, ``memory_fraction_mean``
        (share of device time spent moving memory) and ``longest_idle_gap_s`` (worst device);
        None when the summary has no devices.
    """
    rows = list(summary.get("devices", {}).values())
    if not rows:
        return dict.fromkeys(
            (
                "busy_fraction_mean",
                "busy_fraction_min",
                "memory_fraction_mean",
                "longest_idle_gap_s",
            )
        )
    return {
        "busy_fraction_mean": sum(r["busy_fraction"] for r in rows) / len(rows),
        "busy_fraction_min": min(r["busy_fraction"] for r in rows),
        "memory_fraction_mean": sum(r["memory_fraction"] for r in rows) / len(rows),
        "longest_idle_gap_s": max(r["longest_idle_gap_s"] for r in rows),
    }


# ----------------------------------------------------------------------------------- display
def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _secs(x: float) -> str:
    return f"{x:.3g} s" if x else "0 s"


def format_table(summary: Mapping[str, Any], processes: bool = False) -> str:
    """The summary as a fixed-width text table, one line per device (and process).

    Args:
        summary: what :func:`summarize` returned.
        processes: also list the process lanes.

    Returns:
        The table, ending without a newline.
    """
    rows = [("device", r, n) for n, r in summary.get("devices", {}).items()]
    if processes:
        rows += [("process", r, n) for n, r in summary.get("processes", {}).items()]
    head = ("lane", "busy", "moving mem", "waits", "idle gaps", "longest gap", "busiest")
    lines = [head]
    for _, r, name in rows:
        top = sorted(r["by_component_s"].items(), key=lambda kv: -kv[1])[:3]
        share = ", ".join(
            f"{c} {_pct(s / summary['window_s']).strip()}" for c, s in top if summary["window_s"]
        )
        lines.append(
            (
                name,
                _pct(r["busy_fraction"]),
                _pct(r["memory_fraction"]),
                _secs(r["wait_s"]),
                str(r["idle_gaps"]),
                _secs(r["longest_idle_gap_s"]),
                share or "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    title = f"timeline: {summary.get('window_s', 0.0):.3f} s window, {len(rows)} lanes"
    dropped = summary.get("dropped_spans") or {}
    warn = [
        f"warning: {process} recorded more spans than it keeps (trace.MAX_SPANS) and dropped "
        f"its {n} oldest: its lanes read idle where they were"
        for process, n in sorted(dropped.items())
    ]
    return "\n".join([title, *text, *warn])


# ------------------------------------------------------------------------------------- writing
def chrome_trace_with_devices(spans: Iterable[Span], devices: Sequence[str]) -> dict[str, Any]:
    """:func:`~rltrain.telemetry.trace.to_chrome_trace` plus an empty lane for every plan device
    that recorded nothing, devices in natural order before processes, and the plan's device list
    under ``otherData.devices``.

    Args:
        spans: the run's spans.
        devices: the plan's device lanes.

    Returns:
        The Chrome-trace document.
    """
    doc = to_chrome_trace(spans)
    events = doc["traceEvents"]
    lanes = _lane_names(events)
    have = {name for kind, name in lanes.values() if kind == "device"}
    next_pid = max((p for p in lanes if isinstance(p, int)), default=0) + 1
    for d in devices:
        if d not in have:
            lanes[next_pid] = ("device", d)
            events.append(
                {
                    "ph": "M",
                    "name": "process_name",
                    "pid": next_pid,
                    "args": {"name": f"device {d}"},
                }
            )
            events.append(
                {
                    "ph": "M",
                    "name": "process_sort_index",
                    "pid": next_pid,
                    "args": {"sort_index": 0},
                }
            )
            next_pid += 1
    order = sorted(lanes, key=lambda p: (lanes[p][0] != "device", lane_sort_key(lanes[p][1])))
    rank = {pid: i + 1 for i, pid in enumerate(order)}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_sort_index":
            e["args"] = {"sort_index": rank[e["pid"]]}
    doc["otherData"] = {"devices": list(devices)}
    return doc


def write_run_timeline(
    run_dir: str | os.PathLike[str], spans: Iterable[Span], devices: Sequence[str]
) -> dict[str, Any]:
    """End of a run: write ``trace.json`` and ``utilization.json`` into the run directory.

    Args:
        run_dir: the run's output directory.
        spans: every span drained from the workers and the driver.
        devices: the plan's device lanes (:func:`plan_devices`).

    Returns:
        The utilization summary (also written to ``utilization.json``). Its window starts
        where worker start-up ends (the last ``launch`` span), so a short run's figures
        describe its training, not the seconds of imports before it; the trace keeps both.
    """
    spans = list(spans)
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = chrome_trace_with_devices(spans, devices)
    _atomic_write(out / TRACE_FILE, json.dumps(doc))
    summary = summarize(spans, devices, window_us=training_window(spans))
    dropped = {s.process: s.dropped for s in spans if s.name == DROPPED and s.dropped}
    if dropped:  # those processes' earliest spans are missing: their lanes read idle there
        summary["dropped_spans"] = dropped
    _atomic_write(out / UTILIZATION_FILE, json.dumps(_finite(summary), indent=1))
    return summary


def training_window(trace: Any) -> tuple[float, float] | None:
    """The window ``utilization.json`` and ``summary.json`` measure: from the end of the last
    worker start-up (``launch`` span) to the trace's end; None when there is no start-up to
    leave out (the whole trace then).

    Args:
        trace: spans, a Chrome-trace document or its events (see :func:`intervals`).
    """
    ivs = intervals(trace)
    launched = [i.end_us for i in ivs if i.name == "launch"]
    end = max((i.end_us for i in ivs), default=0.0)
    return (max(launched), end) if launched and max(launched) < end else None


def read_utilization(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A run's ``utilization.json``, or None when it has none (or it is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / UTILIZATION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader never sees half a file


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    return value
