"""The reasoning driver loop: LLM policy, verifiable reward, GRPO-family updates.

One step, as the algorithm reads:

    prompts  = task batch for the step
    rollout  : generate n responses per prompt      (with the latest weights)
    reward   : score them                           (rule function)
    reference: log-probs for the KL                 (only when algorithm.kl_coef > 0)
    inference: the batch's log-probs, current policy (only when an inference component is placed)
    critic   : values, then its own update          (PPO: algorithm.advantage_estimator=gae)
    actor    : advantages, clipped-surrogate update (data-parallel)
    actor    : export the new weights               (the rollout loads them next step)
    evaluate / log / checkpoint

Components that share a device take turns through the residency coordinator (``job.stage``).
Bulk data (rollout batches, weights) moves between workers as Ray object references: the driver
only passes references and receives small things (rewards for logging, metrics). Weights reach
the rollout (and the inference component) by the transport the plan chose
(:func:`~rltrain.backends.weight_sync.choice.choose_transport`: object store, CUDA IPC, or a
bucketed broadcast), written into ``summary.json``.

Fused (``placement.fuse``, :mod:`rltrain.runners.fusion`), one process per device runs actor,
rollout and rule reward: a step is one call per rank that generates, scores and trains on that
rank's prompts with the rank's own parameters, so there is no weight export or sync.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any

from rltrain.backends.weight_sync.choice import TransportChoice, choose_transport
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, WorkerError
from rltrain.runners.checkpoint import CheckpointManager, read_state
from rltrain.runners.fusion import decide_fusion
from rltrain.runners.job import Job, start_job
from rltrain.runners.pipeline import GenerationPipeline, InFlight  # noqa: F401 (re-exported)
from rltrain.runners.sizes import BatchSizes, derive_sizes
from rltrain.tasks import build_task, build_tokenizer
from rltrain.telemetry import trace
from rltrain.telemetry.metrics import MetricsLogger, plot_curves
from rltrain.workers.actor import ActorWorker
from rltrain.workers.critic import CriticWorker, derive_critic_sizes
from rltrain.workers.hybrid import HybridWorker
from rltrain.workers.inference import InferenceWorker
from rltrain.workers.reference import ReferenceWorker, gather_round_robin
from rltrain.workers.reward import RewardModelWorker, RewardWorker
from rltrain.workers.rollout import RolloutWorker

REQUIRED = ("actor", "rollout", "reward")

#: Components that take the actor's weight versions.
RECEIVERS = ("rollout", "inference")


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


def check_components(run: RunConfig, components: set[str]) -> None:
    """Refuse a placement that lacks a component the algorithm needs, before Ray starts."""
    need = list(REQUIRED)
    if run.algorithm.kl_coef > 0:
        need.append("reference")
    missing = [c for c in need if c not in components]
    if missing:
        raise ConfigError(
            f"placement.component_placement places no {missing} but runner=reasoning with "
            f"algorithm.kl_coef={run.algorithm.kl_coef} needs {need}: add them to the placement"
            + (" (the reference computes the KL's log-probs)" if "reference" in missing else "")
        )
    gae = run.algorithm.advantage_estimator == "gae"
    if gae and "critic" not in components:
        raise ConfigError(
            f"placement.component_placement places {sorted(components)} but "
            f"algorithm.advantage_estimator='gae' (PPO) needs a critic: use experiment="
            f"reasoning_ppo (or reasoning_ppo_hybrid / reasoning_ppo_disaggregated), or add "
            f"+placement.component_placement.critic=all"
        )
    if "critic" in components and not gae:
        raise ConfigError(
            f"placement.component_placement places a critic but algorithm.advantage_estimator="
            f"{run.algorithm.advantage_estimator!r} does not use one: remove it from the "
            f"placement, or use algorithm=ppo (gae)"
        )
    from rltrain.backends.training import check_training_backend

    check_training_backend(run)  # actor.backend=deepspeed: DeepSpeed's limits, before Ray


def check_engines(run: RunConfig, plan: Any) -> None:
    """Refuse, before Ray starts, engine settings this plan cannot serve.

    - a reward model placed on more than one process (one process scores the step);
    - ``rollout.gpu_memory_utilization`` against the plan's devices (vLLM);
    - an explicit ``weight_sync.transport`` the layout cannot serve, when the plan's devices
      are what the run will get (a joined cluster's devices, and a local GPU machine's, are
      found when Ray starts, and the choice is checked then).

    Raises:
        ConfigError: naming the key, the value and the fix.
    """
    if run.reward.kind == "model" and plan.world_size("reward") > 1:
        raise ConfigError(
            f"reward.kind='model' is placed on {plan.world_size('reward')} processes, but one "
            f"process scores a step: place the reward on one device or node "
            f"(placement.component_placement.reward=0)"
        )
    if run.rollout.backend == "vllm":
        from rltrain.backends.vllm_rollout import check_vllm_memory
        from rltrain.placement import memory as mem

        dims = mem.model_dims(run.model)
        check_vllm_memory(run, plan, mem.weight_bytes(mem.param_count(dims), dims.dtype))
    from rltrain.config.engine_checks import local_gpus_visible

    simulated = any(n.accelerator_type == "sim" for n in plan.cluster.nodes)
    # Simulated devices in the config-made plan are what the run gets only on a local Ray of a
    # machine without GPUs; a joined cluster, or local GPUs, is discovered when Ray starts.
    if not simulated or (run.cluster.address is None and not local_gpus_visible()):
        for recv in RECEIVERS:
            choose_transport(run, plan, recv)


def check_staleness(run: RunConfig, plan: Any) -> None:
    """Refuse asynchronous rollout where rollout and actor share a device, before Ray starts.

    On a shared device the two take turns (residency leases), so there is nothing to overlap
    and the rollout would sample with stale weights for no gain.

    Raises:
        ConfigError: ``trainer.max_staleness > 0`` with a device holding both.
    """
    k = run.trainer.max_staleness
    if k <= 0:
        return
    shared = sorted(d for d, comps in plan.sharing.items() if {"actor", "rollout"} <= set(comps))
    if shared:
        mode = getattr(plan.mode, "value", plan.mode)
        raise ConfigError(
            f"trainer.max_staleness={k} needs rollout and actor on separate devices, but "
            f"placement (mode {mode}) puts both on (node, device) {shared}: use "
            f"placement=disaggregated (or give placement.component_placement.actor and .rollout "
            f"disjoint devices), or set trainer.max_staleness=0; a {mode} layout stays "
            f"synchronous"
        )


def worker_builders(run: RunConfig, sizes: BatchSizes, fused: bool = False) -> dict[str, Any]:
    """component -> (plan -> group builder): how each reasoning component is created.

    Fused (``placement.fuse``), the actor's processes run the rollout and the reward too and
    the other two groups are not started.
    """
    if fused:
        return {"actor": lambda plan: HybridWorker.create_group(run, sizes)}
    reward = RewardModelWorker if run.reward.kind == "model" else RewardWorker
    builders = {
        "actor": lambda plan: ActorWorker.create_group(run, sizes),
        "rollout": lambda plan: RolloutWorker.create_group(run),
        "reward": lambda plan: reward.create_group(run),
        # placed (disaggregated layouts): recomputes the step's log-probs on its own devices
        "inference": lambda plan: InferenceWorker.create_group(run),
    }
    if run.algorithm.kl_coef > 0:
        builders["reference"] = lambda plan: ReferenceWorker.create_group(run)
    if run.algorithm.advantage_estimator == "gae":
        builders["critic"] = lambda plan: CriticWorker.create_group(run, sizes.samples_per_step)
    return builders


class ReasoningRunner:
    """Runs the loop above on a started :class:`Job`.

    Args:
        job: the started job.
        sizes: the derived batch sizes.
        max_staleness: overrides ``trainer.max_staleness`` (benchmarks compare both schedules
            on one job); ``None`` reads the config.
    """

    def __init__(self, job: Job, sizes: BatchSizes, max_staleness: int | None = None) -> None:
        self.job, self.run, self.sizes = job, job.run, sizes
        self.g = job.groups
        self.task = build_task(self.run.task, build_tokenizer(self.run.model))
        self.ckpt = CheckpointManager(
            self.run.trainer.checkpoint_dir or f"{job.run_dir}/checkpoints"
        )
        self.version = 0  # weights the rollout holds; bumped by every update
        self.fused = "rollout" not in self.g  # placement.fuse: the actor ranks do every stage
        # What each receiver is handed for the newest version (see _handed).
        self.weights: dict[str, Any] = {}
        self.transports = {} if self.fused else self._setup_weight_sync()
        self._queued: tuple[int, Any] | None = None  # fused: (step, call) submitted ahead
        self._stop = False
        k = self.run.trainer.max_staleness if max_staleness is None else max_staleness
        partial = self.run.trainer.partial_rollout
        self.pipeline = GenerationPipeline(self, k, partial) if k > 0 else None

    def fit(self) -> dict[str, Any]:
        """Train until ``trainer.total_steps`` (or the target accuracy, or a stop signal)."""
        t = self.run.trainer
        start = self._resume()
        metrics = MetricsLogger(self.job.run_dir, self.run.logging, resume=start > 0)
        self._export_weights(start)  # the rollout starts from the actor's weights
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        accuracy, done_steps, status, t0 = None, start, "completed", time.monotonic()
        if self.pipeline is not None:
            self.pipeline.reset(start, horizon=t.total_steps)
        try:
            for step in range(start, t.total_steps):
                record = self.train_step(step, queue_next=self._may_queue_next(step, t0))
                last = step + 1 == t.total_steps
                if (t.eval_every and (step + 1) % t.eval_every == 0) or last:
                    accuracy = record["eval/accuracy"] = self.evaluate()
                metrics.progress(step + 1, t.total_steps, metrics.log(step, record))
                done_steps = step + 1
                done = t.target_accuracy is not None and (accuracy or 0) >= t.target_accuracy
                budget = t.time_budget_s is not None and time.monotonic() - t0 > t.time_budget_s
                if (done or budget or self._stop) and self._queued is not None:
                    continue  # the next step already runs on the fused ranks: record it, then stop
                if (
                    (t.save_every and (step + 1) % t.save_every == 0)
                    or last
                    or done
                    or budget
                    or self._stop
                ):
                    self.save(step + 1)
                if done or budget or self._stop:
                    status = "stopped" if self._stop else "completed"
                    break
        finally:
            signal.signal(signal.SIGTERM, previous)
            metrics.close()
            if self.pipeline is not None:
                self.pipeline.reset(done_steps)  # an early stop drops generations ahead
        self._finish_weight_sync()
        plot_curves(metrics.records, f"{self.job.run_dir}/reward_curve.png")
        return self._summary(metrics.records, done_steps - start, time.monotonic() - t0, status)

    # ------------------------------------------------------------------------- weight sync
    @property
    def weights_ref(self) -> Any:
        """What the rollout is handed for the newest weights (host buckets' object ref, IPC
        payloads by actor rank, or a collective version marker)."""
        return self.weights.get("rollout")

    def _setup_weight_sync(self) -> dict[str, TransportChoice]:
        """Choose each receiver's transport from the job's plan, tell both ends, and build the
        broadcast groups of the collective transport."""
        choices = {
            r: choose_transport(self.run, self.job.plan, r) for r in RECEIVERS if r in self.g
        }
        self.g["actor"].call(ActorWorker.setup_weight_sync, choices).wait()
        for recv, choice in choices.items():
            members = self.g[recv].call(RolloutWorker.setup_weight_sync, choice).wait()
            if choice.name == "collective":
                self._join_broadcast_groups(recv, choice, members)
        return choices

    def _join_broadcast_groups(
        self, recv: str, choice: TransportChoice, members: list[int]
    ) -> None:
        """One group per source actor rank: the source (rank 0) and the receivers it feeds
        (a vLLM receiver brings one member per tensor-parallel worker)."""
        timeout = self.run.cluster.collective_timeout_s
        actor, receivers = self.g["actor"], self.g[recv]
        self.job.cluster.link(actor.name, receivers.name)  # a failure tears down both ends
        pending = []
        for src in choice.sources:
            ranks = choice.receivers_of(src)
            world = 1 + sum(members[r] for r in ranks)
            host, port = actor.execute_on(src).call(ActorWorker.open_weight_sync).wait()[0]
            pending.append(
                actor.execute_on(src).call(
                    ActorWorker.join_weight_sync, recv, host, port, world, timeout
                )
            )
            first = 1
            for r in ranks:
                pending.append(
                    receivers.execute_on(r).call(
                        RolloutWorker.join_weight_sync,
                        choice.backend or "gloo",
                        host,
                        port,
                        world,
                        first,
                        timeout,
                    )
                )
                first += members[r]
        for f in pending:
            f.wait(timeout + 30)

    def _submit_exports(self, version: int) -> dict[str, Any]:
        """Queue the export of ``version`` for every receiver on its source actor ranks (behind
        whatever those ranks run now); :meth:`_handed` turns the answers into what the
        receivers are handed. Receivers on the object store share one export."""
        out: dict[str, Any] = {}
        host_future = None
        for recv, choice in self.transports.items():
            if choice.name == "host" and host_future is not None:
                out[recv] = host_future
                continue
            fut = (
                self.g["actor"]
                .execute_on(*choice.sources)
                .call(ActorWorker.export_weights, version, recv)
            )
            if choice.name == "host":
                host_future = fut
            out[recv] = fut
        return out

    def _handed(self, version: int, futures: dict[str, Any]) -> None:
        """Wait for the exports and record what each receiver is handed for ``version``."""
        from rltrain.backends.weight_sync.transport import CollectiveVersion

        for recv, fut in futures.items():
            choice = self.transports[recv]
            results = fut.wait()
            if choice.name == "host":
                self.weights[recv] = fut.refs[0]  # resolved by Ray as a call argument
            elif choice.name == "ipc":
                self.weights[recv] = dict(zip(choice.sources, results, strict=True))
            else:
                self.weights[recv] = CollectiveVersion(version)

    def _catch_up(self, recv: str) -> None:
        """Collective transport: every receiver rank takes the versions broadcast so far (a
        broadcast needs all of its group, so a call on some ranks only must come after)."""
        from rltrain.backends.weight_sync.transport import CollectiveVersion

        weights = self.weights.get(recv)
        if isinstance(weights, CollectiveVersion):
            with self.job.stage(recv):
                self.g[recv].call(RolloutWorker.catch_up, weights).wait()

    def _finish_weight_sync(self) -> None:
        """Leave no version in flight: receivers take the last broadcast, IPC buckets go."""
        timeout = self.run.cluster.collective_timeout_s
        for recv, choice in self.transports.items():
            sources = self.g["actor"].execute_on(*choice.sources)
            if choice.name == "collective":
                self._catch_up(recv)
                sources.call(ActorWorker.flush_weight_sync, timeout).wait()
            elif choice.name == "ipc":
                sources.call(ActorWorker.release_weights, recv).wait()

    def train_step(self, step: int, queue_next: bool = False) -> dict[str, Any]:
        """One policy update; returns the step's metrics.

        With ``trainer.max_staleness=0`` the step generates with the newest weights, then
        trains. With ``k > 0`` the generations of the next ``k`` steps are already in flight
        (see :class:`GenerationPipeline`) while the actor trains on this one.

        Args:
            step: the policy-update index.
            queue_next: fused ranks only: submit step ``step + 1`` now, behind this one (a
                rank runs its calls in order, so it still generates with the weights this
                step leaves: nothing changes but the driver's round trip between the two).
                The caller promises to call ``train_step(step + 1)`` next, with no
                evaluation or checkpoint in between.
        """
        if self.fused:
            return self._fused_step(step, queue_next)
        timer = StepTimer()
        if self.pipeline is None:
            with timer("generate"), self.job.stage("rollout"), trace.span("generate", "driver"):
                rollouts = self._submit_generation(step, self.version)
                rollouts.wait()
            extra: dict[str, Any] = {}
        else:
            self.pipeline.fill(step)  # next steps' generation overlaps this step's training
            with timer("generate"), trace.span("generate_wait", "driver"):
                gen = self.pipeline.take(step)
                gen.future.wait()
            rollouts = gen.future
            extra = self.pipeline.metrics(gen)
        metrics = self._learn(step, rollouts.refs, timer)
        metrics.update(extra)
        return metrics

    def _fused_step(self, step: int, queue_next: bool) -> dict[str, Any]:
        """The step on fused ranks: each generates, scores and trains on its own prompts."""
        timer = StepTimer()
        with timer("step"), self.job.stage("actor"), trace.span("step", "driver"):
            future = self._take_queued(step)
            if queue_next:
                self._queued = (step + 1, self._submit_fused(step + 1))
            out = future.wait()
        results = [metrics for metrics, _ in out]
        self.version = step + 1
        self._refresh_ledger("actor", results)
        return self._step_metrics([scores for _, scores in out], results, timer.times)

    def _rank_prompts(self, step: int) -> list[list[str]]:
        """The step's prompts, split over the rollout ranks (rank order)."""
        prompts = [ex.prompt for ex in self.task.sample_batch(step, self.sizes.prompts_per_step)]
        k = self.sizes.prompts_per_rollout_rank
        return [prompts[r * k : (r + 1) * k] for r in range(self.sizes.rollout_dp)]

    def _submit_fused(self, step: int) -> Any:
        per_rank = [(prompts, step) for prompts in self._rank_prompts(step)]
        return self.g["actor"].call_each(HybridWorker.step, per_rank)

    def _take_queued(self, step: int) -> Any:
        """The queued call for ``step`` (see ``queue_next``), or a new one."""
        if self._queued is None:
            return self._submit_fused(step)
        queued, future = self._queued
        self._queued = None
        if queued != step:
            raise WorkerError(
                f"fused step {queued} was queued on the ranks but step {step} trains next: "
                f"after train_step(s, queue_next=True) call train_step(s + 1)"
            )
        return future

    def _may_queue_next(self, step: int, t0: float) -> bool:
        """Whether :meth:`fit` may queue step ``step + 1`` behind ``step``: fused ranks, and
        nothing happens between the two (no evaluation, checkpoint, last step or stop)."""
        t = self.run.trainer
        after = step + 1
        return (
            self.fused
            and not self._stop
            and after < t.total_steps
            and not (t.eval_every and after % t.eval_every == 0)
            and not (t.save_every and after % t.save_every == 0)
            and not (t.time_budget_s is not None and time.monotonic() - t0 > t.time_budget_s)
        )

    def _submit_generation(self, step: int, expect_version: int) -> Any:
        """Start the step's generation on every rollout rank with the newest exported weights."""
        weights = self.weights.get("rollout")
        args = [(prompts, step, weights, expect_version) for prompts in self._rank_prompts(step)]
        # Off-policy, the actor's ratio is taken against the sampler; a KL in the reward needs
        # the sampler's log-probs too (recorded while sampling: no extra forward pass).
        alg = self.run.algorithm
        if self.pipeline is not None or (alg.kl_in == "reward" and alg.kl_coef > 0):
            args = [a + (True,) for a in args]
        return self.g["rollout"].call_each(RolloutWorker.generate, args)

    def _learn(self, step: int, shards: list[Any], timer: StepTimer) -> dict[str, Any]:
        """Reward, reference, update and weight export for one generated batch.

        The reward's answer goes to the actor as an object reference, and the weight export is
        queued behind the update on rank 0: the driver waits once, for both, instead of once
        per call (the scoring overlaps the actor's reload).
        """
        g = self.g
        if "reward" in self.job.resident_components:  # a reward model on devices: its turn
            with timer("reward"), self.job.stage("reward"):
                scored = g["reward"].execute_on(0).score(*shards)
                scored.wait()
        else:
            scored = g["reward"].execute_on(0).score(*shards)
        ref_logprobs = None
        if "reference" in g:
            with timer("reference"), self.job.stage("reference"):
                per_rank = g["reference"].call(ReferenceWorker.logprobs, shards).wait()
                ref_logprobs = gather_round_robin(per_rank, len(shards))
        old_logprobs = None
        if "inference" in g:  # the actor's old_logprobs, computed on the inference devices
            with timer("inference"), self.job.stage("inference"):
                old_logprobs = self._inference_logprobs(shards)
        critic_metrics: dict[str, Any] = {}
        if "critic" in g:  # PPO: the actor's GAE reads the values the critic attaches
            shards, critic_metrics = self._critic(step, shards, scored.refs[0], ref_logprobs, timer)
        with timer("train"), self.job.stage("actor"):
            trained = g["actor"].call(
                ActorWorker.train,
                *shards,
                rewards=scored.refs[0],
                step=step,
                ref_logprobs=ref_logprobs,
                old_logprobs=old_logprobs,
            )
            exported = self._submit_exports(step + 1)
            results = trained.wait()
            with timer("sync"):
                self._handed(step + 1, exported)
        self.version = step + 1
        self._refresh_ledger("actor", results)
        with timer("reward"):
            scores = scored.wait()[0]  # answered before the update started
        return {**self._step_metrics(scores, results, timer.times), **critic_metrics}

    def _inference_logprobs(self, shards: list[Any]) -> list[Any]:
        """``[b, R]`` log-probs of every shard under the policy that sampled them (the version
        the rollout held), from the inference ranks, shard order."""
        inference = self.g["inference"]
        per_rank = inference.call(
            InferenceWorker.logprobs,
            shards,
            weights=self.weights.get("inference"),
            expect_version=self.version,
        ).wait()
        return gather_round_robin(per_rank, len(shards))

    def _critic(
        self, step: int, shards: list[Any], rewards: Any, ref_logprobs: Any, timer: StepTimer
    ) -> tuple[list[Any], dict[str, Any]]:
        """Token values for the step's shards, then the critic's update on them.

        Returns:
            The shards with values (object refs, shard order) and the critic's mean metrics.
        """
        g = self.g
        with timer("critic"), self.job.stage("critic"):
            per_rank = g["critic"].call(CriticWorker.with_values, shards).wait()
            valued = gather_round_robin(per_rank, len(shards))
            train = g["critic"].call(
                CriticWorker.train, *valued, rewards=rewards, step=step, ref_logprobs=ref_logprobs
            )
            results = train.wait()
        self._refresh_ledger("critic", results)
        keys = [k for k in results[0] if not k.startswith("state_bytes/")]
        return valued, {k: sum(r[k] for r in results) / len(results) for k in keys}

    def _refresh_ledger(self, component: str, results: list[dict[str, Any]]) -> None:
        """Each rank's ``state_bytes/<kind>`` (in its train metrics) into the memory ledger."""
        for rank, r in enumerate(results):
            self.job.refresh_ledger(
                component,
                {k[12:]: v for k, v in r.items() if k.startswith("state_bytes/")},
                rank,
            )

    def _export_weights(self, version: int) -> None:
        if self.fused:  # the rollout samples with the actor's own parameters
            self.version = version
            return
        # Exported inside the actor's lease (it must be resident); the receivers load the
        # version at their next call, when they hold their own lease.
        with self.job.stage("actor"):
            self._handed(version, self._submit_exports(version))
        self.version = version

    def evaluate(self) -> float:
        self._no_queued("evaluate")
        if self.fused:
            with self.job.stage("actor"):
                return self.g["actor"].execute_on(0).evaluate().wait()[0]
        self._catch_up("rollout")
        with self.job.stage("rollout"):
            return self.g["rollout"].execute_on(0).evaluate(self.weights_ref).wait()[0]

    # ------------------------------------------------------------------------- checkpoints
    def save(self, step: int) -> str:
        self._no_queued("save")
        with self.job.stage("actor"):
            pending = self.ckpt.begin(step)
            self.g["actor"].save(pending.path).wait()  # every rank: ZeRO shards
        if "critic" in self.g:
            with self.job.stage("critic"):
                self.g["critic"].save(pending.path).wait()
        return self.ckpt.commit(pending, {"model": _fingerprint(self.run)})

    def _no_queued(self, what: str) -> None:
        if self._queued is not None:
            raise WorkerError(
                f"{what} with fused step {self._queued[0]} queued on the ranks would see its "
                f"update: train that step first"
            )

    def _resume(self) -> int:
        path = self.ckpt.resolve(self.run.trainer.resume)
        if path is None:
            return 0
        state = read_state(path)
        if state.get("model") != _fingerprint(self.run):
            raise ConfigError(
                f"trainer.resume={path!r} was written for model {state.get('model')} but model.* "
                f"is {_fingerprint(self.run)}: resume with the same model settings"
            )
        with self.job.stage("actor"):
            self.g["actor"].load(f"{path}").wait()
        if "critic" in self.g:
            with self.job.stage("critic"):
                self.g["critic"].load(f"{path}").wait()
        return int(state["step"])

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop = True  # finish the step, write a checkpoint, exit

    # ---------------------------------------------------------------------------- metrics
    def _step_metrics(self, scores, results, times) -> dict[str, Any]:
        import torch

        r = torch.cat([sc.rewards for sc in scores]).float()
        tokens = torch.cat([sc.response_tokens for sc in scores]).float()
        out: dict[str, Any] = {
            "reward/mean": float(r.mean()),
            "reward/std": float(r.std()),
            "response/length_mean": float(tokens.mean()),
        }
        keys = {k for res in results for k in res if not k.startswith("state_bytes/")}
        for k in sorted(keys):  # fused ranks time their stages themselves (time/<stage>_s)
            out[k] = sum(res[k] for res in results) / len(results)
        out.update({f"time/{k}_s": v for k, v in times.items()})
        total = sum(times.values())
        out["time/step_s"] = total
        out["perf/samples_per_s"] = self.sizes.samples_per_step / total if total else None
        out["perf/tokens_per_s"] = float(tokens.sum()) / total if total else None
        return out

    def _summary(self, records, steps: int, seconds: float, status: str) -> dict[str, Any]:
        stage_keys = {k for r in records for k in r if k.startswith("time/") and k != "time/step_s"}
        per_stage = {
            k[5:-2]: sum(r.get(k, 0) for r in records) / max(len(records), 1) for k in stage_keys
        }
        return {
            "placement_mode": self.job.plan.mode.value
            if hasattr(self.job.plan.mode, "value")
            else str(self.job.plan.mode),
            "steps": steps,
            "steps_per_s": steps / seconds if seconds else None,
            "tokens_per_s": _mean([r.get("perf/tokens_per_s") for r in records]),
            "seconds_per_stage": per_stage,
            "peak_memory_bytes_per_device": {
                f"{n}:{d}": b for (n, d), b in self.job.residency.peak.items()
            },
            "final_reward": records[-1].get("reward/mean") if records else None,
            "final_accuracy": next(
                (r["eval/accuracy"] for r in reversed(records) if "eval/accuracy" in r), None
            ),
            "simulated_devices": any(
                n.accelerator_type == "sim" for n in self.job.plan.cluster.nodes
            ),
            "status": status,
            "wall_s": seconds,
        }


def weight_sync_summary(runner: ReasoningRunner) -> dict[str, Any]:
    """``summary.json``'s ``weight_sync``: each receiver's transport and why."""
    if runner.fused:
        return {
            "rollout": {
                "transport": "none",
                "reason": "placement.fuse: the rollout samples with the actor's own parameters",
            }
        }
    return {recv: choice.to_dict() for recv, choice in runner.transports.items()}


def _mean(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _fingerprint(run: RunConfig) -> str:
    m = run.model
    if m.path:
        return f"path:{m.path}"
    return (
        f"{m.family}-h{m.hidden_size}-i{m.intermediate_size}-l{m.num_layers}-"
        f"a{m.num_heads}-kv{m.num_kv_heads}-{m.dtype}"
    )


def data_parallel(groups) -> None:
    """``start_job``'s ``on_launch``: the actor's process group and DDP, before any offload."""
    for name in ("actor", "critic"):
        if name in groups:
            groups[name].init_process_group()
            groups[name].setup_data_parallel().wait()


def run_reasoning(run: RunConfig, run_dir: str) -> dict[str, Any]:
    """Plan, start, train and tear down a reasoning run.

    Args:
        run: the checked run config.
        run_dir: the run's output directory.

    Returns:
        The job summary (also written to ``summary.json``).

    Raises:
        ConfigError / PlacementError / ResourceError: before Ray starts, for bad input.
    """
    from rltrain.placement.plan import build_plan
    from rltrain.placement.types import ClusterSpec

    plan = build_plan(run, ClusterSpec.from_config(run.cluster))  # fails early, no Ray yet
    check_components(run, set(plan.components))
    check_staleness(run, plan)
    check_engines(run, plan)
    sizes = derive_sizes(run, plan.world_size("actor"), plan.world_size("rollout"))
    if "critic" in plan.components:
        derive_critic_sizes(run, sizes.samples_per_step, plan.world_size("critic"))
    fused, blockers = decide_fusion(run, plan)

    builders = worker_builders(run, sizes, fused)
    with start_job(run, run_dir, builders, on_launch=data_parallel) as job:
        runner = ReasoningRunner(job, sizes)
        summary = runner.fit()
        job.verify_ledger()
        summary.update(job.write_timeline())
    summary["weight_sync"] = weight_sync_summary(runner)
    summary["fused"] = fused
    if blockers:  # only placement.fuse=auto gets here with any: why it took turns instead
        summary["fuse_blockers"] = blockers
    return summary
