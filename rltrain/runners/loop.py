"""The training loop both runners share: resume, signals, the eval/save/stop cadence, metrics.

A runner brings its :class:`Runner` hooks (resume, save, the target, the summary) and one
:class:`Schedule` — the way a step is taken (fused ranks, components taking turns, an
asynchronous generation pipeline, an embodied env/rollout pipeline), chosen once from the run's
layout. The loop itself has no per-mode branch:

    start = resume()
    for step in start .. total_steps:
        record = schedule.step(step, queue_next=<nothing happens before the next step>)
        evaluate when due, after the last step and at a time-budget stop; log
        stop on the target, the time budget or SIGTERM (after recording a step queued behind)
        save every trainer.save_every steps, at the end and when stopping
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rltrain.config.schema import RunConfig, TrainerConfig
from rltrain.scheduler.interrupts import (
    check_interrupt,
    termination_requested,
    termination_requests,
)
from rltrain.telemetry.metrics import MetricsLogger, drop_records_from, plot_curves


@dataclass
class StepTimer:
    """Seconds per stage of the current step (``time/<stage>_s`` metrics)."""

    def __post_init__(self) -> None:
        self.times: dict[str, float] = {}

    def __call__(self, name: str):
        timer = self

        class _T:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timer.times[name] = timer.times.get(name, 0.0) + time.perf_counter() - self.t

        return _T()


class Schedule(Protocol):
    """One way of taking a training step on a started job."""

    #: Whether step ``s + 1`` may be submitted behind step ``s`` (the workers run their calls
    #: in order, so nothing changes but the driver's round trip between the two).
    queues_ahead: bool

    def begin(self, start: int, horizon: int) -> None:
        """Before the first step: ``start`` is the resumed step, ``horizon`` the last."""

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        """Take step ``step``; with ``queue_next``, also submit ``step + 1`` behind it."""

    def has_queued(self) -> bool:
        """Whether a step was submitted ahead and not yet taken."""

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluation metrics (``eval/...`` keys) with the current weights."""

    def end(self, done_steps: int, clean: bool) -> None:
        """After the last step or a stop (``clean``: leave no work or weight version in
        flight), or after a failure (``clean`` false: drop what is queued, wait for nothing)."""


class Runner(Protocol):
    """What a runner brings to the loop besides its schedule."""

    def resume(self) -> int:
        """Load the checkpoint ``trainer.resume`` names; returns the step to start from."""

    def save(self, step: int) -> str:
        """Write a checkpoint of the state after ``step`` steps; returns its path."""

    def evaluation_due(self, step: int, record: dict[str, Any]) -> bool:
        """Whether to evaluate after ``step`` (the loop also evaluates after the last step and
        the step a time budget stops the run at)."""

    def target_reached(self, evaluated: dict[str, Any] | None) -> bool:
        """Whether the evaluation just made reached the run's target."""

    def summary(self, records: list[dict], steps: int, seconds: float, status: str) -> dict:
        """The job summary of the steps this invocation ran."""


def stage_means(records: list[dict[str, Any]], stages: set[str]) -> dict[str, float]:
    """Mean seconds per step of each stage (``time/<stage>_s``) over ``records``."""
    n = max(len(records), 1)
    return {k: sum(r.get(f"time/{k}_s", 0) for r in records) / n for k in stages}


