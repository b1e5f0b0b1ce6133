"""The sweep report: one row per job, as CSV, a Markdown table and a throughput bar chart.

Rows come from the launcher (overrides, status, the job's start and end, device slice) and from
each job's ``summary.json`` (:mod:`rltrain.telemetry.summary`); a field a job did not write is
blank. ``wall_s`` is the summary's, the seconds its rates are over; ``job_s`` is the launcher's
end minus start, the workers' start-up included.

With ``logging.trace=true`` (the default) a job's summary also carries ``"utilization"``, the
per-device headline of its timeline (:func:`rltrain.telemetry.timeline.headline`): the report
shows the devices' mean and lowest busy fraction, the mean share of device time spent moving
memory (offload, reload, weight sync) and the longest idle gap of any device. A job without it
(tracing off, or it failed before the end) shows a dash there.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rltrain.placement.types import GIB

CSV_FILE = "sweep_report.csv"
MD_FILE = "sweep_report.md"
PNG_FILE = "sweep_throughput.png"

#: Row key -> the ``summary["utilization"]`` key it is read from.
UTILIZATION = {
    "busy_mean": "busy_fraction_mean",
    "busy_min": "busy_fraction_min",
    "moving_memory": "memory_fraction_mean",
    "longest_idle_s": "longest_idle_gap_s",
}

#: Throughput measures, in the order the chart prefers them.
THROUGHPUTS = ("tokens_per_s", "env_steps_per_s", "steps_per_s")

_SIMULATED_NOTE = (
    "Rows marked `sim` ran on simulated devices: torch computed on CPU, so they rank placements "
    "by how many processes share this machine's cores, not by accelerator behaviour, unless the "
    "modelled device time of the simulate.* keys (simulate.actor_latency_ms, "
    "simulate.rollout_latency_ms, simulate.env_step_latency_ms) stands in for the devices."
)


_UTILIZATION_NOTE = (
    "Utilization (from each job's timeline, `logging.trace=true`): *busy* is the share of the "
    "training window (after worker start-up) a device ran any stage, as the mean over the job's "
    "devices / the least busy one; *moving mem* the mean share spent offloading, reloading or "
    "syncing weights (counted in busy too); *longest idle s* the longest gap on any device. A "
    "dash: the job wrote no timeline."
)


def make_row(job: Mapping[str, Any], summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge what the launcher knows of a job with the job's own summary.

    Args:
        job: ``num``, ``overrides`` (list), ``status``, ``error``, ``start``, ``end`` (epoch
            seconds), ``slice`` (text), ``output_dir``, ``objective``, ``placement_mode``.
        summary: the job's summary (:func:`rltrain.telemetry.summary.read_job_summary`) or None.

    Returns:
        A flat row; ``seconds_per_stage`` and ``peak_memory_bytes_per_device`` stay mappings.
        ``wall_s`` is the summary's (the training loop's seconds, the rates' time base),
        ``job_s`` the launcher's ``end - start`` (the workers' start-up included).
    """
    s = dict(summary or {})
    util = s.get("utilization")
    util = util if isinstance(util, Mapping) else {}
    status = job["status"]
    if status == "completed" and s.get("status"):
        status = str(s["status"])
    return {
        "job": job["num"],
        "overrides": " ".join(job["overrides"]),
        "_overrides": tuple(job["overrides"]),  # for the Markdown table; not a CSV column
        "placement_mode": s.get("placement_mode") or job.get("placement_mode"),
        "devices": job.get("slice") or "",
        "steps": s.get("steps"),
        "steps_per_s": s.get("steps_per_s"),
        "tokens_per_s": s.get("tokens_per_s"),
        "env_steps_per_s": s.get("env_steps_per_s"),
        "seconds_per_stage": dict(s.get("seconds_per_stage") or {}),
        "peak_memory_bytes_per_device": dict(s.get("peak_memory_bytes_per_device") or {}),
        "final_reward": s.get("final_reward"),
        "final_accuracy": s.get("final_accuracy"),
        "objective": job.get("objective"),
        "simulated": s.get("simulated_devices"),
        **{key: _number_or_none(util.get(src)) for key, src in UTILIZATION.items()},
        "wall_s": _number_or_none(s.get("wall_s")),  # the time base of the rates above
        "job_s": job["end"] - job["start"] if job.get("start") and job.get("end") else None,
        "start": job.get("start"),
        "end": job.get("end"),
        "status": status,
        "error": job.get("error") or "",
        "output_dir": job.get("output_dir") or "",
    }


def _number_or_none(value: Any) -> float | None:
    """A finite number from a summary, else None (a hand-edited or truncated file)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    # A short run's shares are small: keep one decimal there so 0.4 % does not read as nothing.
    return f"{100 * value:.0f}%" if value >= 0.1 else f"{100 * value:.1f}%"


def _utilization_cells(row: Mapping[str, Any]) -> list[str]:
    """The table's utilization cells: ``busy mean/min``, ``moving mem``, ``longest idle s``."""
    mean, low = row["busy_mean"], row["busy_min"]
    busy = "-" if mean is None else f"{_pct(mean)}/{_pct(low)}"
    idle = row["longest_idle_s"]
    return [busy, _pct(row["moving_memory"]), "-" if idle is None else _num(idle)]


