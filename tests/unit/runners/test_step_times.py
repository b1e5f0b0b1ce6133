"""A step's stage times do not overlap: the weight sync that follows the update is timed apart
from ``train``, so the stage times add up to ``time/step_s`` and the throughputs divide by the
step's real time. The stages run on stand-in groups whose waits move a fake clock."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rltrain.runners import loop
from rltrain.runners.embodied import EmbodiedRunner
from rltrain.runners.loop import StepTimer
from rltrain.runners.stages import ReasoningGroups, ReasoningStages
from rltrain.workers.common import TrainResult
from rltrain.workers.reward import Scores


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class Future:
    """A call that takes ``seconds`` of the driver's time when waited for."""

    def __init__(self, clock: Clock, seconds: float, results: list[Any]) -> None:
        self.clock, self.seconds, self.results, self.refs = clock, seconds, results, ["ref"]

    def wait(self) -> list[Any]:
        self.clock.now += self.seconds
        return self.results


class Group:
    def __init__(self, future: Future) -> None:
        self.future = future

    def execute_on(self, *ranks: int) -> Group:
        return self

    def call(self, *args: Any, **kwargs: Any) -> Future:
        return self.future


class Hub:
    """Handing the export over takes ``seconds``."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds, self.version = clock, seconds, 0

    def submit_exports(self, version: int) -> dict[str, Any]:
        return {}

    def handed(self, version: int, futures: dict[str, Any]) -> None:
        self.clock.now += self.seconds

    def export(self, version: int, lease: bool = True) -> None:
        self.handed(version, {})
        self.version = version


def _job() -> SimpleNamespace:
    return SimpleNamespace(
        stage=lambda c: nullcontext(), resident_components=(), refresh_ledger=lambda *a: None
    )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(loop, "time", c)  # StepTimer reads loop.time.perf_counter
    return c


def test_reasoning_stage_times_add_up_to_the_step(clock: Clock):
    # generate 1.0 s, update 2.0 s, hand-over 0.5 s, the scores' fetch 0.25 s: step 3.75 s
    scores = [Scores(torch.tensor([1.0, 0.0]), torch.tensor([3, 5]))]
    result = TrainResult({"actor/pg_loss": 0.1}, {})
    s = ReasoningStages.__new__(ReasoningStages)
    s.job, s.dispatcher, s.scorer = _job(), None, SimpleNamespace(score="score")
    s.g = ReasoningGroups(
        actor=Group(Future(clock, 2.0, [result])), reward=Group(Future(clock, 0.25, [scores]))
    )
    s.batch_stage = SimpleNamespace(needs_scores=False)
    s.hub = Hub(clock, 0.5)
    s.sizes = SimpleNamespace(samples_per_step=2)
    timer = StepTimer()
    with timer("generate"):
        clock.now += 1.0
    out = s.learn(0, ["shard"], timer)
    assert out["time/train_s"] == pytest.approx(2.0)  # the update only
    assert out["time/sync_s"] == pytest.approx(0.5)
    assert out["time/reward_s"] == pytest.approx(0.25)
    assert out["time/step_s"] == pytest.approx(3.75)
    assert out["perf/samples_per_s"] == pytest.approx(2 / 3.75)
    assert out["perf/tokens_per_s"] == pytest.approx(8 / 3.75)


def test_embodied_train_and_sync_do_not_overlap(clock: Clock):
    # the update 1.5 s, the export's hand-over 0.25 s
    r = EmbodiedRunner.__new__(EmbodiedRunner)
    r.job, r.hub = _job(), Hub(clock, 0.25)
    r.g = {"actor": Group(Future(clock, 1.5, [TrainResult({}, {})]))}
    timer = StepTimer()
    r._train_and_export(3, ["transitions"], timer)
    assert timer.times == {"train": pytest.approx(1.5), "sync": pytest.approx(0.25)}
    assert r.hub.version == 4
