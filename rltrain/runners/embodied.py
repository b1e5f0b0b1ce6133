"""The embodied driver loop: simulators and policy pipelined through channels, then PPO + GAE.

One policy update, as the algorithm reads:

    env + rollout: a rollout epoch, pipelined     env stage s+1 steps while rollout infers stage s
                                                  (observations -> obs channel -> rollout,
                                                   actions -> act channel -> env)
    actor        : values, GAE, clipped PPO epochs (data-parallel)
    actor        : export the new weights         (the rollout loads them next epoch)
    evaluate (greedy episodes) / log / checkpoint

Env and rollout hold their leases together during the epoch (they run at the same time); the
actor's lease follows, so in the hybrid layout env and rollout leave the devices the actor trains
on, as their offload policies say. The driver passes object references only: the env workers'
transitions go from their object store to the actor, never through the driver.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from rltrain.config.schema import AlgorithmConfig, RunConfig
from rltrain.config.seeds import eval_episode_seed
from rltrain.errors import ConfigError, WorkerError
from rltrain.placement.micro_batches import adopt_micro_batches
from rltrain.runners import loop
from rltrain.runners.checkpoint import CheckpointManager, checkpoint_root, resume_state, save_state
from rltrain.runners.job import Job, start_job
from rltrain.runners.loop import StepTimer
from rltrain.runners.weight_hub import WeightHub
from rltrain.telemetry import trace
from rltrain.telemetry.metrics import read_metrics
from rltrain.workers.embodied import EmbodiedActorWorker, EmbodiedRolloutWorker
from rltrain.workers.env import EnvWorker, SpaceSpec, stage_to_rollout

REQUIRED = ("actor", "rollout", "env")


@dataclass(frozen=True)
class EmbodiedSizes:
    """Sizes derived once from the config and the plan (never mutated afterwards).

    Attributes:
        env_world: env processes.
        rollout_world: rollout processes.
        actor_world: actor (data-parallel) processes.
        stages: pipeline stages per env process (``env.pipeline_stage_num``).
        envs_per_stage: sub-environments per stage (``m``).
        steps: steps per environment per epoch (``env.rollout_steps``).
        items_per_rollout: observation items each rollout rank serves per epoch.
    """

    env_world: int
    rollout_world: int
    actor_world: int
    stages: int
    envs_per_stage: int
    steps: int
    items_per_rollout: tuple[int, ...]

    @property
    def env_steps_per_epoch(self) -> int:
        return self.env_world * self.stages * self.envs_per_stage * self.steps


def derive_sizes(
    run: RunConfig, env_world: int, rollout_world: int, actor_world: int
) -> EmbodiedSizes:
    """Check the embodied sizes against the process counts and derive :class:`EmbodiedSizes`.

    Raises:
        ConfigError: naming the keys whose values do not divide, with the nearest valid ones.
    """
    e, a = run.env, run.algorithm
    per_proc = env_world * e.pipeline_stage_num
    problems = []
    if e.num_envs % per_proc:
        ok = max(per_proc, e.num_envs // per_proc * per_proc)
        problems.append(
            f"env.num_envs={e.num_envs} is not divisible by env processes ({env_world}, from "
            f"placement.component_placement.env) x env.pipeline_stage_num="
            f"{e.pipeline_stage_num} = {per_proc}: use env.num_envs={ok} or change the others"
        )
    rows, parts = e.num_envs * e.rollout_steps, a.num_minibatches * actor_world
    if rows % parts:
        problems.append(
            f"env.num_envs x env.rollout_steps = {rows} transitions do not split into "
            f"algorithm.num_minibatches={a.num_minibatches} x actor processes ({actor_world}) "
            f"= {parts} equal parts: change env.rollout_steps or algorithm.num_minibatches"
        )
    if problems:
        raise ConfigError(problems)
    items = [0] * rollout_world
    for rank in range(env_world):
        for s in range(e.pipeline_stage_num):
            items[stage_to_rollout(rank, s, e.pipeline_stage_num, rollout_world)] += 1
    return EmbodiedSizes(
        env_world=env_world,
        rollout_world=rollout_world,
        actor_world=actor_world,
        stages=e.pipeline_stage_num,
        envs_per_stage=e.num_envs // per_proc,
        steps=e.rollout_steps,
        items_per_rollout=tuple(n * e.rollout_steps for n in items),
    )


def check_components(run: RunConfig, components: set[str]) -> None:
    """Refuse a placement or algorithm the embodied runner cannot run, before Ray starts."""
    missing = [c for c in REQUIRED if c not in components]
    extra = sorted(components - set(REQUIRED))
    problems = []
    if missing:
        problems.append(
            f"placement.component_placement places no {missing} but runner=embodied needs "
            f"{list(REQUIRED)}: use an experiment preset such as experiment=cartpole_hybrid"
        )
    if extra:
        problems.append(
            f"placement.component_placement places {extra}, which runner=embodied does not use "
            f"(the value function lives in the actor; rewards come from the simulator): remove "
            f"them"
        )
    if run.algorithm.advantage_estimator != "gae":
        problems.append(
            f"algorithm.advantage_estimator={run.algorithm.advantage_estimator!r} with "
            f"runner=embodied: the embodied actor trains PPO with GAE, set it to 'gae'"
        )
    if run.algorithm.policy_loss != AlgorithmConfig.policy_loss:
        problems.append(
            f"algorithm.policy_loss={run.algorithm.policy_loss!r} with runner=embodied: the "
            f"embodied actor trains PPO's clipped surrogate on actions (its own loss, with the "
            f"value and entropy terms); leave algorithm.policy_loss="
            f"{AlgorithmConfig.policy_loss!r}"
        )
    if run.algorithm.kl_coef > 0:
        problems.append("algorithm.kl_coef must be 0 with runner=embodied (no reference policy)")
    if problems:
        raise ConfigError(problems)


class EnvPipelineSchedule:
    """The embodied step: env and rollout exchange observations and actions through channels
    in pipeline stages for a rollout epoch, then the actor trains (PPO + GAE) and exports.

    Args:
        runner: the run whose groups take the step.
    """

    queues_ahead = False

    def __init__(self, runner: EmbodiedRunner) -> None:
        self.runner = runner

    def begin(self, start: int, horizon: int | None) -> None:
        self.runner.export_weights(start)  # the rollout starts from the actor's weights

    def step(self, step: int, queue_next: bool) -> dict[str, Any]:
        return self.runner.train_step(step)

    def has_queued(self) -> bool:
        return False

    def evaluate(self, step: int) -> dict[str, Any]:
        return {f"eval/{k}": v for k, v in self.runner.evaluate(step).items()}

    def end(self, done_steps: int, clean: bool) -> None:
        """Nothing runs ahead of the loop."""


class EmbodiedRunner:
    """Runs the loop above on a started :class:`Job`."""

    def __init__(self, job: Job) -> None:
        self.job, self.run = job, job.run
        self.sizes: EmbodiedSizes = job.layout.sizes
        self.spec: SpaceSpec = job.layout.spec
        self.g = job.groups
        from rltrain.scheduler import Channel

        tag = uuid.uuid4().hex[:8]
        # Each rollout key holds at most one item per stage it serves; each action key one.
        most = max(n // self.sizes.steps for n in self.sizes.items_per_rollout)
        self.obs = Channel.create(f"embodied-obs-{tag}", max(most, 1), job.cluster)
        self.act = Channel.create(f"embodied-act-{tag}", 1, job.cluster)
        self.ckpt = CheckpointManager(checkpoint_root(self.run, job.run_dir))
        # the version the rollout is handed and its host buckets (actor rank 0 packs them)
        groups = SimpleNamespace(actor=self.g["actor"], receiver=lambda r: self.g.get(r))
        self.hub = WeightHub.host_only(job, groups, EmbodiedActorWorker, EmbodiedRolloutWorker)
        self.schedule = EnvPipelineSchedule(self)
        # the evaluation gate (:func:`evaluation_gate`); a resumed run reopens it from the
        # training returns its metrics.jsonl kept (:meth:`resume`)
        self.gate_open = False

    def fit(self) -> dict[str, Any]:
        """Train until ``trainer.total_steps``, the target return, the time budget or SIGTERM."""
        return loop.fit(self, self.schedule, self.run, self.job.run_dir)

    # ------------------------------------------------------------------------- the loop's hooks
    def evaluation_due(self, step: int, record: dict[str, Any]) -> bool:
        return self._eval_due(step, record)

    def target_reached(self, evaluated: dict[str, Any] | None) -> bool:
        target = self.run.env.target_return
        return (
            target is not None and evaluated is not None and evaluated["eval/return_mean"] >= target
        )

    def _eval_due(self, step: int, record: dict[str, Any]) -> bool:
        """Every ``trainer.eval_every`` updates once the gate is open (:func:`evaluation_gate`)."""
        due, self.gate_open = evaluation_gate(
            step,
            self.run.trainer.eval_every,
            self.run.env.target_return,
            record.get("env/return_mean"),
            self.gate_open,
        )
        return due

    def train_step(self, step: int) -> dict[str, Any]:
        """One rollout epoch and one PPO update; returns the step's metrics."""
        timer, g, s = StepTimer(), self.g, self.sizes
        with timer("generate"), self._leases("env", "rollout"), trace.span("generate", "driver"):
            serving = g["rollout"].call_each(
                EmbodiedRolloutWorker.serve,
                [(self.obs, self.act, n, step, self.weights_ref) for n in s.items_per_rollout],
            )
            epochs = g["env"].call(EnvWorker.collect, self.obs, self.act, s.steps)
            results, served = _wait_all(epochs, serving)
        stale = sorted({v for r in results for v in r.versions} - {self.version})
        if stale:
            raise WorkerError(
                f"env epoch {step} holds actions of weight versions {stale}, expected only "
                f"{self.version}: a rollout rank did not load the exported weights"
            )
        trained = self._train_and_export(step, [r.rollout[0] for r in results], timer)
        return self._step_metrics(results, served, trained, timer.times)

    def _train_and_export(self, step: int, refs: list[Any], timer: StepTimer) -> list[Any]:
        """The actor's update on the epoch's transitions ``refs``, then the export of version
        ``step + 1``, both in the actor's lease (the export reads its resident weights).

        Returns:
            Each actor rank's ``TrainResult``.
        """
        # The sync runs in the actor's lease but is timed apart from train: the stage times add
        # up to time/step_s. Train's time starts before the lease, whose entry waits for the
        # offloads (the rollout's, the env's) it needs.
        with ExitStack() as actor_lease:
            with timer("train"):
                actor_lease.enter_context(self.job.stage("actor"))
                trained = self.g["actor"].call(EmbodiedActorWorker.train, refs, step).wait()
                for rank, r in enumerate(trained):
                    self.job.refresh_ledger("actor", r.state_bytes, rank)
            with timer("sync"):
                self.export_weights(step + 1, lease=False)
                actor_lease.close()  # the lease's end is in a stage too
        return trained

    @contextmanager
    def _leases(self, *components: str):
        # Env and rollout run at the same time: both hold their devices for the whole epoch.
        with ExitStack() as stack:
            for c in components:
                stack.enter_context(self.job.stage(c))
            yield

    @property
    def version(self) -> int:
        """The weight version the rollout is handed (:attr:`WeightHub.version`)."""
        return self.hub.version

    @property
    def weights_ref(self) -> Any:
        """The host buckets of that version (an object ref, resolved by Ray as an argument)."""
        return self.hub.handed_to("rollout")

    def export_weights(self, version: int, lease: bool = True) -> None:
        """Hand the rollout the actor's weights as ``version`` (:meth:`WeightHub.export`)."""
        self.hub.export(version, lease=lease)

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy episodes with the current weights on rollout rank 0."""
        with self.job.stage("rollout"):
            return (
                self.g["rollout"]
                .execute_on(0)
                .call(
                    EmbodiedRolloutWorker.evaluate,
                    self.weights_ref,
                    self.run.env.eval_episodes,
                    eval_episode_seed(self.run.seed, step, self.run.env.eval_episodes),
                )
                .wait()[0]
            )

    # ------------------------------------------------------------------------- checkpoints
    def save(self, step: int) -> str:
        """Write a checkpoint of the state after ``step`` updates."""
        return save_state(self.ckpt, self.run, step, _fingerprint(self.run, self.spec), self._write)

    def _write(self, path: str) -> None:
        with self.job.stage("actor"):
            self.g["actor"].execute_on(0).call(EmbodiedActorWorker.save, path).wait()

    def resume(self) -> int:
        """Load ``trainer.resume``'s checkpoint; returns the update to start from.

        The evaluation gate opens as it was: when an update before the checkpoint reached it
        (read from ``metrics.jsonl``), so a resumed run evaluates where the uninterrupted one
        would.
        """
        fingerprint = _fingerprint(self.run, self.spec)
        start = resume_state(self.ckpt, self.run, fingerprint, "task.env_id and model", self._load)
        self.gate_open = start > 0 and gate_reached(
            os.path.join(self.job.run_dir, "metrics.jsonl"), start, self.run.env.target_return
        )
        return start

    def _load(self, path: str) -> None:
        with self.job.stage("actor"):
            self.g["actor"].call(EmbodiedActorWorker.load, path).wait()

    # ---------------------------------------------------------------------------- metrics
    def _step_metrics(self, results, served, trained, times) -> dict[str, Any]:
        returns = [x for r in results for x in r.episode_returns]
        lengths = [x for r in results for x in r.episode_lengths]
        out: dict[str, Any] = {
            "env/episodes": len(returns),
            "time/env_step_s": max(r.step_s for r in results),
            "time/infer_s": max(x["infer_s"] for x in served),
        }
        keys = {k for res in trained for k in res.metrics}
        for k in sorted(keys):
            out[k] = sum(res.metrics[k] for res in trained) / len(trained)
        out.update({f"time/{k}_s": v for k, v in times.items()})
        total = sum(times.values())
        out["time/step_s"] = total
        steps = self.sizes.env_steps_per_epoch
        out["perf/env_steps_per_s"] = steps / total if total else None
        out["perf/rollout_env_steps_per_s"] = steps / times["generate"]
        if returns:  # an epoch in which no episode ended has no mean: the keys are absent
            out["env/return_mean"] = sum(returns) / len(returns)
            out["env/length_mean"] = sum(lengths) / len(lengths)
            # Mean returns are what a reward curve plots for an embodied run.
            out["reward/mean"] = out["env/return_mean"]
        return out

    def summary(self, records, steps: int, seconds: float, status: str) -> dict[str, Any]:
        env_steps = steps * self.sizes.env_steps_per_epoch
        return {
            **loop.job_summary(self.job, records, steps, seconds, status),
            **_own_fields(records, self.spec.env_id),
            "env_steps_per_s": env_steps / seconds if seconds else None,
        }


def _own_fields(records: list[Mapping[str, Any]], env_id: str) -> dict[str, Any]:
    """The embodied summary's fields read from the step records: the stage means (the three
    stages always, an epoch with none of them timed included; not ``env_step`` and ``infer``,
    parts of ``generate``), the last training and evaluation returns, the simulator."""
    evals = [r["eval/return_mean"] for r in records if r.get("eval/return_mean") is not None]
    returns = [r["env/return_mean"] for r in records if r.get("env/return_mean") is not None]
    stages = loop.stage_means([dict(r) for r in records], {"generate", "train", "sync"})
    return {
        "seconds_per_stage": stages,
        "final_reward": returns[-1] if returns else None,
        "final_return": evals[-1] if evals else None,
        "final_accuracy": None,
        "env_id": env_id,
    }


def ended_fields(
    run: Any, records: list[Mapping[str, Any]], summary: Mapping[str, Any]
) -> dict[str, Any]:
    """The embodied fields of the summary of a run that ended with an exception
    (:func:`rltrain.app.ended_summary`), as :meth:`EmbodiedRunner.summary` writes them for a
    finished run, over the steps this invocation finished.

    Args:
        run: the checked run config.
        records: this invocation's step records.
        summary: the shared fields so far (``steps_per_s`` over those steps among them).

    Returns:
        ``seconds_per_stage``, ``env_steps_per_s`` (a step's simulator steps, read back from
        its record's ``perf/env_steps_per_s`` times ``time/step_s``, at the summary's
        ``steps_per_s``), ``final_reward``, ``final_return``, ``final_accuracy`` and ``env_id``.
    """
    per_step = next(
        (
            r["perf/env_steps_per_s"] * r["time/step_s"]
            for r in reversed(records)
            if r.get("perf/env_steps_per_s") and r.get("time/step_s")
        ),
        None,
    )
    rate = summary.get("steps_per_s")
    fields = _own_fields(records, run.task.env_id)
    fields["env_steps_per_s"] = round(per_step) * rate if per_step and rate else None
    return fields


def evaluation_gate(
    step: int, every: int, target: float | None, train_return: float | None, opened: bool
) -> tuple[bool, bool]:
    """Whether to evaluate after update ``step``, and whether the gate is open from now on.

    Evaluations fall every ``trainer.eval_every`` updates once the training return has reached
    half of a positive ``env.target_return``: before, an evaluation could not stop the run, so
    it is skipped. Once reached, the gate stays open, also through epochs with a lower return
    or with no episode ended. With no target, or one <= 0 (half of a negative target lies above
    it), the gate is open from the start. (The loop also evaluates the update a run stops at.)

    Args:
        step: the update just taken (0-based).
        every: ``trainer.eval_every`` (0: never).
        target: ``env.target_return``.
        train_return: the update's ``env/return_mean``; None when no training episode ended.
        opened: whether the gate was open before this update.

    Returns:
        ``(due, opened)``: whether an evaluation falls after ``step``, and the gate after it.
    """
    if target is None or target <= 0 or (train_return is not None and train_return >= target / 2):
        opened = True
    return bool(every) and (step + 1) % every == 0 and opened, opened


def gate_reached(path: str, start: int, target: float | None) -> bool:
    """Whether an update before ``start`` opened the evaluation gate (:func:`evaluation_gate`):
    its training return reached half of a positive ``target``.

    Args:
        path: the run's ``metrics.jsonl`` (missing: ``logging.jsonl=false``, not reached).
        start: the update the resumed run starts from.
        target: ``env.target_return``.

    Returns:
        Whether the gate was open at ``start``.
    """
    if target is None or target <= 0 or not os.path.exists(path):
        return False  # no target: evaluation_gate opens it at once anyway
    returns = (r.get("env/return_mean") for r in read_metrics(path) if r.get("step", -1) < start)
    return any(x is not None and x >= target / 2 for x in returns)


@dataclass(frozen=True)
class Overlap:
    """How much of a run the simulators and the policy were busy at the same time.

    Attributes:
        env_busy_s: seconds some env process was inside an ``env_step`` span.
        rollout_busy_s: seconds some rollout process was inside a ``generate`` span.
        both_s: seconds both were busy at once.
    """

    env_busy_s: float
    rollout_busy_s: float
    both_s: float

    @property
    def fraction(self) -> float:
        """Share of the shorter busy time that overlapped the other (0: strictly sequential)."""
        least = min(self.env_busy_s, self.rollout_busy_s)
        return self.both_s / least if least > 0 else 0.0


def pipeline_overlap(trace_doc: Any) -> Overlap:
    """Env/rollout overlap from a run's timeline (spans or a Chrome-trace document).

    Only process lanes count (a span on a device lane is the same span again).
    """
    from rltrain.telemetry.timeline import covered, intervals, merge

    def busy(component: str, name: str) -> list[tuple[float, float]]:
        return merge(
            (i.start_us, i.end_us)
            for i in intervals(trace_doc)
            if i.lane_kind == "process" and i.lane.startswith(f"{component}[") and i.name == name
        )

    env, pol = busy("env", "env_step"), busy("rollout", "generate")
    both, j = 0.0, 0
    for lo, hi in env:
        while j < len(pol) and pol[j][1] <= lo:
            j += 1
        k = j
        while k < len(pol) and pol[k][0] < hi:
            both += min(hi, pol[k][1]) - max(lo, pol[k][0])
            k += 1
    return Overlap(covered(env) / 1e6, covered(pol) / 1e6, both / 1e6)


def _wait_all(*futures: Any) -> list[Any]:
    """Wait for several group calls that feed each other, failing as soon as any rank fails.

    Waiting on one group first would leave its partner's failure unnoticed until the channel
    timeout: env and rollout block on each other's items.
    """
    import ray

    owner = {ref: f for f in futures for ref in f.refs}
    pending = list(owner)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except ray.exceptions.RayError:
            owner[ready[0]].wait()  # raises the group's WorkerError and tears it down
    return [f.wait() for f in futures]


def _fingerprint(run: RunConfig, spec: SpaceSpec) -> str:
    m = run.model
    return f"mlp-{spec.env_id}-h{m.hidden_size}-l{m.num_layers}"


def run_embodied(run: RunConfig, run_dir: str, layout: Any = None) -> dict[str, Any]:
    """Start, train and tear down an embodied run.

    Args:
        run: the checked run config.
        run_dir: the run's output directory.
        layout: the layout checked before Ray started
            (:func:`~rltrain.runners.layout.preflight`); None checks it here.

    Returns:
        The job summary (``env_steps_per_s`` and ``final_return`` among the fields).

    Raises:
        ConfigError / PlacementError / ResourceError: before Ray starts, for bad input; the
            launched job's layout differing from the checked one.
    """
    from rltrain.runners.layout import preflight

    layout = layout if layout is not None else preflight(run)
    run = adopt_micro_batches(run, layout.run)  # the sizes the plan chose
    builders = {
        "actor": lambda lay: EmbodiedActorWorker.create_group(run, lay.spec),
        "rollout": lambda lay: EmbodiedRolloutWorker.create_group(run, lay.spec),
        "env": lambda lay: EnvWorker.create_group(
            run, lay.spec, lay.sizes.envs_per_stage, lay.sizes.rollout_world
        ),
    }

    def data_parallel(groups) -> None:
        if groups["actor"].world_size > 1:
            groups["actor"].init_process_group()
        groups["actor"].call(EmbodiedActorWorker.setup_data_parallel).wait()

    with start_job(run, run_dir, builders, layout, on_launch=data_parallel) as job:
        summary = EmbodiedRunner(job).fit()
        job.verify_ledger()
        summary.update(job.write_timeline())
    return summary
