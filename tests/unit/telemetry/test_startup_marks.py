"""Start-up marks (rltrain.telemetry.startup) and the bench's phase breakdown, by hand."""

from __future__ import annotations

import math

from rltrain.bench.measures.startup import PHASES, TAIL, breakdown, phase_ends
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