def job_summary(
    job: Any, records: list[dict[str, Any]], steps: int, seconds: float, status: str
) -> dict[str, Any]:
    """The summary keys every runner writes: the placement, steps and their rate, seconds per
    stage (every ``time/<stage>_s`` the records hold), each device's peak memory, whether the
    devices were simulated, how the run ended and its wall time.

    Args:
        job: the running :class:`rltrain.runners.job.Job` (its plan and residency ledger).
        records: the step records this invocation logged.
        steps: steps this invocation ran.
        seconds: their wall time, the rates' time base (:func:`fit`'s: from the first step's
            start to the last step's end, evaluations and checkpoints included).
        status: how the run ended (``completed``, ``stopped``, ...).

    Returns:
        The shared keys; a runner adds its own (:meth:`Runner.summary`).
    """
    stages = {k[5:-2] for r in records for k in r if k.startswith("time/") and k != "time/step_s"}
    mode = job.plan.mode
    return {
        "placement_mode": getattr(mode, "value", str(mode)),
        "steps": steps,
        "steps_per_s": steps / seconds if seconds else None,
        "seconds_per_stage": stage_means(records, stages),
        "peak_memory_bytes_per_device": {f"{n}:{d}": b for (n, d), b in job.residency.peak.items()},
        "simulated_devices": any(n.accelerator_type == "sim" for n in job.plan.cluster.nodes),
        "status": status,
        "wall_s": seconds,
    }


@dataclass(frozen=True)
class Cadence:
    """When the loop evaluates, saves and may queue a step ahead (``trainer.*``)."""

    total_steps: int
    eval_every: int
    save_every: int
    time_budget_s: float | None

    @classmethod
    def of(cls, t: TrainerConfig) -> Cadence:
        return cls(t.total_steps, t.eval_every, t.save_every, t.time_budget_s)

    def every_eval(self, step: int) -> bool:
        """An evaluation falls after ``step`` by ``trainer.eval_every``."""
        return bool(self.eval_every) and (step + 1) % self.eval_every == 0

    def saves(self, step: int) -> bool:
        """A checkpoint falls after ``step`` by ``trainer.save_every`` or as the last step."""
        return (bool(self.save_every) and (step + 1) % self.save_every == 0) or self.last(step)

    def last(self, step: int) -> bool:
        return step + 1 == self.total_steps

    def over_budget(self, t0: float) -> bool:
        return self.time_budget_s is not None and time.monotonic() - t0 > self.time_budget_s

    def quiet_after(self, step: int, t0: float) -> bool:
        """Nothing happens between ``step`` and ``step + 1``: no evaluation, no checkpoint, not
        the last step, the budget not spent."""
        return not (
            self.last(step) or self.every_eval(step) or self.saves(step) or self.over_budget(t0)
        )


@dataclass(frozen=True)
class Progress:
    """What one call of :func:`fit` got through, also when it failed.

    Attributes:
        first_step: the step it started from (the resumed step).
        done_steps: the steps completed by its end (``first_step`` + the steps it took).
        seconds: its training seconds (from its first step to its end).
    """

    first_step: int
    done_steps: int
    seconds: float


#: The :class:`Progress` of the latest :func:`fit` of this process (None before any): a run
#: restarted after a failure reads the failed attempt's progress here.
LAST_FIT: list[Progress] = []


def last_fit() -> Progress | None:
    """The :class:`Progress` of the latest :func:`fit` in this process, or None."""
    return LAST_FIT[-1] if LAST_FIT else None


class StopSignal:
    """SIGTERM asks the loop to finish the step, write a checkpoint and stop.

    Inside a run (:func:`~rltrain.scheduler.interrupts.termination_requests`, which
    :func:`rltrain.app.train` holds) the request is the run's: one that arrived before the loop
    (while Ray and the workers started, or the checkpoint loaded) stops it before its first
    step.
    """

    def __init__(self) -> None:
        self._scope: Any = None

    @property
    def requested(self) -> bool:
        return termination_requested()

    def __enter__(self) -> StopSignal:
        self._scope = termination_requests()
        self._scope.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._scope.__exit__(*exc)


