"""An evaluation that scored no episode (every tool episode infra-failed) records no
``eval/accuracy`` and reaches no target: not 0.0, and not a crash on the missing value."""

from __future__ import annotations

from types import SimpleNamespace

from rltrain.runners.reasoning import ReasoningRunner
from rltrain.runners.schedules import _accuracy


def _runner(target: float | None) -> SimpleNamespace:
    return SimpleNamespace(run=SimpleNamespace(trainer=SimpleNamespace(target_accuracy=target)))


def test_an_unscored_evaluation_records_no_accuracy():
    assert _accuracy(None) == {}
    assert _accuracy(0.0) == {"eval/accuracy": 0.0}
    assert _accuracy(0.75) == {"eval/accuracy": 0.75}


def test_an_unscored_evaluation_reaches_no_target():
    reached = ReasoningRunner.target_reached
    assert reached(_runner(0.5), _accuracy(None)) is False
    assert reached(_runner(0.5), None) is False
    assert reached(_runner(0.5), _accuracy(0.5)) is True
    assert reached(_runner(0.5), _accuracy(0.25)) is False
    assert reached(_runner(None), _accuracy(1.0)) is False
