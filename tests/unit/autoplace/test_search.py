"""Ranking, the winner's choice and the checking order (pure: the check is passed in)."""

from __future__ import annotations

import dataclasses

import pytest

from rltrain.autoplace.candidates import Candidate, reasoning_candidates
from rltrain.autoplace.cost import Prediction, ReasoningCosts, Scaling
from rltrain.autoplace.search import (
    EXCLUDED,
    OK,
    TIE,
    UNCHECKED,
    Row,
    pick,
    rank,
    render,
    verify,
)

# Generation-heavy, flat scaling: G = 1.2, T = 0.4, S = 0.02, O = 0.01.
GEN_HEAVY = ReasoningCosts(
    generate=Scaling(1.2), train=Scaling(0.4), sync=0.02, overhead=0.01, fused_overhead=0.01
)


def _row(name: str, seconds: float, status: str = OK, **kw) -> Row:
    fam, _, rest = name.partition(":")
    cand = {
        "fused": Candidate("collocated", (0, 2), (0, 2), fused=True),
        "turns": Candidate("collocated", (0, 2), (0, 2)),
        "dis": Candidate("disaggregated", (0, 1), (1, 2)),
        "async": Candidate("disaggregated", (0, 1), (1, 2), staleness=1),
        "cont": Candidate("disaggregated", (0, 1), (1, 2), staleness=1, partial_rollout="continue"),
        "hyb": Candidate("hybrid", (0, 2), (1, 2)),
    }[fam]
    return Row(cand, Prediction(seconds, {}, ""), status=status, **kw)


def test_rank_orders_by_prediction():
    rows = rank(reasoning_candidates(2), GEN_HEAVY)
    got = [(r.candidate.name, round(r.seconds, 4)) for r in rows]
    assert got[:2] == [
        # max(1.2, 0.4 + 0.02 + 0.01)
        ("disaggregated actor 0 rollout 1 async1", 1.2),
        # 1.2 + 0.4 + 0.01
        ("collocated 0-1 fused", 1.61),
    ]
    # 1.2 + 0.4 + 0.02 + 0.01: the turn-taking and the disaggregated one tie; continue too: G
    # is all fixed cost, so the swap at A = 0.43 s lands in it and the continued call pays it
    # again: max(1.2, 0.43 + 1.2). Their order within the tie is the floats' (pick() treats
    # them as tied: test_finish_wins_a_tie_with_continue)
    assert sorted(got[2:]) == [
        ("collocated 0-1 turns", 1.63),
        ("disaggregated actor 0 rollout 1", 1.63),
        ("disaggregated actor 0 rollout 1 async1 continue", 1.63),
        ("hybrid actor 0-1 rollout 1", 1.63),
    ]
    assert all(r.status == UNCHECKED for r in rows)


def test_finish_wins_a_tie_with_continue():
    # no fixed generation cost: continue's extra call is free, so it ties finish at G = 1.2
    costs = ReasoningCosts(generate=Scaling(0.0, 1.2), train=Scaling(0.4), sync=0.02)
    rows = rank(reasoning_candidates(2, families=("disaggregated",)), costs)
    assert [r.candidate.name for r in rows[:2]] == [
        "disaggregated actor 0 rollout 1 async1",
        "disaggregated actor 0 rollout 1 async1 continue",
    ]
    assert rows[0].seconds == rows[1].seconds == pytest.approx(1.2)
    checked = [dataclasses.replace(r, status=OK) for r in rows]
    assert pick(checked).candidate.partial_rollout == "finish"
    # within the tie finish wins even when predicted a little slower; beyond it, the faster one
    assert pick([_row("cont", 1.0), _row("async", 1.0 * (1 + TIE / 2))]).candidate.name == (
        "disaggregated actor 0 rollout 1 async1"
    )
    assert pick([_row("cont", 1.0), _row("async", 1.0 * (1 + 2 * TIE))]).candidate.name == (
        "disaggregated actor 0 rollout 1 async1 continue"
    )


def test_pick_prefers_the_simpler_layout_within_the_tie():
    rows = [_row("async", 1.0), _row("fused", 1.0 * (1 + TIE / 2)), _row("turns", 0.9, EXCLUDED)]
    assert pick(rows).candidate.fused  # within 1 %: synchronous and fused wins
    rows = [_row("async", 1.0), _row("fused", 1.0 * (1 + 2 * TIE))]
    assert pick(rows).candidate.staleness == 1  # beyond the tie the faster one wins
    assert pick([_row("dis", 1.0, EXCLUDED)]) is None


def NO_PRECHECK(run, cand):
    return ""


def _counting(refuse: set[str]):
    calls: list[str] = []

    def check(run, cand):
        calls.append(cand.name)
        return ("refused" if cand.name in refuse else ""), 123, "mode"

    return check, calls


