"""A fused step's ``time/step_s`` covers the ranks' work on it, also when it was queued behind
the previous step (the ranks start it before the driver asks for it)."""

from __future__ import annotations

import contextlib
import time

from rltrain.runners.schedules import FusedSchedule

#: Seconds a rank takes for one fused step (generate, score, train).
STEP_S = 4.0


class Clock:
    """A stand-in for ``time.perf_counter``: moves only when the test or a wait moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Ranks:
    """Fused ranks running their calls in order, each taking :data:`STEP_S`."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.free_at = clock, 0.0

    def call_each(self, method, args):
        start = max(self.clock.now, self.free_at)
        self.free_at = start + STEP_S
        return Done(self.clock, self.free_at)


class Done:
    """A call's future: waiting moves the clock to the call's end."""

    def __init__(self, clock: Clock, end: float) -> None:
        self.clock, self.end = clock, end

    def wait(self):
        self.clock.now = max(self.clock.now, self.end)
        return [(None, None)]


class Stages:
    """The stand-in stages: one rank; the record is the step's times."""

    def __init__(self, clock: Clock) -> None:
        self.g = type("Groups", (), {"actor": Ranks(clock)})()
        self.job = type("Job", (), {"stage": lambda self, c: contextlib.nullcontext()})()
        self.dispatcher = None
        self.version = 0

    def rank_prompts(self, step: int):
        return [["prompt"]]

    def refresh_ledger(self, component, results) -> None:
        pass

    def step_metrics(self, scores, results, times):
        return {"time/step_s": sum(times.values())}

    def observe_lengths(self, keys, scores):
        return {}


def test_a_queued_step_is_timed_from_the_previous_steps_end(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    schedule = FusedSchedule(Stages(clock))
    schedule.begin(0, 3)

    first = schedule.step(0, queue_next=True)  # the ranks take step 1 at t=4, end it at t=8
    clock.now += 1.0  # the driver logs step 0: t=5
    queued = schedule.step(1, queue_next=False)
    clock.now += 1.0  # t=9
    alone = schedule.step(2, queue_next=False)  # submitted at t=9, ends at t=13

    assert first["time/step_s"] == 4.0
    assert queued["time/step_s"] == 4.0  # 8 - 4, not the 3 s the driver waited (8 - 5)
    assert alone["time/step_s"] == 4.0
