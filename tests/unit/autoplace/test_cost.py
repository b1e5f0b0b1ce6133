"""The cost model against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from rltrain.autoplace.candidates import Candidate
from rltrain.autoplace.cost import (
    EmbodiedCosts,
    Linear,
    ReasoningCosts,
    Scaling,
    costs_from_dict,
    costs_to_dict,
    items_per_round,
    pipeline_seconds,
    predict,
)


def test_scaling_fit_through_two_points():
    # t(1) = 3, t(2) = 2  ->  fixed + parallel = 3, fixed + parallel / 2 = 2  ->  1 + 2/k
    s = Scaling.fit([(1, 3.0), (2, 2.0)])
    assert s.fixed == pytest.approx(1.0) and s.parallel == pytest.approx(2.0)
    assert s.at(4) == pytest.approx(1.5)


def test_scaling_fit_one_device_count_assumes_no_speedup():
    s = Scaling.fit([(2, 0.8), (2, 1.2)])
    assert s == Scaling(fixed=pytest.approx(1.0), parallel=0.0)
    assert s.at(8) == pytest.approx(1.0)


def test_scaling_fit_keeps_a_stage_that_is_slower_on_more_devices():
    # t(1) = 1.0, t(2) = 1.2: fixed + parallel = 1.0, fixed + parallel / 2 = 1.2 -> 1.4 - 0.4/k
    s = Scaling.fit([(1, 1.0), (2, 1.2)])
    assert s.fixed == pytest.approx(1.4) and s.parallel == pytest.approx(-0.4)
    assert s.at(4) == pytest.approx(1.3)
    # A stage measured to gain more than linearly: the line between the measured counts
    # (-2 + 6/k: each measured count predicted as measured), no more than linear gain beyond
    # the widest (1.0 s on 2 devices: 2 device-seconds, t(4) = 0.5, not -2 + 1.5 < 0).
    s = Scaling.fit([(1, 4.0), (2, 1.0)])
    assert (s.fixed, s.parallel, s.widest) == pytest.approx((-2.0, 6.0, 2.0))
    assert [s.at(k) for k in (1, 2, 4, 8)] == pytest.approx([4.0, 1.0, 0.5, 0.25])
    assert s.scaled(0.5).at(4) == pytest.approx(0.25)
    # three counts: the line misses the points; the widest measured one bounds it from below
    # (least squares in 1/k: -0.4 + 2.6857/k, below 0 at 8; 0.05 s on 8 = 0.4 device-seconds)
    s = Scaling.fit([(8, 0.05), (4, 0.1), (2, 1.0)])
    assert s.widest == pytest.approx(0.4)
    assert [s.at(k) for k in (8, 16)] == pytest.approx([0.05, 0.025])


def test_linear_fit_never_gets_faster_with_more_environments():
    f = Linear.fit([(8, 0.2), (16, 0.1)])  # noise: the mean, no negative slope
    assert f.per_env == 0.0 and f.per_item == pytest.approx(0.15)


def test_linear_fit_and_proportional_single_point():
    f = Linear.fit([(8, 0.17), (16, 0.33)])  # 0.01 + 0.02 m
    assert f.per_item == pytest.approx(0.01) and f.per_env == pytest.approx(0.02)
    p = Linear.fit([(8, 0.16)])
    assert p.per_item == 0.0 and p.per_env == pytest.approx(0.02)
    assert p.at(4) == pytest.approx(0.08)


COSTS = ReasoningCosts(
    generate=Scaling(0.5, 1.0),  # G(1) = 1.5, G(2) = 1.0, G(4) = 0.75
    train=Scaling(0.2, 0.8),  # T(1) = 1.0, T(2) = 0.6, T(3) = 0.4667
    reward=0.01,
    sync=0.04,
    overhead=0.05,
    moves=Scaling(0.1),
    fused_overhead=0.02,
)


def test_collocated_fused_and_turns():
    fused = predict(Candidate("collocated", (0, 2), (0, 2), fused=True), COSTS)
    assert fused.seconds == pytest.approx(1.0 + 0.01 + 0.6 + 0.02)
    turns = predict(Candidate("collocated", (0, 2), (0, 2)), COSTS)
    assert turns.seconds == pytest.approx(1.0 + 0.01 + 0.6 + 0.04 + 0.1 + 0.05)
    assert turns.formula == "G + R + T + S + M + O"


def test_disaggregated_sequential_and_asynchronous():
    sync = predict(Candidate("disaggregated", (0, 3), (3, 4)), COSTS)
    assert sync.seconds == pytest.approx(1.5 + 0.01 + (0.2 + 0.8 / 3) + 0.04 + 0.05)
    # max(G(1), R + T(3) + S + O) = max(1.5, 0.01 + 0.4667 + 0.04 + 0.05) = 1.5
    async1 = predict(Candidate("disaggregated", (0, 3), (3, 4), staleness=1), COSTS)
    assert async1.seconds == pytest.approx(1.5)
    # training-bound: max(G(3), R + T(1) + S + O) = max(0.8333, 1.1)
    t_bound = predict(Candidate("disaggregated", (0, 1), (1, 4), staleness=1), COSTS)
    assert t_bound.seconds == pytest.approx(0.01 + 1.0 + 0.04 + 0.05)


def _policy(actor, rollout, policy):
    cand = Candidate("disaggregated", actor, rollout, staleness=1, partial_rollout=policy)
    return predict(cand, COSTS)


def test_partial_rollout_policies_where_generation_runs_past_the_swap():
    # G(1) = 1.5 > A = R + T(3) + S + O = 0.01 + 0.4667 + 0.04 + 0.05 = 0.5667
    a = 0.01 + (0.2 + 0.8 / 3) + 0.04 + 0.05
    finish = _policy((0, 3), (3, 4), "finish")
    assert finish.seconds == pytest.approx(1.5) and "fixed" not in finish.parts
    # restart: the generation cancelled at the swap runs again from its start: G + A
    restart = _policy((0, 3), (3, 4), "restart")
    assert restart.seconds == pytest.approx(1.5 + a)
    # continue: the call decodes 1.0 s, then pays F = 0.5; stopped at A = 0.5667, mid-decoding,
    # the resumed call decodes the 0.4333 left and pays F: 0.5667 + 0.4333 + 0.5 = 1.5 = G
    cont = _policy((0, 3), (3, 4), "continue")
    assert cont.seconds == pytest.approx(1.5) and cont.parts["fixed"] == 0.5
    assert cont.formula == "max(G, R + T + S + O + F)"


def test_continue_where_the_swap_lands_in_the_calls_fixed_cost():
    """The generation-heavy benchmark's terms: G = 0.026 s of decoding then F = 1.192 s of a
    call's fixed cost (1.218 s), A = 0.430 s. The swap at 0.430 s lands in the first call's
    fixed cost: its decoding is kept, the resumed call pays F again: 0.430 + 0 + 1.192 =
    1.622 s (measured 1.644 s), not max(G, A) + F = 2.410 s."""
    costs = ReasoningCosts(generate=Scaling(fixed=1.192, parallel=0.026), train=Scaling(0.43))
    cand = Candidate("disaggregated", (0, 1), (1, 2), staleness=1, partial_rollout="continue")
    cont = predict(cand, costs)
    assert cont.seconds == pytest.approx(1.622)
    assert cont.parts["fixed"] == pytest.approx(1.192)


def test_partial_rollout_policies_cost_nothing_where_generation_ends_first():
    # G(3) = 0.8333 <= A = R + T(1) + S + O = 1.1: nothing runs at the swap, all three are A
    for policy in ("finish", "continue", "restart"):
        assert _policy((0, 1), (1, 4), policy).seconds == pytest.approx(1.1)


def test_carry_takes_the_busy_share_of_a_static_batchs_generation():
    """carry at max_staleness=2: max(b G(k), A). G(1) = 1.5, A = R + T(3) + S + O = 0.5667:
    a busy share of 0.5 gives 0.75 (generation-bound still), 0.3 gives 0.45 < A (training-
    bound); without a length model's share (b = 1) carry ranks as finish."""
    cand = Candidate("disaggregated", (0, 3), (3, 4), staleness=2, partial_rollout="carry")
    a = 0.01 + (0.2 + 0.8 / 3) + 0.04 + 0.05
    half = predict(cand, COSTS, busy=lambda k, bound: 0.5)
    assert half.seconds == pytest.approx(0.75) and half.parts["generate"] == pytest.approx(0.75)
    assert half.formula == "max(b G, R + T + S + O)"
    assert predict(cand, COSTS, busy=lambda k, bound: 0.3).seconds == pytest.approx(a)
    assert predict(cand, COSTS).seconds == pytest.approx(_policy((0, 3), (3, 4), "finish").seconds)
    seen = []
    predict(cand, COSTS, busy=lambda k, bound: seen.append((k, bound)) or 1.0)
    assert seen == [(1, 2)]  # asked for the candidate's rollout devices and bound


