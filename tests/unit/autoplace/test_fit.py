"""Profiling layouts and the cost terms fitted to hand-made readings."""

from __future__ import annotations

import json

import pytest

from rltrain.autoplace.candidates import Candidate
from rltrain.autoplace.fit import fit_embodied, fit_reasoning, profile_candidates
from rltrain.autoplace.readings import RunReading, read_run


def _names(slots):
    return [[c.name for c in slot] for slot in slots]


def test_profile_layouts_reasoning():
    assert _names(profile_candidates("reasoning", 1)) == [["collocated 0 fused"]]
    assert _names(profile_candidates("reasoning", 2)) == [
        ["collocated 0-1 fused"],
        ["disaggregated actor 0 rollout 1", "hybrid actor 0-1 rollout 1"],
    ]
    four = _names(profile_candidates("reasoning", 4))
    assert four[0] == ["collocated 0-3 fused"]
    # balanced first, then the nearest other splits, then hybrid fall-backs
    assert four[1][:3] == [
        "disaggregated actor 0-1 rollout 2-3",
        "disaggregated actor 0-2 rollout 3",
        "disaggregated actor 0 rollout 1-3",
    ]
    assert four[1][3] == "hybrid actor 0-3 rollout 2-3"
    assert four[2][0] == "disaggregated actor 0-2 rollout 3"  # rollout on n/4


def test_profile_layouts_embodied():
    assert _names(profile_candidates("embodied", 2, stages=2, num_envs=16)) == [
        ["collocated 0-1 S=2"],
        ["disaggregated actor 0 rollout 1 S=1", "hybrid actor 0-1 rollout 1 S=1"],
    ]
    one = _names(profile_candidates("embodied", 1, stages=1, num_envs=16))
    assert one == [["collocated 0 S=1"], ["collocated 0 S=2"]]
    # 3 environments: no other stage count divides them, one device: one run
    assert _names(profile_candidates("embodied", 1, stages=1, num_envs=3)) == [["collocated 0 S=1"]]


def _reading(stages, step_s, period_s, moves=None):
    return RunReading(3, stages, step_s, period_s, moves or {})


def test_fit_reasoning_takes_moves_out_of_the_stages():
    two = _reading(
        {"generate": 1.2, "train": 0.7, "reward": 0.01, "sync": 0.03},
        step_s=1.94,
        period_s=2.0,
        moves={"rollout/reload": 0.2, "actor/offload": 0.0, "actor/reload": 0.1},
    )
    one = _reading(
        {"generate": 1.5, "train": 1.0, "reward": 0.01, "sync": 0.05},
        step_s=2.56,
        period_s=2.6,
    )
    c = fit_reasoning(
        [
            (Candidate("collocated", (0, 2), (0, 2)), two),
            (Candidate("disaggregated", (0, 1), (1, 2)), one),
        ]
    )
    # generate: (2, 1.0), (1, 1.5) -> 0.5 + 1.0/k; train: (2, 0.6), (1, 1.0) -> 0.2 + 0.8/k
    assert c.generate.fixed == pytest.approx(0.5) and c.generate.parallel == pytest.approx(1.0)
    assert c.train.fixed == pytest.approx(0.2) and c.train.parallel == pytest.approx(0.8)
    assert c.sync == pytest.approx(0.04) and c.reward == pytest.approx(0.01)
    assert c.overhead == pytest.approx((0.06 + 0.04) / 2)
    assert c.fused_overhead == c.overhead  # no fused run: the same
    # moves only from the layout that shares devices: 0.3 at 2 devices, assumed for all
    assert c.moves.at(1) == pytest.approx(0.3) and c.moves.at(2) == pytest.approx(0.3)


