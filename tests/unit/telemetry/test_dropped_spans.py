"""A process whose span buffer overflowed says so: the drain adds a marker with the count of
spans dropped, and the run's utilization summary and table report it."""

from __future__ import annotations

import json

from rltrain.telemetry import timeline, trace


def test_an_overflowing_buffer_reports_what_it_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "_buffer", trace.deque(maxlen=3))
    trace.configure(process="env[0]")
    try:
        for _ in range(5):
            with trace.span("env_step", "env", ("node0/dev0",)):
                pass
        spans = trace.drain()
        assert [s.name for s in spans] == ["env_step"] * 3 + [trace.DROPPED]
        assert spans[-1].dropped == 2 and spans[-1].process == "env[0]"
        with trace.span("env_step", "env"):
            pass
        assert [s.dropped for s in trace.drain()] == [0]  # the count starts again after a drain
    finally:
        trace.configure(process="driver")
    summary = timeline.write_run_timeline(tmp_path, spans, ["node0/dev0"])
    assert summary["dropped_spans"] == {"env[0]": 2}
    assert json.loads((tmp_path / "utilization.json").read_text())["dropped_spans"] == {"env[0]": 2}
    assert "warning: env[0] recorded more spans than it keeps" in timeline.format_table(summary)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert [e["args"]["dropped"] for e in events if e.get("name") == trace.DROPPED] == [2]


def test_a_run_within_the_buffer_reports_no_drops(tmp_path):
    with trace.span("train", "actor", ("node0/dev0",)):
        pass
    summary = timeline.write_run_timeline(tmp_path, trace.drain(), ["node0/dev0"])
    assert "dropped_spans" not in summary and "warning" not in timeline.format_table(summary)
