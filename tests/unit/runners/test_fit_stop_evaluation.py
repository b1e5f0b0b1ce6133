"""The step a run stops at is evaluated like its last one when the time budget stops it, so
the summary's ``final_*`` is never an older evaluation's (or none); a SIGTERM stop stays prompt
and evaluates only when due. By hand, with a clock of 1 s per step."""

from __future__ import annotations

import signal
from typing import Any

from fit_stubs import StubRunner, StubSchedule

from rltrain.config.schema import RunConfig
from rltrain.runners import loop


class _Clock:
    """Stands in for ``time`` in the loop: each step of :class:`StubSchedule` takes 1 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _KeepRecords(StubRunner):
    """Its summary also holds the records ``fit`` logged."""

    def summary(self, records: list[dict], steps: int, seconds: float, status: str) -> dict:
        return {**super().summary(records, steps, seconds, status), "records": records}


def _run(total_steps: int, budget: float | None) -> RunConfig:
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = total_steps, 0
    run.trainer.time_budget_s = budget
    run.logging.progress = False
    return run


def _evaluated(summary: dict[str, Any]) -> list[int]:
    return [r["step"] for r in summary["records"] if "eval/accuracy" in r]


def test_a_time_budget_stop_evaluates_the_step_it_stops_at(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "plot_curves", lambda records, path: None)
    # 1.5 s of budget: step 0 ends at 1 s (within it), step 1 at 2 s (over it): the run stops
    # after step 1 of 5, and step 1 is evaluated as the last step would be
    schedule = StubSchedule(clock=clock)
    summary = loop.fit(_KeepRecords(), schedule, _run(5, 1.5), str(tmp_path))
    assert (summary["steps"], summary["status"]) == (2, "completed")
    assert _evaluated(summary) == [1]


class _QueuedBehindStep1(StubSchedule):
    """Step 2 was submitted behind step 1 (as a schedule that queues ahead does)."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(clock=clock)
        self.taken: list[int] = []

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        self.taken.append(step)
        return super().step(step, queue_next)

    def has_queued(self) -> bool:
        return self.taken[-1] == 1


def test_a_time_budget_stop_behind_a_queued_step_evaluates_that_step(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "plot_curves", lambda records, path: None)
    # over the budget after step 1 (2 s > 1.5 s) with step 2 queued: step 2 is recorded, then
    # the run stops, and only step 2 (the one it stops at) is evaluated
    summary = loop.fit(_KeepRecords(), _QueuedBehindStep1(clock), _run(5, 1.5), str(tmp_path))
    assert summary["steps"] == 3
    assert _evaluated(summary) == [2]


class _TermAtStep1(StubSchedule):
    """SIGTERM arrives while step 1 is in flight."""

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        if step == 1:
            signal.raise_signal(signal.SIGTERM)
        return super().step(step, queue_next)


def test_a_sigterm_stop_checkpoints_without_an_evaluation_that_is_not_due(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "plot_curves", lambda records, path: None)
    summary = loop.fit(_KeepRecords(), _TermAtStep1(), _run(5, None), str(tmp_path))
    assert (summary["steps"], summary["status"]) == (2, "stopped")
    assert _evaluated(summary) == []


def test_a_run_within_its_budget_evaluates_after_its_last_step_only(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "plot_curves", lambda records, path: None)
    summary = loop.fit(_KeepRecords(), StubSchedule(clock=clock), _run(3, 10.0), str(tmp_path))
    assert summary["steps"] == 3
    assert _evaluated(summary) == [2]