def _write_run(path, records, starts_s, step_span):
    """A run directory as a reasoning run writes it: ``metrics.jsonl`` and the driver's
    per-step spans in ``trace.json`` (``step`` for a fused step, ``generate`` for one taking
    turns)."""
    path.mkdir()
    with open(path / "metrics.jsonl", "w") as f:
        for i, r in enumerate(records):
            f.write(json.dumps({"step": i, "reward/mean": 0.0, **r}) + "\n")
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "process driver"}}]
    events += [
        {"ph": "X", "name": step_span, "cat": "driver", "pid": 1, "ts": s * 1e6, "dur": 1e5}
        for s in starts_s
    ]
    (path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    return read_run(str(path), warmup=1)


def test_fit_reasoning_with_a_fused_run(tmp_path):
    # 4 steps each: step 0 is warm-up, step 3 is followed by evaluation: steps 1-2 are timed.
    turn = {"time/generate_s": 1.5, "time/train_s": 1.0, "time/reward_s": 0.0}
    turn = {**turn, "time/sync_s": 0.05, "time/step_s": 2.55}
    turns = _write_run(tmp_path / "split", [turn] * 4, [0.0, 2.6, 5.2, 7.8], "generate")
    # fused ranks time their own stages; the driver times the whole call (time/step_s) and
    # records no sync
    one = {"time/generate_s": 1.0, "time/train_s": 0.6, "time/reward_s": 0.0}
    slow = {"time/generate_s": 5.0, "time/train_s": 5.0, "time/reward_s": 0.0}
    records = [{**slow, "time/step_s": 11.0}] + [{**one, "time/step_s": 1.62}] * 2
    records.append({**slow, "time/step_s": 20.0})
    fused = _write_run(tmp_path / "fused", records, [0.0, 11.0, 12.7, 14.4], "step")
    assert fused.fused and not turns.fused
    assert RunReading.from_dict(fused.to_dict()) == fused  # cached profiles keep it
    c = fit_reasoning(
        [
            (Candidate("disaggregated", (0, 1), (1, 2)), turns),
            (Candidate("collocated", (0, 2), (0, 2), fused=True), fused),
        ]
    )
    assert c.generate.at(2) == pytest.approx(1.0) and c.train.at(1) == pytest.approx(1.0)
    assert c.sync == pytest.approx(0.05)  # from the turn-taking run only
    assert c.overhead == pytest.approx(2.6 - 2.55)
    assert c.fused_overhead == pytest.approx(1.7 - 1.6)  # period beyond the ranks' stages
    assert c.moves.at(1) == 0.0


def test_fit_embodied_items_from_the_epoch_totals():
    # 16 envs, 4 steps. Run A: 2 stages on 2 rollout ranks: m = 8, q = 1; env stepped 8 items
    # in 1.28 s -> 0.16 each; the busiest rank inferred 4 items in 0.4 s -> 0.1 each.
    a = _reading(
        {"env_step": 1.28, "infer": 0.4, "generate": 1.5, "train": 0.3, "sync": 0.01},
        step_s=1.81,
        period_s=1.85,
        moves={"actor/offload": 0.05},
    )
    # Run B: 1 stage on 1 rank: m = 16: 4 items, 0.32 s each; 4 inferences, 0.18 s each.
    b = _reading(
        {"env_step": 1.28, "infer": 0.72, "generate": 2.1, "train": 0.5, "sync": 0.01},
        step_s=2.61,
        period_s=2.61,
    )
    runs = [
        (Candidate("collocated", (0, 2), (0, 2), stages=2), a),
        (Candidate("collocated", (0, 1), (0, 1), stages=1), b),
    ]
    c = fit_embodied(runs, num_envs=16, rollout_steps=4)
    assert c.env_item.per_item == pytest.approx(0.0) and c.env_item.per_env == pytest.approx(0.02)
    # (8, 0.1), (16, 0.18): 0.02 + 0.01 m
    assert c.infer_item.per_item == pytest.approx(0.02)
    assert c.infer_item.per_env == pytest.approx(0.01)
    # train (2, 0.3), (1, 0.5) -> 0.1 + 0.4/k
    assert c.train.fixed == pytest.approx(0.1) and c.train.parallel == pytest.approx(0.4)
    # epoch overhead: A: formula 0.26 + 7 x 0.16 = 1.38; epoch 1.5 - 0.05 moves = 1.45 -> 0.07
    # B: sequential 4 x 0.5 = 2.0; epoch 2.1 -> 0.1
    assert c.epoch_overhead == pytest.approx((0.07 + 0.1) / 2)
    assert c.moves.at(2) == pytest.approx(0.05) and c.moves.at(1) == pytest.approx(0.0)
    assert c.overhead == pytest.approx((0.04 + 0.0) / 2)


def test_fits_need_a_run():
    # statistics' own error on an empty list is a ValueError too: the guard's message is checked
    with pytest.raises(ValueError, match="needs at least one profiling run"):
        fit_reasoning([])
    with pytest.raises(ValueError, match="needs at least one profiling run"):
        fit_embodied([], 16, 4)


def test_fit_reasoning_measures_the_pi_old_pass_or_models_it():
    stages = {"generate": 1.0, "train": 0.9, "reward": 0.0, "sync": 0.0}
    two = RunReading(3, stages, 1.9, 2.0, {}, old_logprobs_s=0.2)
    one = RunReading(3, {**stages, "train": 1.5}, 2.5, 2.6, {}, old_logprobs_s=0.35)
    runs = [
        (Candidate("disaggregated", (0, 2), (2, 3)), two),
        (Candidate("disaggregated", (0, 1), (1, 3)), one),
    ]
    c = fit_reasoning(runs, old_logprob_passes=(1, 1), ppo_epochs=2)
    # measured: (2, 0.2), (1, 0.35) -> 0.05 + 0.3/k
    assert c.old_logprobs.fixed == pytest.approx(0.05)
    assert c.old_logprobs.parallel == pytest.approx(0.3)
    assert c.old_logprob_passes == (1, 1)
    # not measured (the profile made no pass): a third of one of the 2 epochs' training time
    plain = [(cand, RunReading(3, r.stages, r.step_s, r.period_s)) for cand, r in runs]
    m = fit_reasoning(plain, old_logprob_passes=(0, 1), ppo_epochs=2)
    # train: (2, 0.9), (1, 1.5) -> 0.3 + 1.2/k; P = that / 6
    assert m.old_logprobs.at(1) == pytest.approx(1.5 / 6)
    assert m.old_logprobs.at(2) == pytest.approx(0.9 / 6)
