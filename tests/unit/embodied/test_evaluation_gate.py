"""When an embodied run evaluates, and what an update with no finished episode logs, by hand.

The gate: with ``env.target_return=100`` evaluations fall every ``trainer.eval_every`` updates
once the training return has reached 50, and stay on from then (a later lower return, or an
epoch in which no episode ended, does not close it). A target <= 0 or none opens it at once.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from rltrain.runners.embodied import EmbodiedRunner, evaluation_gate, gate_reached


def _gate(every: int, target: float | None, returns: list[float | None]) -> list[int]:
    """The updates evaluated, feeding ``returns`` (one per update) through the gate."""
    opened, evaluated = False, []
    for step, train_return in enumerate(returns):
        due, opened = evaluation_gate(step, every, target, train_return, opened)
        if due:
            evaluated.append(step)
    return evaluated


def test_the_gate_opens_at_half_the_target_and_stays_open():
    # eval_every=2: updates 1, 3, 5, 7 are candidates. Update 2 reaches 50 (half of 100); update
    # 3 is lower (30), update 5 ended no episode (None), update 7 is back at 10: all evaluated
    returns = [10.0, 20.0, 50.0, 30.0, 40.0, None, 5.0, 10.0]
    assert _gate(2, 100.0, returns) == [3, 5, 7]


def test_an_epoch_without_a_finished_episode_is_not_a_return_of_zero():
    # a positive target: None neither opens the gate nor closes it (updates 0-3 end no
    # episode, update 4 reaches 60 >= 50, update 5 ends none again)
    assert _gate(1, 100.0, [None, None, None, None, 60.0, None]) == [4, 5]
    # a target <= 0 (-10) opens it at once, whatever the training returns
    assert _gate(1, -10.0, [None, -500.0]) == [0, 1]


def test_without_a_positive_target_every_eval_every_th_update_is_evaluated():
    assert _gate(3, None, [1.0] * 7) == [2, 5]
    assert _gate(3, 0.0, [1.0] * 7) == [2, 5]
    # half of -200 is -100, above the -200 the run stops at: no gate
    assert _gate(2, -200.0, [-400.0] * 4) == [1, 3]
    assert _gate(0, None, [1.0] * 4) == []  # trainer.eval_every=0: never


def _metrics(returns: list[float], lengths: list[int]) -> dict:
    runner = SimpleNamespace(sizes=SimpleNamespace(env_steps_per_epoch=8))
    results = [SimpleNamespace(episode_returns=returns, episode_lengths=lengths, step_s=0.5)]
    trained = [SimpleNamespace(metrics={"loss/policy": 0.25})]
    times = {"generate": 1.0, "train": 0.5, "sync": 0.5}
    return EmbodiedRunner._step_metrics(runner, results, [{"infer_s": 0.1}], trained, times)


def test_an_update_with_no_finished_episode_logs_no_return():
    out = _metrics([], [])
    assert out["env/episodes"] == 0
    for key in ("env/return_mean", "env/length_mean", "reward/mean"):
        assert key not in out
    assert out["perf/env_steps_per_s"] == 4.0  # 8 env steps over 2 s


def test_an_update_with_finished_episodes_logs_their_means():
    out = _metrics([10.0, 20.0], [10, 30])
    assert (out["env/return_mean"], out["env/length_mean"], out["reward/mean"]) == (15.0, 20, 15.0)
    assert out["env/episodes"] == 2


def test_a_resumed_run_finds_the_gate_its_checkpointed_updates_reached(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "env/return_mean": 12.0}, {"step": 1}, {"step": 2, "env/return_mean": 25.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gate_reached(str(path), 3, 40.0)  # update 2 reached 20 = half of 40
    assert not gate_reached(str(path), 2, 40.0)  # update 2 is redone: only 12 before it
    assert not gate_reached(str(path), 3, 60.0)  # 25 < 30
    assert not gate_reached(str(tmp_path / "none.jsonl"), 3, 40.0)  # logging.jsonl=false
