"""Reading a finished run's timed steps from hand-written metrics.jsonl and trace.json."""

from __future__ import annotations

import json

import pytest

from rltrain.autoplace.readings import RunReading, read_run, timed
from rltrain.errors import ConfigError


def _write_run(path, step_times, starts_s, moves=()):
    with open(path / "metrics.jsonl", "w") as f:
        for i, (g, t) in enumerate(step_times):
            f.write(
                json.dumps(
                    {"step": i, "time/generate_s": g, "time/train_s": t, "time/step_s": g + t}
                )
                + "\n"
            )
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "process driver"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "process rollout[0]"}},
    ]
    for s in starts_s:
        events.append(
            {"ph": "X", "name": "generate", "cat": "driver", "pid": 1, "ts": s * 1e6, "dur": 1e5}
        )
    for comp, kind, a, b in moves:
        events.append(
            {"ph": "X", "name": kind, "cat": comp, "pid": 2, "ts": a * 1e6, "dur": (b - a) * 1e6}
        )
    (path / "trace.json").write_text(json.dumps({"traceEvents": events}))


def test_timed_steps_skip_warmup_and_the_last():
    assert timed([1, 2, 3, 4, 5], 1) == [2, 3, 4]
    assert timed([1, 2], 1) == [2]  # nothing else would remain


def test_read_run_means_period_and_moves(tmp_path):
    # 5 steps: step 0 is warm-up, step 4 is followed by evaluation: steps 1-3 are timed.
    steps = [(3.0, 1.0), (1.0, 0.5), (1.2, 0.5), (1.1, 0.6), (9.0, 9.0)]
    starts = [0.0, 4.0, 5.6, 7.4, 9.3]  # gaps of the timed steps: 1.6, 1.8, 1.9
    moves = [
        ("rollout", "reload", 4.0, 4.3),  # inside the window [4.0, 9.3]: 0.3 s
        ("actor", "offload", 9.2, 9.6),  # 0.1 s of it inside
        ("actor", "offload", 1.0, 2.0),  # warm-up: outside
    ]
    _write_run(tmp_path, steps, starts, moves)
    r = read_run(str(tmp_path), warmup=1)
    assert r.steps == 3
    assert r.stages["generate"] == pytest.approx((1.0 + 1.2 + 1.1) / 3)
    assert r.stages["train"] == pytest.approx((0.5 + 0.5 + 0.6) / 3)
    assert r.step_s == pytest.approx((1.5 + 1.7 + 1.7) / 3)
    assert r.period_s == pytest.approx(1.8)  # median of 1.6, 1.8, 1.9
    assert r.moves["rollout/reload"] == pytest.approx(0.3 / 3)
    assert r.moves["actor/offload"] == pytest.approx(0.1 / 3)
    assert r.move_s() == pytest.approx(0.4 / 3)
    assert r.seconds_per_step == pytest.approx(1.8)
    assert RunReading.from_dict(r.to_dict()) == r


def test_without_a_trace_the_timers_are_the_step(tmp_path):
    _write_run(tmp_path, [(1.0, 1.0), (0.5, 0.25), (0.5, 0.25)], [])
    (tmp_path / "trace.json").unlink()
    r = read_run(str(tmp_path))
    assert r.period_s is None and r.seconds_per_step == pytest.approx(0.75)


def test_a_run_without_timed_steps_is_refused(tmp_path):
    _write_run(tmp_path, [(1.0, 1.0)], [0.0])
    with pytest.raises(ConfigError, match="placement.auto.profile_steps"):
        read_run(str(tmp_path), warmup=1)
    with pytest.raises(ConfigError, match="logging.jsonl"):
        read_run(str(tmp_path / "missing"))


def test_the_pi_old_pass_is_read_from_the_actors_metric(tmp_path):
    _write_run(tmp_path, [(1.0, 1.0), (0.5, 0.25), (0.5, 0.25)], [])
    assert read_run(str(tmp_path)).old_logprobs_s == 0.0  # no pass made
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for r, seconds in zip(rows, (0.5, 0.1, 0.3), strict=True):
        r["actor/old_logprobs_s"] = seconds
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reading = read_run(str(tmp_path))  # step 1 is timed (step 0 warm-up, step 2 the last)
    assert reading.old_logprobs_s == pytest.approx(0.1)
    assert RunReading.from_dict(reading.to_dict()) == reading