def test_hybrid_takes_turns_on_the_rollout_devices():
    hyb = predict(Candidate("hybrid", (0, 4), (3, 4)), COSTS)
    assert hyb.seconds == pytest.approx(1.5 + 0.01 + 0.4 + 0.04 + 0.1 + 0.05)


def test_items_per_round_deals_stages_round_robin():
    assert items_per_round(1, 2, 2) == 1  # stage 0 -> rank 0, stage 1 -> rank 1
    assert items_per_round(2, 2, 1) == 4  # all four on the one rank
    assert items_per_round(1, 4, 3) == 2  # ranks get 2, 1, 1
    assert items_per_round(1, 1, 4) == 1  # 3 ranks idle


def test_pipeline_one_stage_is_sequential():
    total, crit, bott = pipeline_seconds(0.2, 0.1, 1, 10, 1, 1)
    assert crit == pytest.approx(0.3) and bott == pytest.approx(0.3)
    assert total == pytest.approx(10 * 0.3)


def test_pipeline_two_balanced_stages_hide_one_side():
    # e = i = 0.1 per stage of m envs: T_crit 0.2, T_b = max(0.1, 0.1, 0.1), N = 8 x 2 = 16
    total, crit, bott = pipeline_seconds(0.1, 0.1, 2, 8, 1, 1)
    assert (crit, bott) == (pytest.approx(0.2), pytest.approx(0.1))
    assert total == pytest.approx(0.2 + 15 * 0.1)


