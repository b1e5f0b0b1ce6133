"""A step's stage times do not overlap: the weight sync that follows the update is timed apart
from ``train``, so the stage times add up to ``time/step_s`` and the throughputs divide by the
step's real time. The stages run on stand-in groups whose waits move a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
    """Handing the export over takes ``seconds``; it must run in the actor's ``lease``."""

    def __init__(self, clock: Clock, seconds: float, lease: Lease) -> None:
        self.clock, self.seconds, self.lease, self.version = clock, seconds, lease, 0

    def submit_exports(self, version: int) -> dict[str, Any]:
        return {}

    def handed(self, version: int, futures: dict[str, Any]) -> None:
        assert self.lease.held, "the export reads the actor's weights: it needs the lease"
        self.clock.now += self.seconds

    def export(self, version: int, lease: bool = True) -> None:
        self.handed(version, {})
        self.version = version


class Lease:
    """The actor's lease: its entry waits ``entry_s`` (the rollout's offload) and its end
    ``end_s``; ``held`` says whether it is held now."""

    def __init__(self, clock: Clock, entry_s: float, end_s: float) -> None:
        self.clock, self.entry_s, self.end_s, self.held = clock, entry_s, end_s, False

    @contextmanager
    def stage(self, component: str) -> Iterator[None]:
        if component != "actor":
            yield
            return
        self.clock.now += self.entry_s
        self.held = True
        yield
        self.held = False
        self.clock.now += self.end_s


def _job(lease: Lease) -> SimpleNamespace:
    return SimpleNamespace(
        stage=lease.stage, resident_components=(), refresh_ledger=lambda *a: None
    )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(loop, "time", c)  # StepTimer reads loop.time.perf_counter
    return c


def test_reasoning_stage_times_add_up_to_the_step(clock: Clock):
    # generate 1.0 s, the actor's lease entry 0.125 s (the rollout's offload) and update 2.0 s,
    # hand-over 0.5 s, lease end 0.0625 s, the scores' fetch 0.25 s: step 3.9375 s
    scores = [Scores(torch.tensor([1.0, 0.0]), torch.tensor([3, 5]))]
    result = TrainResult({"actor/pg_loss": 0.1}, {})
    lease = Lease(clock, 0.125, 0.0625)
    s = ReasoningStages.__new__(ReasoningStages)
    s.job, s.dispatcher, s.scorer = _job(lease), None, SimpleNamespace(score="score")
    s.g = ReasoningGroups(
        actor=Group(Future(clock, 2.0, [result])), reward=Group(Future(clock, 0.25, [scores]))
    )
    s.batch_stage = SimpleNamespace(needs_scores=False)
    s.hub = Hub(clock, 0.5, lease)
    s.sizes = SimpleNamespace(samples_per_step=2)
    timer = StepTimer()
    with timer("generate"):
        clock.now += 1.0
    start = clock.now - 1.0
    out = s.learn(0, ["shard"], timer)
    assert out["time/train_s"] == pytest.approx(2.125)  # the lease's entry and the update
    assert out["time/sync_s"] == pytest.approx(0.5625)  # the hand-over and the lease's end
    assert out["time/reward_s"] == pytest.approx(0.25)
    assert out["time/step_s"] == pytest.approx(3.9375)
    assert out["time/step_s"] == pytest.approx(clock.now - start)  # every wait in a stage
    assert out["perf/samples_per_s"] == pytest.approx(2 / 3.9375)
    assert out["perf/tokens_per_s"] == pytest.approx(8 / 3.9375)


def test_embodied_train_and_sync_do_not_overlap(clock: Clock):
    # the lease's entry 0.125 s (the rollout's and env's offloads), the update 1.5 s, the
    # export's hand-over 0.25 s, the lease's end 0.0625 s
    lease = Lease(clock, 0.125, 0.0625)
    r = EmbodiedRunner.__new__(EmbodiedRunner)
    r.job, r.hub = _job(lease), Hub(clock, 0.25, lease)
    r.g = {"actor": Group(Future(clock, 1.5, [TrainResult({}, {})]))}
    timer = StepTimer()
    start = clock.now
    r._train_and_export(3, ["transitions"], timer)
    assert timer.times == {"train": pytest.approx(1.625), "sync": pytest.approx(0.3125)}
    assert sum(timer.times.values()) == pytest.approx(clock.now - start)
    assert r.hub.version == 4
