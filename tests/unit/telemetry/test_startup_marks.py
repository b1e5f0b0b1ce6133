"""Start-up marks (rltrain.telemetry.startup) and the bench's phase breakdown, by hand."""

from __future__ import annotations

import math

from rltrain.bench.measures.startup import (
    PHASES,
    TAIL,
    StartupRun,
    breakdown,
    phase_ends,
    process_kind,
    process_rows,
)
from rltrain.telemetry import startup


def test_marks_are_written_only_when_asked(tmp_path, monkeypatch):
    path = tmp_path / "marks.jsonl"
    monkeypatch.delenv(startup.MARKS_ENV, raising=False)
    startup.mark("imports")
    assert not path.exists()
    monkeypatch.setenv(startup.MARKS_ENV, str(path))
    startup.mark("ray_start")
    startup.mark("worker_init_begin", "actor[1]")
    marks = startup.read_marks(str(path))
    assert [(m["phase"], m["process"]) for m in marks] == [
        ("ray_start", "driver"),
        ("worker_init_begin", "actor[1]"),
    ]
    assert marks[0]["t"] <= marks[1]["t"] and marks[1]["cpu_s"] > 0
    assert marks[0]["created"] <= marks[0]["t"]  # this process existed before it marked


def _marks(t0: float) -> list[dict]:
    """One run's marks: every phase ends 1 s after the previous; driver CPU grows by 0.5 s."""
    out = []
    for i, (_, key, _) in enumerate(PHASES + TAIL[:-1]):
        process = "actor[0]" if key == "worker_init_begin" else "driver"
        out.append({"phase": key, "process": process, "t": t0 + i + 1, "cpu_s": 0.5 * (i + 1)})
    # a second worker began earlier: the phase ends with the last one
    out.insert(0, {"phase": "worker_init_begin", "process": "actor[1]", "t": t0 + 0.5, "cpu_s": 9})
    return out


def test_breakdown_is_the_median_of_each_phases_share():
    n = len(PHASES + TAIL)
    runs = []
    for t0, stretch in ((100.0, 1.0), (200.0, 3.0), (300.0, 2.0)):
        marks = _marks(t0)
        ends = phase_ends(marks, t0, t0 + n, lambda t, s=stretch, t0=t0: s * (t - t0))
        runs.append(ends)
    rows = {name: (wall, dcpu, acpu) for name, wall, dcpu, acpu in breakdown(runs)}
    first = PHASES[0][0]
    assert rows[first] == (1.0, 0.5, 2.0)  # all CPU: median of 1, 3, 2 per second
    # the workers' phase: the driver did not mark it, so its driver CPU is unknown
    wall, dcpu, _ = rows["worker processes start"]
    assert wall == 1.0 and math.isnan(dcpu)
    assert rows["command to first step"][0] == len(PHASES)
    assert rows["whole command"][0] == n and rows["whole command"][2] == 2.0 * n
    # ... and the next phase the driver marks holds the driver's CPU since its previous mark
    assert rows["worker imports + model build"][1] == 0.5 * 2


def test_process_kinds_from_the_command_lines_ray_shows():
    site = "/venv/lib/python3.11/site-packages/ray"
    assert process_kind([f"{site}/core/src/ray/gcs/gcs_server --log_dir=/tmp"]) == "Ray GCS"
    assert process_kind([f"{site}/core/src/ray/raylet/raylet --x=1"]) == "Ray raylet"
    assert process_kind([f"/venv/bin/python {site}/dashboard/dashboard.py --host=127.0.0.1"]) == (
        "Ray dashboard head"
    )
    assert process_kind([f"/venv/bin/python -u {site}/_private/log_monitor.py --a"]) == (
        "Ray log monitor"
    )
    assert process_kind([f"/venv/bin/python -u {site}/autoscaler/_private/monitor.py"]) == (
        "Ray autoscaler monitor"
    )
    agent = [f"/venv/bin/python -u {site}/dashboard/agent.py --n", "ray::DashboardAgent"]
    assert process_kind(agent) == "Ray dashboard agent"
    boot = f"/venv/bin/python {site}/_private/workers/default_worker.py --node-ip-address=1"
    # a worker is named by the first actor or task it ran, not by its idle title after it
    actor = [boot, "ray::IDLE", "ray::FusedWorker.__init__", "ray::FusedWorker.step"]
    assert process_kind(actor) == "Ray worker: FusedWorker"
    assert process_kind([boot, "ray::IDLE", "ray::_probe_device", "ray::IDLE"]) == (
        "Ray worker: _probe_device"
    )
    assert process_kind([boot, "ray::IDLE"]) == "Ray worker: idle"
    assert process_kind(["ldconfig -p"]) == "other"


def test_process_rows_are_medians_and_a_missing_kind_counts_zero():
    def run(processes):
        return StartupRun({}, {}, {}, processes)

    runs = [
        run({"driver": (1, 4.0), "Ray worker: _probe_device": (2, 1.6)}),
        run({"driver": (1, 5.0)}),
        run({"driver": (1, 6.0), "Ray worker: _probe_device": (2, 1.4)}),
    ]
    assert process_rows(runs) == [("driver", 1, 5.0), ("Ray worker: _probe_device", 2, 1.4)]
