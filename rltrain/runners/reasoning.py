"""The reasoning driver: LLM policy, verifiable reward, GRPO-family updates.

:class:`ReasoningRunner` is a run on a started job: the loop around the steps (resume,
evaluation, checkpoints, SIGTERM: :func:`rltrain.runners.loop.fit`) and the summary. A step's
stages — generate, score, reference, inference, critic, update, weight export — are
:class:`~rltrain.runners.stages.ReasoningStages`; how a step takes them (fused ranks, components
taking turns, or an asynchronous generation pipeline) is a schedule
(:mod:`rltrain.runners.schedules`) chosen once from the run's layout.

Components that share a device take turns through the residency coordinator (``job.stage``).
Bulk data (rollout batches, weights) moves between workers as Ray object references: the driver
only passes references and receives small things (rewards for logging, metrics). Weights reach
the rollout (and the inference component) by the transport the plan chose
(:func:`~rltrain.placement.transport_choice.choose_transport`: object store, CUDA IPC, or a
bucketed broadcast), written into ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rltrain.config.schema import RunConfig
from rltrain.errors import WorkerError
from rltrain.kinds import registry
from rltrain.placement.micro_batches import adopt_micro_batches
from rltrain.runners import loop
from rltrain.runners.builders import component_builders
from rltrain.runners.checkpoint import (
    CheckpointManager,
    checkpoint_root,
    model_fingerprint,
    resume_state,
    save_state,
)
from rltrain.runners.job import Job, start_job
from rltrain.runners.layout import RunLayout, preflight
from rltrain.runners.schedules import schedule_for
from rltrain.runners.stages import ReasoningStages
from rltrain.telemetry.summary import generated_tokens, per_second, run_totals
from rltrain.workers.actor import ActorWorker
from rltrain.workers.critic import CriticWorker
from rltrain.workers.fused import FusedWorker
from rltrain.workers.rollout import RolloutWorker
from rltrain.workers.tools import pool_summary


def worker_builders(run: RunConfig, fused: bool = False) -> dict[str, Any]:
    """component -> (launched layout -> group builder): how each reasoning component is created.

    Fused (``placement.fuse``), the actor's processes run the rollout and the reward too and
    the other two groups are not started.
    """
    builders = component_builders(run, "reasoning")
    if fused:  # the components the generation calls (tool workers) start beside the fused ranks
        beside = {n: b for n, b in builders.items() if registry.component(n).serves_rollout}
        return {"actor": lambda layout: FusedWorker.create_group(run, layout.sizes), **beside}
    return builders


class ReasoningRunner:
    """A reasoning run on a started :class:`Job`: the loop's hooks (resume, save, evaluation,
    target, summary) around a schedule that drives the step's stages
    (:class:`~rltrain.runners.stages.ReasoningStages`).

    Args:
        job: the started job (its ``layout`` gives the sizes and whether the step is fused).
        max_staleness: overrides ``trainer.max_staleness`` (benchmarks compare both schedules
            on one job); ``None`` reads the config.
        partial_rollout: overrides ``trainer.partial_rollout`` (None: the config's).
        sampler: overrides ``trainer.sampler`` (None: the config's).
        carry: overrides ``trainer.carry_surplus`` / ``trainer.carry_segment``
            (``{"surplus": 2, "segment": 1}``; None: the config's).
    """

    def __init__(
        self,
        job: Job,
        max_staleness: int | None = None,
        partial_rollout: str | None = None,
        sampler: str | None = None,
        carry: Mapping[str, int] | None = None,
    ) -> None:
        self.job, self.run, self.layout = job, job.run, job.layout
        self.stages = ReasoningStages(job)
        self.sizes, self.g, self.task = self.stages.sizes, self.stages.g, self.stages.task
        self.fused, self.hub = self.stages.fused, self.stages.hub
        self.ckpt = CheckpointManager(checkpoint_root(self.run, job.run_dir))
        k = self.run.trainer.max_staleness if max_staleness is None else max_staleness
        self.schedule = schedule_for(self.stages, k, partial_rollout, sampler, carry)

    def fit(self) -> dict[str, Any]:
        """Train until ``trainer.total_steps`` (or the target accuracy, or a stop signal)."""
        return loop.fit(self, self.schedule, self.run, self.job.run_dir)

    def train_step(self, step: int, queue_next: bool = False) -> dict[str, Any]:
        """One policy update by the run's schedule; returns the step's metrics."""
        return self.schedule.step(step, queue_next)

    # ------------------------------------------------------------------------- the loop's hooks
    def resume(self) -> int:
        return resume_state(
            self.ckpt, self.run, model_fingerprint(self.run), "model settings", self._load
        )

    def _load(self, path: str) -> None:
        with self.job.stage("actor"):
            self.g.actor.call(ActorWorker.load, path).wait()
        if self.g.critic is not None:
            with self.job.stage("critic"):
                self.g.critic.call(CriticWorker.load, path).wait()

    def save(self, step: int) -> str:
        if self.schedule.has_queued():
            raise WorkerError(
                f"saving step {step} with a fused step queued on the ranks would see its "
                f"update: train that step first"
            )
        return save_state(self.ckpt, self.run, step, model_fingerprint(self.run), self._write)

    def _write(self, path: str) -> None:
        with self.job.stage("actor"):
            self.g.actor.call(ActorWorker.save, path).wait()  # every rank: ZeRO shards
        if self.g.critic is not None:
            with self.job.stage("critic"):
                self.g.critic.call(CriticWorker.save, path).wait()

    def evaluation_due(self, step: int, record: dict[str, Any]) -> bool:
        return loop.Cadence.of(self.run.trainer).every_eval(step)

    def target_reached(self, evaluated: dict[str, Any] | None) -> bool:
        target = self.run.trainer.target_accuracy
        accuracy = (evaluated or {}).get("eval/accuracy")
        return target is not None and accuracy is not None and accuracy >= target

    def summary(self, records, steps: int, seconds: float, status: str) -> dict[str, Any]:
        return {
            **loop.job_summary(self.job, records, steps, seconds, status),
            # over the same seconds as steps_per_s, not a mean of the steps' own rates
            "tokens_per_s": per_second(generated_tokens(records), seconds),
            "final_reward": records[-1].get("reward/mean") if records else None,
            "final_accuracy": next(
                (r["eval/accuracy"] for r in reversed(records) if "eval/accuracy" in r), None
            ),
            **rollout_totals(
                records,
                self.run.trainer.max_staleness,
                getattr(self.schedule, "left_at_end", None),
            ),
        }

    @property
    def version(self) -> int:
        """The newest weight version the receivers are handed (:attr:`WeightHub.version`)."""
        return self.stages.version

    @property
    def weights_ref(self) -> Any:
        """What the rollout is handed for the newest weights."""
        return self.stages.weights_ref


def rollout_totals(
    records: list[dict[str, Any]], max_staleness: int, left: dict[str, int] | None = None
) -> dict[str, Any]:
    """``summary.json``'s ``rollout`` entry: staleness and discarded work over the run
    (:func:`rltrain.telemetry.summary.run_totals`; ``left``: ``carry``'s groups buffered when
    an early stop ended the run); absent for a synchronous run."""
    totals = run_totals(records, max_staleness, left)
    return {"rollout": totals} if totals else {}


def weight_sync_summary(runner: ReasoningRunner) -> dict[str, Any]:
    """``summary.json``'s ``weight_sync``: each receiver's transport and why."""
    if runner.fused:
        return {
            "rollout": {
                "transport": "none",
                "reason": "placement.fuse: the rollout samples with the actor's own parameters",
            }
        }
    return {recv: choice.to_dict() for recv, choice in runner.hub.transports.items()}


def data_parallel(groups) -> None:
    """``start_job``'s ``on_launch``: the actor's process group and DDP, before any offload."""
    for name, cls in (("actor", ActorWorker), ("critic", CriticWorker)):
        if name in groups:
            groups[name].init_process_group()
            groups[name].call(cls.setup_data_parallel).wait()


def attach_tools(groups) -> None:
    """Hand the tool pool's actors to the processes that generate (the rollout's, or the fused
    ranks'), which send their episodes' tool calls to them."""
    tools = groups.get("tools")
    if tools is None:
        return
    if "rollout" in groups:
        groups["rollout"].call(RolloutWorker.use_tools, tools.actors).wait()
    else:
        groups["actor"].call(FusedWorker.use_tools, tools.actors).wait()


def on_launch(groups) -> None:
    """``start_job``'s ``on_launch``: data parallelism, then the tool pool's handles."""
    data_parallel(groups)
    attach_tools(groups)


def run_reasoning(run: RunConfig, run_dir: str, layout: RunLayout | None = None) -> dict[str, Any]:
    """Start, train and tear down a reasoning run.

    Args:
        run: the checked run config.
        run_dir: the run's output directory.
        layout: the layout checked before Ray started (:func:`preflight`); None checks it here.

    Returns:
        The job summary (also written to ``summary.json``).

    Raises:
        ConfigError / PlacementError / ResourceError: before Ray starts, for bad input; the
            launched job's layout differing from the checked one.
    """
    layout = layout if layout is not None else preflight(run)
    run = adopt_micro_batches(run, layout.run)  # the sizes the plan chose
    builders = worker_builders(run, layout.fused)
    with start_job(run, run_dir, builders, layout, on_launch=on_launch) as job:
        runner = ReasoningRunner(job)
        summary = runner.fit()
        if "tools" in job.groups:  # which worker served how many of the episodes' steps
            summary["tool_pool"] = pool_summary(job.groups["tools"])
        job.verify_ledger()
        summary.update(job.write_timeline())
    summary["weight_sync"] = weight_sync_summary(runner)
    summary["fused"] = layout.fused
    if layout.fuse_blockers:  # only placement.fuse=auto gets here with any: why it took turns
        summary["fuse_blockers"] = list(layout.fuse_blockers)
    return summary
