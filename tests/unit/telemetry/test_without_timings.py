"""Comparing two runs' records leaves out every wall-clock figure, whatever its section."""

from __future__ import annotations

from rltrain.telemetry.metrics import without_timings


def test_every_seconds_valued_key_is_dropped():
    # keys a PPO step logs: time/ and perf/ sections, and the actor's own timing of its
    # old-log-prob pass (seconds under actor/)
    record = {
        "step": 3,
        "reward/mean": 0.5,
        "actor/pg_loss": -0.125,
        "actor/old_logprobs_s": 0.031,
        "time/train_s": 1.5,
        "time/step_s": 2.0,
        "perf/tokens_per_s": 512.0,
        "perf/samples_per_s": 4.0,
    }
    assert without_timings(record) == {"step": 3, "reward/mean": 0.5, "actor/pg_loss": -0.125}