def test_pipeline_bottleneck_is_the_busier_rollout_rank():
    # 2 env processes x 2 stages on 1 rollout rank: q = 4 items per round, i = 0.05 each
    total, _, bott = pipeline_seconds(0.1, 0.05, 2, 4, 2, 1)
    assert bott == pytest.approx(max(0.1, 4 * 0.05 / 2, 0.15 / 2))
    assert total == pytest.approx(0.15 + 7 * 0.1)


EMB = EmbodiedCosts(
    env_item=Linear(0.0, 0.02),  # 20 ms per environment
    infer_item=Linear(0.01, 0.01),
    train=Scaling(0.3, 0.2),
    num_envs=16,
    rollout_steps=8,
    sync=0.02,
    overhead=0.03,
    moves=Scaling(0.05),
    epoch_overhead=0.1,
)


def test_embodied_prediction_hand_computed():
    # hybrid: env on 1 device (1 process), S = 2: m = 8, e = 0.16, i = 0.09; rollout 1 rank:
    # q = 2 -> T_b = max(0.16, 2 * 0.09 / 2, 0.25 / 2) = 0.16; N = 16: P = 0.25 + 15 * 0.16
    p = predict(Candidate("hybrid", (0, 2), (1, 2), env=(0, 1), stages=2), EMB)
    pipeline = 0.25 + 15 * 0.16
    assert p.parts["pipeline"] == pytest.approx(pipeline)
    assert p.seconds == pytest.approx(pipeline + 0.1 + (0.3 + 0.1) + 0.02 + 0.05 + 0.03)
    # disaggregated, one stage: m = 16, e = 0.32, i = 0.17, sequential 8 x 0.49; no moves
    d = predict(Candidate("disaggregated", (0, 1), (1, 2), stages=1), EMB)
    assert d.seconds == pytest.approx(8 * 0.49 + 0.1 + 0.5 + 0.02 + 0.03)


def test_costs_round_trip_through_json_data():
    for costs in (COSTS, EMB):
        assert costs_from_dict(costs_to_dict(costs)) == costs


def test_predict_refuses_unknown_costs():
    with pytest.raises(TypeError):
        predict(Candidate("collocated", (0, 1), (0, 1)), object())  # type: ignore[arg-type]


def test_predictions_are_finite_for_every_candidate():
    from rltrain.autoplace.candidates import embodied_candidates, reasoning_candidates

    for c in reasoning_candidates(16):
        assert math.isfinite(predict(c, COSTS).seconds)
    for c in embodied_candidates(4, [1, 2, 4]):
        assert math.isfinite(predict(c, EMB).seconds)


def test_an_asynchronous_candidate_adds_the_pi_old_pass_the_profile_did_not_make():
    # the profiled synchronous runs took pi_old from the rollout (no pass); with
    # max_staleness=1 it is recomputed: P(k) = 0.05 + 0.3/k on top of T(k)
    costs = ReasoningCosts(
        generate=Scaling(0.0, 0.2),
        train=Scaling(0.2, 0.8),
        old_logprobs=Scaling(0.05, 0.3),
        old_logprob_passes=(0, 1),
    )
    sync = predict(Candidate("disaggregated", (0, 1), (1, 2)), costs)
    assert sync.parts["train"] == pytest.approx(1.0)
    async1 = predict(Candidate("disaggregated", (0, 1), (1, 2), staleness=1), costs)
    assert async1.parts["train"] == pytest.approx(1.0 + 0.35)
    assert async1.seconds == pytest.approx(max(0.2, 1.35))
    # both make the pass (or neither): T as measured
    same = ReasoningCosts(Scaling(0.0, 0.2), Scaling(0.2, 0.8), old_logprob_passes=(1, 1))
    assert predict(Candidate("disaggregated", (0, 1), (1, 2), staleness=1), same).parts[
        "train"
    ] == pytest.approx(1.0)
    assert costs_from_dict(costs_to_dict(costs)) == costs
