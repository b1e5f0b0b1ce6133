"""The plain loop's time to the target ends where rltrain's does: after the evaluation that
reached it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rltrain.bench import plain_grpo


def test_time_to_target_includes_the_evaluation_that_reached_it(monkeypatch):
    now = [0.0]
    accuracies = iter([0.0, 1.0])  # step 0's evaluation, then step 1's (the target)

    def accuracy(model, data) -> float:
        now[0] += 5.0  # every evaluation takes 5 s on the fake clock
        return next(accuracies)

    monkeypatch.setattr(plain_grpo, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(plain_grpo, "accuracy", accuracy)
    monkeypatch.setattr(plain_grpo, "build_model", lambda seed: torch.nn.Linear(1, 1))
    monkeypatch.setattr(plain_grpo, "grpo_step", lambda model, opt, batch, gen: 0.0)
    out = plain_grpo.main(["--steps", "3", "--eval-every", "1", "--target-accuracy", "0.9"])
    # the clock starts after step 0's evaluation (t = 5); step 1's evaluation ends at t = 10
    assert out["steps_to_target"] == 1
    assert out["time_to_target_s"] == 5.0
    assert out["curve"] == [[0, 0.0, 0.0], [1, 5.0, 1.0]]
