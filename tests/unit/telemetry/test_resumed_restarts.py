"""After restarts within a run that was itself resumed, ``summary.json`` counts only this
invocation's steps: ``metrics.jsonl`` still holds the earlier invocation's records, but the
rates divide by this invocation's training seconds."""

from __future__ import annotations

import pytest

from rltrain.telemetry.summary import across_attempts


def test_an_earlier_invocations_records_are_not_counted():
    # steps 0-4: the earlier invocation (5 s of generation each); this one resumed at step 5,
    # failed after step 6, was restarted from step 6 and finished step 9
    records = [
        {
            "step": i,
            "perf/tokens_per_s": 100.0,
            "time/step_s": 1.0,
            "time/generate_s": 5.0 if i < 5 else 1.0,
            "rollout/staleness_max": 3 if i < 5 else 1,
            "rollout/dropped_samples": 7 if i < 5 else 1,
        }
        for i in range(10)
    ]
    attempts = [
        {"first_step": 5, "done_steps": 7, "training_s": 2.0},
        {"first_step": 6, "done_steps": 10, "training_s": 4.0},
    ]
    # the final attempt's own rollout totals, over steps 6-9 (as its runner wrote them)
    final = {"staleness_max": 1, "dropped_samples": 4, "discarded_tokens": 0}
    final.update({"continued_tokens": 0, "within_bound": 1.0})
    last = {"seconds_per_stage": {"generate": 1.0}, "rollout": final}
    out = across_attempts(last, records, attempts, max_staleness=1)

    assert out["steps"] == 5  # steps 5-9
    assert out["tokens_per_s"] == pytest.approx(500 / 6)  # steps 5-9: 100 tokens each, 6 s
    assert out["seconds_per_stage"] == {"generate": 1.0}  # not (5 x 5 + 5 x 1) / 10 = 3
    # the final attempt's totals plus step 5's, kept from the first attempt; not steps 0-4's
    assert out["rollout"]["staleness_max"] == 1  # not 3
    assert out["rollout"]["dropped_samples"] == 5  # not 4 + 5 x 7 + 1 = 40
    assert out["rollout"]["within_bound"] == 1.0  # not 5 of 10 steps
