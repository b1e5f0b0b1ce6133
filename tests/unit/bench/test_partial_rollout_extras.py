"""The partial_rollout measure's derived figures, from hand-made step records."""

from __future__ import annotations

from rltrain.bench.measures.partial_rollout import extras


def test_shares_and_staleness_per_policy():
    step = {"perf/tokens_per_s": 40.0, "time/step_s": 2.0, "rollout/staleness_max": 1}
    seen = {
        "sync": [{"perf/tokens_per_s": 40.0, "time/step_s": 2.0}],  # no rollout keys: skipped
        "restart": [{**step, "rollout/discarded_tokens": 20}, {**step, "rollout/staleness_max": 0}],
        "continue": [{**step, "rollout/discarded_tokens": 0, "rollout/continued_tokens": 40}],
    }
    out = extras(seen)
    # restart: 160 tokens trained, 20 thrown away -> 20 / 180
    assert out["restart_discarded_share"] == 20 / 180 and out["restart_staleness_max"] == 1
    assert out["restart_continued_share"] == 0.0
    # continue: 80 trained, 40 of them sampled with newer weights than their row's first
    assert out["continue_discarded_share"] == 0.0 and out["continue_continued_share"] == 0.5
    assert "sync_discarded_share" not in out
