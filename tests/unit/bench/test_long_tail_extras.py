"""The long_tail measure's derived figures and goals, from hand-made step records."""

from __future__ import annotations

import pytest

from rltrain.bench.measures.long_tail import (
    ACTOR_ENV,
    ACTOR_MS,
    actor_latency_ms,
    busy_s,
    carry_idle,
    extras,
    report,
)
from rltrain.errors import ConfigError


def _rec(step_s: float, staleness: int = 1, discarded: int = 0) -> dict[str, float]:
    return {
        "time/step_s": step_s,
        "perf/tokens_per_s": 10.0 / step_s,  # 10 tokens trained per step
        "rollout/staleness_max": staleness,
        "rollout/discarded_tokens": discarded,
    }


def test_idle_speedups_discarded_share_and_goals_by_hand():
    busy = {s + d: b for s in (0, 10, 20, 30, 40) for d, b in ((0, 0.4), (1, 0.2))}.get
    seen = {
        "sync": [(0, {"time/step_s": 2.0}), (1, {"time/step_s": 2.0})],
        "finish": [(10, _rec(1.0)), (11, _rec(1.0, staleness=0))],
        "restart": [(20, _rec(2.0, discarded=10)), (21, _rec(2.0))],
        "continue": [(30, _rec(0.5)), (31, _rec(0.5, staleness=2))],
        # the fifo sampler dropped an older shard of 8 samples for a fresher one
        "fifo": [(40, {**_rec(1.0), "rollout/dropped_samples": 8}), (41, _rec(1.0))],
    }
    out = extras(seen, busy)
    assert out["fifo_dropped_samples"] == 8 and out["restart_dropped_samples"] == 0
    assert out["sync_steps_per_s"] == 0.5 and out["continue_steps_per_s"] == 2.0
    assert out["sync_idle"] == pytest.approx(1 - 0.6 / 4)  # 0.6 s of rows busy in 4 s
    assert out["continue_idle"] == pytest.approx(1 - 0.6 / 1)
    assert out["restart_discarded_share"] == pytest.approx(10 / 30)  # 20 trained, 10 thrown
    assert out["continue_speedup_vs_sync"] == 4.0
    assert out["continue_speedup_vs_best"] == 2.0  # finish's 1 step/s is the best
    assert out["within_bound"] == 7 / 8  # continue's second batch was 2 versions stale
    goals = report(out)
    assert goals["sync_idle_met"] == 1.0 and goals["continue_idle_met"] == 0.0
    assert goals["continue_speedup_vs_sync_met"] == 1.0 and goals["within_bound_met"] == 0.0


def test_busy_seconds_are_the_workers_modelled_rows():
    # the mean of the 8 rows the worker draws for the step (median 8 tokens), at 1 s per token
    assert 1 <= busy_s(1, 0, 1.0) <= 128
    assert busy_s(1, 0, 1.0) == busy_s(1, 0, 1.0) != busy_s(1, 1, 1.0)


def test_carry_figures_its_own_bound_and_the_idle_while_decoding_by_hand():
    busy = {0: 0.4, 1: 0.2, 10: 0.4, 11: 0.2, 40: 0.4, 41: 0.2}.get
    spread = {0: (4.0, 16.0), 1: (2.0, 4.0), 10: (4.0, 16.0), 11: (2.0, 4.0)}.get
    seen = {
        "sync": [(0, {"time/step_s": 2.0}), (1, {"time/step_s": 2.0})],
        "finish": [(10, _rec(1.0)), (11, _rec(1.0))],
        "carry": [(40, _rec(0.5, staleness=2)), (41, _rec(0.5, staleness=1, discarded=5))],
    }
    out = extras(seen, busy, spread=spread)
    assert out["sync_rollout_idle"] == pytest.approx(1 - 6 / 20)  # rows decode 6 of 20 steps
    assert out["finish_rollout_idle"] == pytest.approx(0.7)
    assert "carry_rollout_idle" not in out  # the rollout's carry buffer counts it
    assert out["carry_speedup_vs_sync"] == 4.0 and out["carry_speedup_vs_best"] == 2.0
    assert out["carry_discarded_share"] == pytest.approx(5 / 25)
    assert out["within_bound"] == 1.0  # 2 versions stale is within carry's max_staleness=2
    idle = carry_idle([{"busy": 30, "slot_steps": 40}, {"busy": 6, "slot_steps": 8}])
    assert idle == {"carry_rollout_idle": pytest.approx(1 - 36 / 48)}
    assert carry_idle([{}]) == {}
    goals = report({**out, **idle})
    assert goals["carry_rollout_idle_met"] == 0.0 and goals["carry_speedup_vs_sync_met"] == 1.0
    assert goals["carry_discarded_share_met"] == 0.0 and goals["within_bound_met"] == 1.0


def test_the_update_time_is_generation_bound_unless_the_variable_sets_another():
    assert actor_latency_ms({}) == ACTOR_MS == 250.0
    assert actor_latency_ms({ACTOR_ENV: "1000"}) == 1000.0
    for bad in ("0", "-5", "slow", "nan"):
        with pytest.raises(ConfigError, match=ACTOR_ENV):
            actor_latency_ms({ACTOR_ENV: bad})


def test_each_carry_schedule_keeps_its_own_buffer_totals():
    """The schedules share the rollout, and each carry schedule's prime starts a new buffer
    there: a carry schedule's totals are read at the next case's first call, the last one's
    at the end; carry7 counts within its own bound of 7."""
    from rltrain.bench.harness import Case
    from rltrain.bench.measures.long_tail import CarryStats

    reads = iter([[{"busy": 1, "slot_steps": 2}], [{"busy": 9, "slot_steps": 10}]])
    kept = CarryStats(lambda: next(reads))
    calls: list[str] = []
    names = ("fifo", "carry", "carry7")
    cases = [kept.track(Case(n, lambda n=n: calls.append(n)), n) for n in names]
    for case in cases:
        case.fn()
        case.fn()  # a second call reads nothing
    kept.close()
    assert calls == ["fifo", "fifo", "carry", "carry", "carry7", "carry7"]
    assert carry_idle(kept.of("carry"), "carry") == {"carry_rollout_idle": 0.5}
    assert carry_idle(kept.of("carry7"), "carry7") == {"carry7_rollout_idle": pytest.approx(0.1)}
    assert kept.of("fifo") == []
    seen = {"sync": [(0, {"time/step_s": 1.0})], "carry7": [(9, _rec(0.5, staleness=7))]}
    assert extras(seen, lambda s: 0.1)["within_bound"] == 1.0


def test_the_shared_quick_job_has_long_tails_quick_shape():
    """long_tail's quick figures model the latencies of the job the schedule measures share:
    its per-token latency and median at the quick scale, the update a twentieth of ACTOR_MS."""
    from rltrain.bench.measures.long_tail import MEDIAN, QUICK_SCALE, TOKEN_MS
    from rltrain.bench.measures.trainer import QUICK_SCHEDULES_RUN

    knobs = dict(o.split("=", 1) for o in QUICK_SCHEDULES_RUN if o.startswith("simulate."))
    assert float(knobs["simulate.rollout_token_latency_ms"]) == TOKEN_MS * QUICK_SCALE
    assert float(knobs["simulate.response_length_median"]) == MEDIAN
    assert float(knobs["simulate.actor_latency_ms"]) == ACTOR_MS * QUICK_SCALE
