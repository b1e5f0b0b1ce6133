"""Per-sample staleness accounting and the run totals (hand-computed values)."""

from __future__ import annotations

from rltrain.runners.staleness import over_bound, staleness
from rltrain.telemetry.summary import run_totals


def test_staleness_counts_from_the_first_version_and_the_bound_is_inclusive():
    assert staleness(7, 5) == 2 and staleness(3, 3) == 0
    assert not over_bound(7, 5, 2) and over_bound(7, 4, 2) and over_bound(1, 0, 0)


def test_run_totals_sum_the_counts_and_take_the_largest_staleness():
    records = [
        {"step": 0, "rollout/staleness_max": 0, "rollout/dropped_samples": 0},
        {
            "step": 1,
            "rollout/staleness_max": 1,
            "rollout/discarded_tokens": 12,
            "rollout/continued_tokens": 5,
        },
        {"step": 2, "rollout/staleness_max": 2, "rollout/dropped_samples": 8},
        {"step": 3, "rollout/staleness_max": 1, "rollout/discarded_tokens": 3},
        {"step": 4, "eval/accuracy": 0.5},  # an evaluation record: not a step of its own
    ]
    totals = run_totals(records, max_staleness=1)
    assert totals == {
        "staleness_max": 2,
        "dropped_samples": 8,
        "discarded_tokens": 15,
        "continued_tokens": 5,
        "within_bound": 0.75,  # 3 of the 4 steps (equal batches) at most 1 version stale
    }
    assert run_totals([{"step": 0, "reward/mean": 0.1}], 0) == {}  # synchronous: nothing


def test_groups_left_in_the_carry_buffer_count_as_discarded():
    records = [
        {"step": 0, "rollout/staleness_max": 0, "rollout/discarded_tokens": 4},
        {
            "step": 1,
            "rollout/staleness_max": 2,
            "rollout/discarded_tokens": 10,  # the last step's record counts what is left
            "rollout/unfinished_groups": 3,
        },
    ]
    totals = run_totals(records, max_staleness=2)
    assert (totals["unfinished_groups"], totals["discarded_tokens"]) == (3, 14)
    # an early stop: the groups held after the last record come from the schedule's end
    totals = run_totals(records[:1], 2, left={"groups": 2, "tokens": 9})
    assert (totals["unfinished_groups"], totals["discarded_tokens"]) == (2, 13)