def test_verify_checks_every_row_of_a_small_search():
    rows = rank(reasoning_candidates(2), GEN_HEAVY)
    check, calls = _counting({"disaggregated actor 0 rollout 1 async1"})
    out = verify(None, rows, max_checked=32, check=check, precheck=NO_PRECHECK)
    assert len(calls) == 6
    assert [r.status for r in out] == [EXCLUDED, OK, OK, OK, OK, OK]
    assert out[0].reason == "refused" and out[1].peak_bytes == 123
    assert pick(out).candidate.name == "collocated 0-1 fused"


def test_verify_stops_once_the_winner_is_settled():
    rows = [_row("async", 1.0), _row("fused", 1.005), _row("turns", 1.2), _row("hyb", 1.3)]
    check, calls = _counting({"disaggregated actor 0 rollout 1 async1"})
    out = verify(
        None, rows, max_checked=2, check=check, precheck=NO_PRECHECK
    )  # 4 rows > 2: stop early
    assert calls == ["disaggregated actor 0 rollout 1 async1", "collocated 0-1 fused"]
    assert [r.status for r in out] == [EXCLUDED, OK, UNCHECKED, UNCHECKED]
    check, calls = _counting(set())
    out = verify(None, rows, max_checked=3, check=check, precheck=NO_PRECHECK)
    # the fused row is within the tie of the first valid one, so it is checked too
    assert len(calls) == 2 and [r.status for r in out][2:] == [UNCHECKED, UNCHECKED]
    assert pick(out).candidate.fused


def test_search_on_1024_nodes_of_8_devices_stays_linear():
    """8,192 devices: 32,766 candidates ranked; checking stops after the few that can win."""
    devices = 1024 * 8
    cands = reasoning_candidates(devices)
    assert len(cands) == 2 + (devices - 1) * 4
    costs = ReasoningCosts(
        generate=Scaling(0.05, 400.0), train=Scaling(0.05, 200.0), sync=0.01, overhead=0.01
    )
    rows = rank(cands, costs)
    assert len(rows) == len(cands)
    best = rows[0].candidate
    # asynchronous, k rollout devices balancing 0.05 + 400/k = 0.05 + 200/(D-k) + 0.02: the root
    # of 0.02 k^2 - (600 + 0.02 D) k + 400 D = 0, k = (763.84 - sqrt(321307.55)) / 0.04 = 4925
    assert best.staleness == 1 and best.rollout_devices in (4924, 4925, 4926)
    check, calls = _counting(set())
    out = verify(None, rows, max_checked=32, check=check, precheck=NO_PRECHECK)
    near = sum(r.seconds <= rows[0].seconds * (1 + TIE) for r in rows)
    assert len(calls) == min(near, 32) and sum(r.status == UNCHECKED for r in out) >= len(rows) - 32


def test_size_precheck_does_not_use_up_the_checks():
    """8,192 devices and 4,096 prompts x 4 samples: only splits whose worlds divide the batch
    can run; the cheap size check skips the others without counting them."""
    import dataclasses

    from rltrain.config.schema import RunConfig

    run = RunConfig()
    run = dataclasses.replace(
        run,
        trainer=dataclasses.replace(run.trainer, train_batch_size=4096),
        rollout=dataclasses.replace(run.rollout, n_samples_per_prompt=4),
    )
    costs = ReasoningCosts(
        generate=Scaling(0.05, 400.0), train=Scaling(0.05, 200.0), sync=0.01, overhead=0.01
    )
    rows = rank(reasoning_candidates(8192), costs)
    check, calls = _counting(set())
    out = verify(run, rows, max_checked=32, check=check)
    winner = pick(out)
    # rollout ranks must divide 4,096 prompts and actor ranks 16,384 samples: powers of two,
    # so the split is 4,096 + 4,096 (k = 4925 is the unconstrained optimum)
    assert winner.candidate.rollout_devices == 4096 and winner.candidate.staleness == 1
    assert len(calls) <= 32
    excluded = [r for r in out if r.status == EXCLUDED]
    assert excluded and all("does not divide" in r.reason for r in excluded)


def test_render_lists_the_winner_first_with_reasons():
    rows = [_row("async", 1.0, EXCLUDED, reason="the plan does not fit"), _row("fused", 1.5)]
    text = render(rows, rows[1], header="head", top=1)
    lines = text.splitlines()
    assert lines[0] == "head"
    assert lines[3].startswith("  1* collocated 0-1 fused")
    assert "1 more (1 excluded" in text
    assert "* runs: collocated 0-1 fused" in text


@pytest.mark.parametrize("d", [1, 3, 5])
def test_every_candidate_gets_a_prediction(d):
    assert len(rank(reasoning_candidates(d), GEN_HEAVY)) == 2 + (d - 1) * 4