def _num(value: Any, digits: int = 3) -> str:
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        # Three significant digits, but never an exponent for large throughputs.
        return f"{value:.0f}" if abs(value) >= 10**digits else f"{value:.{digits}g}"
    return str(value)


def _stages(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row["seconds_per_stage"]))
    return list(seen)


def _bytes(n: float) -> str:
    return f"{n / GIB:.2f}G" if n >= GIB / 10 else f"{n / 2**20:.0f}M"


def _memory_text(per_device: Mapping[str, Any]) -> str:
    return " ".join(f"{dev}={_bytes(per_device[dev])}" for dev in sorted(per_device))


def _devices(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: set[str] = set()
    for row in rows:
        seen.update(row["peak_memory_bytes_per_device"])
    return sorted(seen)


def to_csv(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """Write the rows as CSV: a column per stage (``s_<stage>``: seconds per step) and per device
    (``peak_bytes_<node>:<device>``)."""
    stages, devices = _stages(rows), _devices(rows)
    mappings = ("seconds_per_stage", "peak_memory_bytes_per_device")
    fixed = [k for k in rows[0] if k not in mappings and not k.startswith("_")]
    header = [*fixed, *(f"s_{st}" for st in stages), *(f"peak_bytes_{d}" for d in devices)]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in rows:
            cells = ["" if row[k] is None else row[k] for k in fixed]
            cells += [
                "" if st not in row["seconds_per_stage"] else row["seconds_per_stage"][st]
                for st in stages
            ]
            memory = row["peak_memory_bytes_per_device"]
            cells += [memory.get(d, "") for d in devices]
            writer.writerow(cells)


def to_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table (stages and memory folded into one cell each).

    Overrides every job shares are listed once above the table; each row shows only its own.
    """
    common = set.intersection(*(set(r["_overrides"]) for r in rows)) if len(rows) > 1 else set()
    header = [
        "job", "overrides", "placement", "devices", "steps/s", "tokens/s", "env steps/s",
        "s per stage", "peak memory", "busy mean/min", "moving mem", "longest idle s",
        "final reward", "final acc", "sim", "wall s", "job s", "status",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    if common:
        shared = " ".join(o for o in rows[0]["_overrides"] if o in common)
        lines = [f"All jobs: `{shared}`", "", *lines]
    for r in rows:
        own = " ".join(o for o in r["_overrides"] if o not in common)
        stages = " ".join(f"{k}={_num(v)}" for k, v in r["seconds_per_stage"].items())
        status = r["status"] + (f": {r['error']}" if r["error"] else "")
        cells = [
            str(r["job"]), f"`{own}`" if own else "",
            r["placement_mode"] or "", r["devices"], _num(r["steps_per_s"]),
            _num(r["tokens_per_s"]), _num(r["env_steps_per_s"]), stages,
            _memory_text(r["peak_memory_bytes_per_device"]), *_utilization_cells(r),
            _num(r["final_reward"]),
            _num(r["final_accuracy"]), {True: "sim", False: "", None: ""}[r["simulated"]],
            _num(r["wall_s"]), _num(r["job_s"]), status,
        ]  # fmt: skip
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if any(r["busy_mean"] is not None for r in rows):
        lines += ["", _UTILIZATION_NOTE]
    if any(r["simulated"] for r in rows):
        lines += ["", _SIMULATED_NOTE]
    return "\n".join(lines) + "\n"


def throughput_measure(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The first of :data:`THROUGHPUTS` any row has, or None."""
    for key in THROUGHPUTS:
        if any(isinstance(r[key], int | float) for r in rows):
            return key
    return None


def to_png(rows: Sequence[Mapping[str, Any]], path: str) -> bool:
    """Draw one bar per job of its throughput. Returns False when no job measured any."""
    key = throughput_measure(rows)
    if key is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    labels = [f"#{r['job']} {r['placement_mode'] or ''}".strip() for r in rows]
    values = [r[key] if isinstance(r[key], int | float) else 0.0 for r in rows]
    colors = ["tab:gray" if r["simulated"] else "tab:blue" for r in rows]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(rows) + 2), 3.5))
    ax.bar(range(len(rows)), values, color=colors)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(key.replace("_per_s", "/s").replace("_", " "))
    title = "throughput per job"
    if any(r["simulated"] for r in rows):
        title += " (grey: simulated devices)"
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_report(rows: Sequence[Mapping[str, Any]], sweep_dir: str) -> dict[str, str]:
    """Write the CSV, the Markdown table and (when any job measured throughput) the chart; a
    chart already there (an earlier sweep's in this directory) is removed when no job measured
    any, so every file beside the report is this sweep's.

    Args:
        rows: from :func:`make_row`, one per job, in job order.
        sweep_dir: the sweep's output directory.

    Returns:
        ``{"csv": path, "md": path[, "png": path], "table": markdown}``.
    """
    os.makedirs(sweep_dir, exist_ok=True)
    out = {"csv": os.path.join(sweep_dir, CSV_FILE), "md": os.path.join(sweep_dir, MD_FILE)}
    to_csv(rows, out["csv"])
    table = to_markdown(rows)
    with open(out["md"], "w", encoding="utf-8") as f:
        f.write("# Sweep report\n\n" + table)
    png = os.path.join(sweep_dir, PNG_FILE)
    if to_png(rows, png):
        out["png"] = png
    elif os.path.lexists(png):
        os.remove(png)
    out["table"] = table
    return out