def _evaluate(
    runner: Runner,
    schedule: Schedule,
    cadence: Cadence,
    step: int,
    record: dict[str, Any],
    t0: float,
    stop: StopSignal,
) -> bool:
    """Evaluate after ``step`` when it is due, the last step, or the step the time budget stops
    the run at; the evaluation's metrics go into ``record``.

    A SIGTERM stop evaluates only when due: it finishes the step in flight and checkpoints,
    promptly (the summary's ``final_*`` is then the latest evaluation's).

    Args:
        runner: the runner's hooks (when an evaluation is due, whether it reached the target).
        schedule: evaluates with the current weights.
        cadence: the run's ``trainer.*`` cadence.
        step: the step just taken.
        record: its record, updated in place.
        t0: the loop's start (``time.monotonic``), the time budget's origin.
        stop: whether SIGTERM asked the loop to stop (read after the evaluation due).

    Returns:
        Whether the run stops after ``step`` (or after the step queued behind it).
    """
    evaluated = None
    if runner.evaluation_due(step, record) or cadence.last(step):
        evaluated = schedule.evaluate(step)
    ending = runner.target_reached(evaluated) or cadence.over_budget(t0) or stop.requested
    # the budget stops the run here (a step queued behind is recorded first and evaluated
    # then): its summary's final_* must not be an older evaluation's, or none
    if ending and evaluated is None and not stop.requested and not schedule.has_queued():
        evaluated = schedule.evaluate(step)
    if evaluated is not None:
        record.update(evaluated)
    return ending


def fit(
    runner: Runner,
    schedule: Schedule,
    run: RunConfig,
    run_dir: str,
    on_start: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train until ``trainer.total_steps``, the target, the time budget or SIGTERM.

    Args:
        runner: the runner's hooks.
        schedule: how each step is taken.
        run: the run's config: its ``trainer`` section sets the cadence, its ``logging``
            section the metrics logger's outputs, and the whole of it is the trackers' run
            parameters (W&B's config, MLflow's params).
        run_dir: where ``metrics.jsonl`` and ``reward_curve.png`` (over the steps of every run
            into it, when ``metrics.jsonl`` is written; none when no step logged a curve's
            metric) go.
        on_start: called with the start step before the schedule begins.

    Returns:
        The runner's summary of the steps this call ran, with its status (``completed`` or
        ``stopped`` by SIGTERM).
    """
    cadence = Cadence.of(run.trainer)
    start = runner.resume()
    path = os.path.join(run_dir, "metrics.jsonl")
    earlier: list[dict[str, Any]] = []
    if start > 0:  # the steps from the checkpoint on are logged again (a run cut off after it)
        kept = drop_records_from(path, start)
        # the run's reward curve is drawn over every step, those of earlier runs included
        earlier = kept if run.logging.jsonl else []
    metrics = MetricsLogger(run_dir, run.logging, config=dataclasses.asdict(run), resume=start > 0)
    if on_start is not None:
        on_start(start)
    schedule.begin(start, cadence.total_steps)
    done_steps, status, t0, clean = start, "completed", time.monotonic(), False
    with StopSignal() as stop:
        try:
            # SIGTERM during start-up stops the run before its first step (the checkpoint it
            # resumed, if any, stays the latest: nothing new to save)
            early = stop.requested
            status = "stopped" if early else status
            for step in range(start, start if early else cadence.total_steps):
                check_interrupt()  # one dropped by a finalizer is raised here, a step late
                queue = (
                    schedule.queues_ahead and not stop.requested and cadence.quiet_after(step, t0)
                )
                record = schedule.step(step, queue_next=queue)
                ending = _evaluate(runner, schedule, cadence, step, record, t0, stop)
                metrics.progress(step + 1, cadence.total_steps, metrics.log(step, record))
                done_steps = step + 1
                if ending and schedule.has_queued():
                    continue  # the next step already runs: record it, then stop
                if cadence.saves(step) or ending:
                    runner.save(step + 1)
                if ending:
                    status = "stopped" if stop.requested else "completed"
                    break
            clean = True
        finally:
            # the summary's time base (wall_s): the steps with their evaluations and
            # checkpoints, not the reward curve drawn below (half a second of matplotlib)
            seconds = time.monotonic() - t0
            LAST_FIT[:] = [Progress(start, done_steps, seconds)]
            metrics.close()
            schedule.end(done_steps, clean)
    plot_curves(earlier + metrics.records, f"{run_dir}/reward_curve.png")
    return runner.summary(metrics.records, done_steps - start, seconds, status)
