"""The ways a reasoning step is taken, as objects the shared loop drives.

:func:`schedule_for` picks one from the run's layout, once:

- :class:`FusedSchedule` — actor, rollout and rule reward in one process per device
  (``placement.fuse``): one call per rank generates, scores and trains; step ``s + 1`` may be
  queued behind step ``s``.
- :class:`TurnSchedule` — separate processes taking turns on their devices (synchronous): the
  rollout generates with the newest weights, then :meth:`StepStages.learn`.
- :class:`PipelinedSchedule` — asynchronous rollout (``trainer.max_staleness = k >= 1``): the
  generations of the next ``k`` steps run while the actor trains (:class:`GenerationPipeline`;
  with ``trainer.sampler=fifo|windowed``, :class:`PooledPipeline`).

Each offers the loop's :class:`~rltrain.runners.loop.Schedule` protocol (``begin``, ``step``,
``has_queued``, ``evaluate``, ``end``) and ``drain`` for benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from rltrain.errors import WorkerError
from rltrain.runners.loop import StepTimer
from rltrain.runners.pipeline import GenerationPipeline, Generator
from rltrain.runners.pool import PooledPipeline
from rltrain.telemetry import trace
from rltrain.telemetry.summary import UNFINISHED
from rltrain.workers.fused import FusedWorker


class StepStages(Generator, Protocol):
    """What a schedule drives: a reasoning step's stages
    (:class:`~rltrain.runners.stages.ReasoningStages`; named here so the schedules need not
    import it, and unit tests may pass a stand-in)."""

    run: Any  # the run config (``trainer``)
    fused: bool  # actor, rollout and reward share one process per device
    g: Any  # the worker groups (``g.actor``)
    dispatcher: Any  # the length-aware dispatcher, or None

    def rank_prompts(self, step: int, round_: int = 0) -> list[list[str]]: ...
    def learn(self, step: int, shards: list[Any], timer: StepTimer) -> dict[str, Any]: ...
    def observe_lengths(self, keys: list[Any], scores: list[Any]) -> dict[str, float]: ...
    def refresh_ledger(self, component: str, results: list[Any]) -> None: ...
    def step_metrics(self, scores: Any, results: list[Any], times: Any) -> dict[str, Any]: ...
    def export_weights(self, version: int) -> None: ...
    def finish_weight_sync(self) -> None: ...
    def evaluate_rollout(self) -> float | None: ...


class FusedSchedule:
    """One call per rank does the whole step; steps may queue behind each other.

    Args:
        stages: the stages whose fused actor ranks take the steps.
    """

    queues_ahead = True

    def __init__(self, stages: StepStages) -> None:
        self.stages = stages
        self._queued: tuple[int, Any] | None = None
        self._done_at: float | None = None  # when the driver saw the last step's call finish

    def begin(self, start: int, horizon: int | None) -> None:
        self.stages.version = start  # the ranks sample with the parameters they train

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        """Generate, score and train on every rank's prompts.

        Args:
            step: the policy-update index.
            queue_next: also submit ``step + 1`` behind this one (a rank runs its calls in
                order, so it still generates with the weights this step leaves). The caller
                promises to take ``step + 1`` next, with no evaluation or checkpoint between.

        Returns:
            The step's record. Its ``time/step_s`` is the call's time, from its submission to
            its end; for a step that was queued, from the end of the previous step's call
            (when its ranks began it) to its own end.
        """
        r = self.stages
        timer = StepTimer()
        queued = self._queued is not None
        with timer("step"), r.job.stage("actor"), trace.span("step", "driver"):
            future = self._take_queued(step)
            if queue_next:
                self._queued = (step + 1, self._submit(step + 1))
            out = future.wait()
            # in the lease: the state the ranks measured sits beside the stage's bytes
            r.refresh_ledger("actor", [result for result, _ in out])
        done_at = time.perf_counter()
        if queued and self._done_at is not None:
            # the ranks began a queued step when they finished the previous one, before this
            # call's timer started: its time is the period between the two completions
            timer.times["step"] = done_at - self._done_at
        self._done_at = done_at
        results = [result for result, _ in out]
        r.version = step + 1
        scores = [scores for _, scores in out]
        metrics = r.step_metrics(scores, results, timer.times)
        return {**metrics, **r.observe_lengths(_fused_keys(step, len(scores)), scores)}

    def has_queued(self) -> bool:
        return self._queued is not None

    def evaluate(self, step: int) -> dict[str, Any]:
        self._nothing_queued("evaluate")
        r = self.stages
        with r.job.stage("actor"):
            accuracy = r.g.actor.execute_on(0).call(FusedWorker.evaluate).wait()[0]
        return _accuracy(accuracy)

    def end(self, done_steps: int, clean: bool) -> None:
        self._queued = None  # a failed run's queued step dies with its job

    def drain(self) -> None:
        """Nothing runs ahead unless queued (and a queued step is the caller's to take)."""

    def _submit(self, step: int) -> Any:
        r = self.stages
        prompts = r.rank_prompts(step)
        future = r.g.actor.call_each(FusedWorker.step, [(p, step) for p in prompts])
        if r.dispatcher is not None:  # a fused rank answers with its scores: key by step, rank
            r.dispatcher.sent(_fused_keys(step, len(prompts)), prompts)
        return future

    def _take_queued(self, step: int) -> Any:
        """The queued call for ``step`` (see ``queue_next``), or a new one."""
        if self._queued is None:
            return self._submit(step)
        queued, future = self._queued
        self._queued = None
        if queued != step:
            raise WorkerError(
                f"fused step {queued} was queued on the ranks but step {step} trains next: "
                f"after step(s, queue_next=True) take step s + 1"
            )
        return future

    def _nothing_queued(self, what: str) -> None:
        if self._queued is not None:
            raise WorkerError(
                f"{what} with fused step {self._queued[0]} queued on the ranks would see its "
                f"update: train that step first"
            )


class TurnSchedule:
    """Separate processes taking turns: generate with the newest weights, then learn.

    Args:
        stages: the stages whose rollout generates and whose actor learns.
    """

    queues_ahead = False

    def __init__(self, stages: StepStages) -> None:
        self.stages = stages

    def begin(self, start: int, horizon: int | None) -> None:
        self.stages.export_weights(start)  # the rollout starts from the actor's weights

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        r = self.stages
        timer = StepTimer()
        with timer("generate"), r.job.stage("rollout"), trace.span("generate", "driver"):
            rollouts = r.submit_generation(step, r.version)
            rollouts.wait()
        return r.learn(step, rollouts.refs, timer)

    def has_queued(self) -> bool:
        return False

    def evaluate(self, step: int) -> dict[str, Any]:
        return _accuracy(self.stages.evaluate_rollout())

    def end(self, done_steps: int, clean: bool) -> None:
        if clean:
            self.stages.finish_weight_sync()

    def drain(self) -> None:
        """Nothing runs ahead."""


class PipelinedSchedule(TurnSchedule):
    """Asynchronous rollout: the next ``k`` steps' generations run while the actor trains.

    Args:
        stages: the stages whose rollout generates ahead.
        max_staleness: ``k >= 1``, weight versions a batch may lag behind the actor.
        partial_rollout: ``finish``, ``restart`` or ``continue`` (``trainer.partial_rollout``).
        sampler: a benchmark's override of ``trainer.sampler`` (None: the config's).
        carry: a benchmark's override of ``trainer.carry_surplus`` and ``trainer.carry_segment``
            (``{"surplus": 2, "segment": 1}``; a key left out: the config's).
    """

    def __init__(
        self,
        stages: StepStages,
        max_staleness: int,
        partial_rollout: str,
        sampler: str | None = None,
        carry: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(stages)
        t = stages.run.trainer
        sampler = sampler or t.sampler
        c = {"surplus": t.carry_surplus or 1, "segment": t.carry_segment, **(carry or {})}
        self.pipeline: GenerationPipeline = (
            GenerationPipeline(stages, max_staleness, partial_rollout, c["surplus"], c["segment"])
            if sampler == "in_order"
            else PooledPipeline(stages, max_staleness, partial_rollout, sampler, t.sampler_window)
        )
        self.left_at_end: dict[str, int] | None = None  # carry: groups held after the last record

    def begin(self, start: int, horizon: int | None) -> None:
        super().begin(start, horizon)
        self.pipeline.reset(start, horizon=horizon)

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        timer = StepTimer()
        self.pipeline.fill(step)  # next steps' generation overlaps this step's training
        with timer("generate"), trace.span("generate_wait", "driver"):
            gen = self.pipeline.take(step)
            gen.future.wait()
        metrics = self.stages.learn(step, gen.future.refs, timer)
        metrics.update(self.pipeline.metrics(gen))
        if self.pipeline.policy == "carry" and "rollout/oldest_version" in metrics:
            # carried groups started before the generation that handed them on
            oldest = metrics["rollout/oldest_version"]
            metrics["rollout/weight_version"] = oldest
            metrics["rollout/staleness"] = metrics["rollout/staleness_max"] = step - oldest
        if self.pipeline.policy == "carry" and step == (self.pipeline.horizon or 0) - 1:
            self._count_left(metrics)  # the run's last step: what is still buffered never trains
        return metrics

    def _count_left(self, metrics: dict[str, Any]) -> None:
        """``carry``: the groups the rollout ranks still hold, in the step record
        (``rollout/unfinished_groups``; their tokens in ``rollout/discarded_tokens``)."""
        left = self._carry_left()
        metrics[UNFINISHED] = left["groups"]
        metrics["rollout/discarded_tokens"] = (
            int(metrics.get("rollout/discarded_tokens") or 0) + left["tokens"]
        )

    def _carry_left(self) -> dict[str, int]:
        """``carry``: every rollout rank's groups held (and lost to a cancelled call) and
        their tokens, summed; the ranks forget them."""
        from rltrain.workers.rollout import RolloutWorker

        lefts = self.stages.g.need("rollout").call(RolloutWorker.carry_left).wait()
        return {k: sum(int(x[k]) for x in lefts) for k in ("groups", "tokens")}

    def end(self, done_steps: int, clean: bool) -> None:
        unread = self._unread() if self.pipeline.policy == "carry" and clean else None
        self.pipeline.reset(done_steps)  # an early stop drops generations ahead
        if unread is not None:
            # an early stop: the last record came before; summary.json counts these
            left = self._carry_left()
            self.left_at_end = {k: unread[k] + left[k] for k in left}
        super().end(done_steps, clean)

    def _unread(self) -> dict[str, int]:
        """``carry``: the groups (and tokens) of the generations submitted ahead that no step
        will train; waited for, not cancelled, so that none is lost uncounted."""
        out = {"groups": 0, "tokens": 0}
        for gen in self.pipeline.queue:
            for shard in gen.future.wait():
                if shard is not None:
                    out["groups"] += len(shard.response_mask) // max(shard.group_size, 1)
                    out["tokens"] += int(shard.response_mask.sum())
        return out

    def drain(self) -> None:
        """Wait for the generations in flight (benchmarks: a timed section ends idle)."""
        self.pipeline.drain()


def schedule_for(
    stages: StepStages,
    max_staleness: int,
    partial_rollout: str | None = None,
    sampler: str | None = None,
    carry: Mapping[str, int] | None = None,
) -> Any:
    """The schedule the run's layout calls for.

    Args:
        stages: the run's step stages.
        max_staleness: ``trainer.max_staleness`` (or a benchmark's override).
        partial_rollout: a benchmark's override of ``trainer.partial_rollout``.
        sampler: a benchmark's override of ``trainer.sampler``.
        carry: a benchmark's override of ``trainer.carry_surplus`` / ``carry_segment``.

    Returns:
        A :class:`FusedSchedule`, :class:`PipelinedSchedule` or :class:`TurnSchedule`.
    """
    if stages.fused:
        return FusedSchedule(stages)
    if max_staleness > 0:
        policy = partial_rollout or stages.run.trainer.partial_rollout
        return PipelinedSchedule(stages, max_staleness, policy, sampler, carry)
    return TurnSchedule(stages)


def _fused_keys(step: int, ranks: int) -> list[tuple[int, int]]:
    """The dispatcher's keys of a fused step's shards (one per rank)."""
    return [(step, rank) for rank in range(ranks)]


def _accuracy(accuracy: float | None) -> dict[str, Any]:
    """An evaluation's metrics: none when it scored no episode (every tool episode
    infra-failed), as a step's ``reward/*`` are then absent, not 0."""
    return {} if accuracy is None else {"eval/accuracy": accuracy}
