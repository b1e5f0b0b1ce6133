"""time_to_accuracy times the same span on both sides: rltrain's final checkpoint is left out."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from rltrain.bench.measures import trainer
from rltrain.runners import reasoning
from rltrain.runners.reasoning import ReasoningRunner


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_timed_saves_adds_each_checkpoints_seconds_and_restores_the_method(monkeypatch):
    clock = FakeClock()

    def save(runner, step: int) -> str:
        clock.t += 0.7
        return f"ckpt-{step}"

    monkeypatch.setattr(ReasoningRunner, "save", save)
    spent: list[float] = []
    with trainer._timed_saves(spent, clock):
        assert ReasoningRunner.save(None, 5) == "ckpt-5"
    assert spent == [0.7] and ReasoningRunner.save is save


def test_rltrain_training_time_leaves_out_the_final_checkpoint(monkeypatch):
    @contextlib.contextmanager
    def saves_took(spent: list[float]):
        spent.append(0.7)
        yield spent

    run_cfg = SimpleNamespace(trainer=SimpleNamespace(target_accuracy=0.9))
    monkeypatch.setattr(trainer, "compose", lambda *overrides: run_cfg)
    monkeypatch.setattr(trainer, "_timed_saves", saves_took)
    summary = {"final_accuracy": 0.95, "steps": 250, "wall_s": 10.0}
    monkeypatch.setattr(reasoning, "run_reasoning", lambda run, out: summary)
    seen: dict = {}
    trainer._rltrain_case("rltrain", seeds=(1,), seen=seen).fn()
    ((seed, steps, seconds),) = seen["rltrain"]
    assert (seed, steps) == (1, 250) and abs(seconds - 9.3) < 1e-9
