"""SIGTERM stops a run cleanly whenever it comes, not only during the training loop.

A request recorded while the run starts (Ray, the workers, the resumed checkpoint) stops the
loop before its first step; SIGTERM while ``ray.init`` runs meets Ray's own handler, which
raises ``SystemExit(15)``: the run then stops there (tests/unit/app/test_sigterm_stop.py).
Either way: status ``stopped``, no exception (exit 0).
"""

from __future__ import annotations

import signal

from fit_stubs import StubRunner, StubSchedule

from rltrain.config.schema import RunConfig
from rltrain.runners import loop
from rltrain.scheduler import interrupts


class _Saves(StubRunner):
    def __init__(self) -> None:
        super().__init__()
        self.saved: list[int] = []

    def save(self, step: int) -> str:
        self.saved.append(step)
        return f"step-{step:06d}"


def test_a_sigterm_during_start_up_stops_the_loop_before_its_first_step(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "plot_curves", lambda records, path: None)
    run = RunConfig()
    run.trainer.total_steps, run.trainer.eval_every = 5, 0
    run.logging.progress = False
    runner = _Saves()
    with interrupts.termination_requests():
        signal.raise_signal(signal.SIGTERM)  # while the workers start: recorded, not fatal
        summary = loop.fit(runner, StubSchedule(), run, str(tmp_path))
    assert (summary["steps"], summary["status"]) == (0, "stopped")
    assert runner.saved == []  # nothing trained since the last checkpoint: nothing to save


def test_only_exit_status_15_counts_as_sigterm():
    assert interrupts.terminated(SystemExit(signal.SIGTERM))
    assert not interrupts.terminated(SystemExit(0)) and not interrupts.terminated(None)
    try:
        try:
            raise SystemExit(signal.SIGTERM)
        except SystemExit:
            raise RuntimeError("a clean-up failed meanwhile")  # noqa: B904
    except RuntimeError as secondary:
        assert interrupts.terminated(secondary)


def test_train_leaves_the_sigterm_handler_it_found():
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.termination_requests():
        assert signal.getsignal(signal.SIGTERM) is interrupts.on_terminate
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_request_is_forgotten_when_the_run_ends():
    # a later job of the same process (a benchmark starting workers) must not stop for it
    with interrupts.termination_requests():
        signal.raise_signal(signal.SIGTERM)
        assert interrupts.termination_requested()
    assert not interrupts.termination_requested()


def test_examining_an_exit_outside_a_run_records_no_request():
    # a caller outside any run (a test, a benchmark) asking about an exit must not leave a
    # request that stops the next job of this process as it starts
    assert interrupts.terminated(SystemExit(signal.SIGTERM))
    assert not interrupts.termination_requested()
    with interrupts.termination_requests():
        assert interrupts.terminated(SystemExit(signal.SIGTERM))
        assert interrupts.termination_requested()
    assert not interrupts.termination_requested()
