"""A reasoning step's stages, the object every schedule drives.

One step, as the algorithm reads (:meth:`ReasoningStages.learn` after the generation):

    prompts  = task batch for the step
    rollout  : generate n responses per prompt      (with the latest weights)
    reward   : score them                           (rule function, or a reward model)
    reference: log-probs for the KL                 (only when algorithm.kl_coef > 0)
    inference: the batch's log-probs, current policy (only when an inference component is placed)
    critic   : values, then its own update          (PPO: algorithm.advantage_estimator=gae)
    actor    : advantages, clipped-surrogate update (data-parallel)
    actor    : export the new weights               (the rollout loads them next step)

:class:`ReasoningStages` holds what the stages share — the job's worker groups, the weight hub
(the version the receivers are handed), the task, the batch stage and the dispatcher — and
offers the stages; a schedule (:mod:`rltrain.runners.schedules`) calls them in its own order,
and the runner (:class:`rltrain.runners.reasoning.ReasoningRunner`) keeps only the loop's hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from rltrain.errors import WorkerError
from rltrain.runners.batch_stage import Selection, batch_stage_for
from rltrain.runners.dispatch import Dispatcher
from rltrain.runners.job import Job
from rltrain.runners.loop import StepTimer
from rltrain.runners.weight_hub import WeightHub
from rltrain.scheduler import WorkerGroup
from rltrain.tasks import build_task, build_tokenizer
from rltrain.workers.actor import ActorWorker
from rltrain.workers.common import LOSS_TOKENS, PEAK_METRICS, TrainResult
from rltrain.workers.critic import CriticWorker
from rltrain.workers.inference import InferenceWorker
from rltrain.workers.reference import ReferenceWorker, gather_round_robin
from rltrain.workers.reward import RewardModelWorker, RewardWorker
from rltrain.workers.rollout import RolloutWorker


@dataclass(frozen=True)
class ReasoningGroups:
    """The worker groups of a reasoning job; absent components are None.

    The built-in components have a field each; the group of any other registered component
    is in ``others`` under its name, so a stage reaches every group through :meth:`need`.
    """

    actor: WorkerGroup[Any]
    rollout: WorkerGroup[Any] | None = None
    reward: WorkerGroup[Any] | None = None
    reference: WorkerGroup[Any] | None = None
    critic: WorkerGroup[Any] | None = None
    inference: WorkerGroup[Any] | None = None
    others: Mapping[str, WorkerGroup[Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, groups: Mapping[str, WorkerGroup[Any]]) -> ReasoningGroups:
        """The record of a started job's groups (by component name)."""
        named = {k: v for k, v in groups.items() if k in _FIELDS}
        return cls(**named, others={k: v for k, v in groups.items() if k not in _FIELDS})

    def group(self, name: str) -> WorkerGroup[Any] | None:
        """The group of component ``name``; None when the job started none."""
        return getattr(self, name) if name in _FIELDS else self.others.get(name)

    def need(self, name: str) -> WorkerGroup[Any]:
        """The group of component ``name``, which the stage calling it requires.

        Raises:
            WorkerError: the job started no such group (a schedule called a stage its layout
                does not have).
        """
        group = self.group(name)
        if group is None:
            raise WorkerError(f"this job has no {name} group: its stage cannot run")
        return group

    def receiver(self, name: str) -> WorkerGroup[Any] | None:
        """The group that takes weight versions as ``name`` (a component whose entry says
        ``receives_weights``: ``rollout``, ``inference``, ...); None when not started."""
        return self.group(name)


#: The components with a field of their own in :class:`ReasoningGroups`.
_FIELDS = frozenset(f.name for f in dataclasses.fields(ReasoningGroups)) - {"others"}


class ReasoningStages:
    """The stages of a reasoning step on a started :class:`Job`, and the state they share.

    Args:
        job: the started job (its ``layout`` gives the sizes and whether the step is fused).
    """

    def __init__(self, job: Job) -> None:
        self.job, self.run, self.layout = job, job.run, job.layout
        self.sizes = self.layout.sizes
        self.g = ReasoningGroups.of(job.groups)
        self.scorer = RewardModelWorker if self.run.reward.kind == "model" else RewardWorker
        self.task = build_task(self.run.task, build_tokenizer(self.run.model))
        self.fused = self.layout.fused
        # the version the receivers are handed, their transports and what each holds
        self.hub = WeightHub(job, self.g, ActorWorker, RolloutWorker, fused=self.fused)
        self.batch_stage = batch_stage_for(self.run, self.sizes)
        # rollout.dispatch=length_aware: prompts split over the rollout ranks by expected length
        self.dispatcher = (
            Dispatcher(self.run.rollout.n_samples_per_prompt)
            if self.run.rollout.dispatch == "length_aware"
            else None
        )

    # ----------------------------------------------------------------------------- weight sync
    @property
    def version(self) -> int:
        """The newest weight version the receivers are handed (:attr:`WeightHub.version`)."""
        return self.hub.version

    @version.setter
    def version(self, value: int) -> None:
        self.hub.version = value

    @property
    def weights_ref(self) -> Any:
        """What the rollout is handed for the newest weights (:meth:`WeightHub.handed_to`)."""
        return self.hub.handed_to("rollout")

    def export_weights(self, version: int) -> None:
        """Hand every receiver ``version`` (:meth:`WeightHub.export`)."""
        self.hub.export(version)

    def finish_weight_sync(self) -> None:
        """Leave no version in flight (:meth:`WeightHub.finish`)."""
        self.hub.finish()

    # ------------------------------------------------------------------------ the step's stages
    def rank_prompts(self, step: int, round_: int = 0) -> list[list[str]]:
        """The prompts of a step's generation round (:meth:`BatchStage.data_index`), split
        over the rollout ranks (rank order): contiguous slices in data order, or packed by
        expected length (``rollout.dispatch=length_aware``, :mod:`rltrain.runners.dispatch`)."""
        index = self.batch_stage.data_index(step, round_)
        prompts = [ex.prompt for ex in self.task.sample_batch(index, self.sizes.prompts_per_step)]
        if self.dispatcher is not None:
            return self.dispatcher.split(prompts, self.sizes.rollout_dp)
        k = self.sizes.prompts_per_rollout_rank
        return [prompts[r * k : (r + 1) * k] for r in range(self.sizes.rollout_dp)]

    def submit_generation(
        self,
        step: int,
        expect_version: int,
        round_: int = 0,
        resume: bool = False,
        policy: str | None = None,
        oldest_version: int | None = None,
        data_step: int | None = None,
        hand_on: bool = True,
        due_version: int | None = None,
        extend: bool = False,
        segment: int | None = None,
    ) -> Any:
        """Start the step's generation on every rollout rank with the newest handed weights.

        The rollout records the sampler's log-probs in every step: the actor logs their gap to
        its own (``rollout/logprob_gap_*``), and takes them as pi_old or as the truncated
        importance weights' denominator (``algorithm.old_logprobs``).

        Args:
            step: the step whose prompts are generated.
            expect_version: the oldest weight version the rollout may sample with.
            round_: the generation round of the step (the batch stage may ask for more).
            resume: continue the step's generation paused at a weight swap
                (``trainer.partial_rollout=continue``).
            policy: the schedule's ``trainer.partial_rollout`` (None: the config's).
            oldest_version: ``carry``: carried groups started before this version are dropped.
            data_step: the step whose prompts are sampled (None: ``step``; ``carry`` samples
                ahead of the groups it hands on).
            hand_on: ``carry``: False only queues the groups (the rollout's first call).
            due_version: ``carry``: carried groups started before this version are finished
                in this call (the next call would drop them; None: ``oldest_version + 1``).
            extend: ``carry`` with ``hand_on=False``: add to the rollout's buffer (a deeper
                prime, ``trainer.carry_surplus``) instead of starting a new one.
            segment: ``carry``: the new buffer's segment (None: ``trainer.carry_segment``).
        """
        weights = self.hub.handed_to("rollout")
        per_rank = self.rank_prompts(step if data_step is None else data_step, round_)
        extra = (oldest_version, hand_on, due_version, extend, segment)
        args = [
            (prompts, step, weights, expect_version, True, resume, policy, *extra)
            for prompts in per_rank
        ]
        future = self.g.need("rollout").call_each(RolloutWorker.generate, args)
        if self.dispatcher is not None:
            self.dispatcher.sent(future.refs, per_rank)
        return future

    def learn(self, step: int, shards: list[Any], timer: StepTimer) -> dict[str, Any]:
        """Reward, reference, update and weight export for one generated batch.

        The reward's answer goes to the actor as an object reference, and the weight export is
        queued behind the update on rank 0: the driver waits once, for both, instead of once
        per call (the scoring overlaps the actor's reload).
        """
        g = self.g
        scored = self.score(shards, timer)
        selection = Selection()
        if self.batch_stage.needs_scores:  # the stage picks the rows: wait for every score
            shards, scored, selection = self.fill_batch(step, shards, scored, timer)
        generated = list(shards)  # the rollout's shards (the critic's carry values)
        ref_logprobs = None
        if g.reference is not None:
            with timer("reference"), self.job.stage("reference"):
                per_rank = g.reference.call(ReferenceWorker.logprobs, shards).wait()
                ref_logprobs = gather_round_robin(per_rank, len(shards))
        old_logprobs = None
        if g.inference is not None:  # the actor's old_logprobs, computed on the inference devices
            with timer("inference"), self.job.stage("inference"):
                old_logprobs = self.inference_logprobs(shards)
        critic_metrics: dict[str, Any] = {}
        if g.critic is not None:  # PPO: the actor's GAE reads the values the critic attaches
            shards, critic_metrics = self._critic(step, shards, scored.rewards, ref_logprobs, timer)
        results = self._train_and_sync(
            step, shards, scored, selection, ref_logprobs, old_logprobs, timer
        )
        self.version = step + 1
        with timer("reward"):
            scores = scored.scores()  # answered before the update started
        metrics = self.step_metrics(scores, results, timer.times)
        lengths = self.observe_lengths(generated, scores)
        return {**metrics, **critic_metrics, **selection.metrics, **lengths}

    def _train_and_sync(
        self,
        step: int,
        shards: list[Any],
        scored: ScoredShards,
        selection: Selection,
        ref_logprobs: Any,
        old_logprobs: Any,
        timer: StepTimer,
    ) -> list[Any]:
        """The actor's update and the weight export after it, timed as two stages."""
        g = self.g
        # The export reads the actor's weights, so the sync runs in the actor's lease, but it is
        # timed apart from train: the stage times add up to time/step_s. Train's time starts
        # before the lease, whose entry waits for the offloads (the rollout's) it needs.
        with ExitStack() as actor_lease:
            with timer("train"):
                actor_lease.enter_context(self.job.stage("actor"))
                trained = g.actor.call(
                    ActorWorker.train,
                    *shards,
                    rewards=scored.rewards,
                    step=step,
                    ref_logprobs=ref_logprobs,
                    old_logprobs=old_logprobs,
                    rows=selection.rows,
                )
                exported = self.hub.submit_exports(step + 1)
                results = trained.wait()
                # in the lease: its state sits beside the stage's bytes, and an after_stage
                # offload at the lease's end takes the optimizer state step 0 created
                self.refresh_ledger("actor", results)
            with timer("sync"):
                self.hub.handed(step + 1, exported)
                actor_lease.close()  # the lease's end is in a stage too
        return results

    def score(self, shards: list[Any], timer: StepTimer) -> ScoredShards:
        """Submit the scoring of ``shards`` (a reward model on devices takes its turn now)."""
        call = self.g.need("reward").execute_on(0).call
        if "reward" in self.job.resident_components:  # a reward model on devices: its turn
            with timer("reward"), self.job.stage("reward"):
                scored = call(self.scorer.score, *shards)
                scored.wait()
        else:
            scored = call(self.scorer.score, *shards)
        return ScoredShards(scored)

    def fill_batch(
        self, step: int, shards: list[Any], scored: ScoredShards, timer: StepTimer
    ) -> tuple[list[Any], ScoredShards, Selection]:
        """Generate and score more rounds until the batch stage selects the training rows.

        Returns:
            Every round's shards (generation order), their scores, and the selection.
        """
        all_shards, scores = list(shards), scored.scores()
        for round_ in range(1, self.batch_stage.rounds + 1):
            final = round_ == self.batch_stage.rounds
            rewards, masks = [s.rewards for s in scores], [s.scored for s in scores]
            selection = self.batch_stage.select(rewards, final, masks)
            if selection is not None:
                return all_shards, ScoredShards(None, scores), selection
            with timer("generate"), self.job.stage("rollout"):
                more = self.submit_generation(step, self.version, round_)
                more.wait()
            all_shards += more.refs
            scores += self.score(more.refs, timer).scores()
        raise AssertionError("unreachable: the last round selects")

    def observe_lengths(self, keys: list[Any], scores: list[Any]) -> dict[str, float]:
        """Teach ``length_aware`` dispatch the response lengths of the shards ``keys``
        (their ``Scores``); returns its ``rollout/length_*`` metrics ({} with ``in_order``)."""
        if self.dispatcher is None:
            return {}
        return self.dispatcher.observe(keys, [s.response_tokens for s in scores])

    def inference_logprobs(self, shards: list[Any]) -> list[Any]:
        """``[b, R]`` log-probs of every shard under the policy that sampled them (the version
        the rollout held), from the inference ranks, shard order."""
        per_rank = (
            self.g.need("inference")
            .call(
                InferenceWorker.logprobs,
                shards,
                weights=self.hub.handed_to("inference"),
                expect_version=self.version,
            )
            .wait()
        )
        return gather_round_robin(per_rank, len(shards))

    def _critic(
        self, step: int, shards: list[Any], rewards: Any, ref_logprobs: Any, timer: StepTimer
    ) -> tuple[list[Any], dict[str, Any]]:
        """Token values for the step's shards, then the critic's update on them.

        Returns:
            The shards with values (object refs, shard order) and the critic's mean metrics.
        """
        critic = self.g.need("critic")
        with timer("critic"), self.job.stage("critic"):
            per_rank = critic.call(CriticWorker.with_values, shards).wait()
            valued = gather_round_robin(per_rank, len(shards))
            train = critic.call(
                CriticWorker.train, *valued, rewards=rewards, step=step, ref_logprobs=ref_logprobs
            )
            results = train.wait()
            self.refresh_ledger("critic", results)  # in the lease, as the actor's
        return valued, _mean_metrics(results)

    def refresh_ledger(self, component: str, results: list[TrainResult]) -> None:
        """Each rank's state sizes (its update's answer) into the memory ledger."""
        for rank, r in enumerate(results):
            self.job.refresh_ledger(component, r.state_bytes, rank)

    def evaluate_rollout(self) -> float | None:
        """Greedy accuracy on rollout rank 0 with the newest handed weights (None: no episode
        was scored)."""
        self.hub.catch_up("rollout")
        with self.job.stage("rollout"):
            return (
                self.g.need("rollout")
                .execute_on(0)
                .call(RolloutWorker.evaluate, self.weights_ref)
                .wait()[0]
            )

    # ---------------------------------------------------------------------------- metrics
    def step_metrics(self, scores, results: list[TrainResult], times) -> dict[str, Any]:
        import torch

        tokens = torch.cat([sc.response_tokens for sc in scores]).float()
        out: dict[str, Any] = {**reward_stats(scores), "response/length_mean": float(tokens.mean())}
        for sc in scores:  # counts per shard: response/truncated, reward/truncated
            for key, n in sc.counts.items():
                least = key in MIN_COUNTS and key in out  # the oldest over the shards
                out[key] = min(out[key], n) if least else out.get(key, 0) + n
        out.update(_mean_metrics(results))  # fused ranks time their stages (time/<stage>_s)
        out.update({f"time/{k}_s": v for k, v in times.items()})
        total = sum(times.values())
        out["time/step_s"] = total
        out["perf/samples_per_s"] = self.sizes.samples_per_step / total if total else None
        out["perf/tokens_per_s"] = float(tokens.sum()) / total if total else None
        return out


#: Per-shard counts a step takes the least of (instead of their sum).
MIN_COUNTS = ("rollout/oldest_version",)


class ScoredShards:
    """The reward worker's answer for a step's shards: a pending call (its reference goes to
    the actor and critic as it is, so the driver need not wait) or scores already fetched.

    Args:
        future: the scoring call, or None when ``scores`` are given.
        scores: the fetched ``Scores`` per shard.
    """

    def __init__(self, future: Any, scores: list[Any] | None = None) -> None:
        self.future, self._scores = future, scores

    @property
    def rewards(self) -> Any:
        """What the actor and critic take as ``rewards``: the call's object ref, or the
        fetched scores."""
        return self.future.refs[0] if self._scores is None else self._scores

    def scores(self) -> list[Any]:
        """The ``Scores`` per shard (waits for the call once)."""
        if self._scores is None:
            self._scores = list(self.future.wait()[0])
        return self._scores


#: The actor's metrics that average over tokens: their mean over the ranks weighs each rank by
#: its ``LOSS_TOKENS``.
TOKEN_METRICS = frozenset(
    f"actor/{k}"
    for k in ("pg_loss", "clip_frac", "approx_kl", "entropy", "kl_loss", "tis_weight_mean",
              "tis_clip_frac")
)  # fmt: skip
#: The rollout/trainer log-prob gap's metrics (:class:`~rltrain.algorithms.logprobs.LogprobGap`).
GAP_MEAN, GAP_MAX, GAP_TOKENS = (
    "rollout/logprob_gap_mean",
    "rollout/logprob_gap_max",
    "rollout/logprob_gap_tokens",
)


def reward_stats(scores: list[Any]) -> dict[str, float]:
    """``reward/mean`` and ``reward/std`` of a step's scored rows.

    Infra-failed episodes (a tool raised or timed out) have no score: they are left out,
    as they are of the group statistics and the loss. A step where every episode failed has
    no reward to report (the keys are absent).

    Args:
        scores: the step's :class:`rltrain.workers.reward.Scores`, one per shard.

    Returns:
        The two metrics, or an empty dict.
    """
    import torch

    r = torch.cat([sc.rewards for sc in scores]).float()
    keep = [
        torch.ones(len(sc.rewards), dtype=torch.bool) if sc.scored is None else sc.scored
        for sc in scores
    ]
    r = r[torch.cat(keep)]
    if not r.numel():
        return {}
    return {"reward/mean": float(r.mean()), "reward/std": float(r.std()) if len(r) > 1 else 0.0}


def _mean_metrics(results: list[TrainResult]) -> dict[str, float]:
    """Every metric averaged over the ranks; the allocator peaks the largest; the actor's
    per-token metrics (:data:`TOKEN_METRICS`) weighted by each rank's trained tokens
    (``actor/loss_tokens``, summed: a rank whose rows all failed trained none and does not
    count; with no token trained anywhere they are left out); the log-prob gap's mean weighted
    by each rank's tokens, its max the largest, its token count summed."""
    keys = sorted({k for r in results for k in r.metrics})
    out: dict[str, float] = {}
    trained = [r for r in results if r.metrics.get(LOSS_TOKENS, 0.0) > 0]
    weighted = all(LOSS_TOKENS in r.metrics for r in results)
    for k in keys:  # over the ranks that report it (a rank may have no gap to report)
        values = [r.metrics[k] for r in results if k in r.metrics]
        if k == LOSS_TOKENS:
            out[k] = sum(values)
        elif weighted and k in TOKEN_METRICS:
            tokens = sum(r.metrics[LOSS_TOKENS] for r in trained if k in r.metrics)
            if tokens:
                out[k] = sum(r.metrics[k] * r.metrics[LOSS_TOKENS] for r in trained) / tokens
        else:
            out[k] = max(values) if k.endswith(PEAK_METRICS) else sum(values) / len(values)
    tokens = sum(r.metrics.get(GAP_TOKENS, 0.0) for r in results)
    if tokens:
        out[GAP_MEAN] = (
            sum(r.metrics.get(GAP_MEAN, 0.0) * r.metrics.get(GAP_TOKENS, 0.0) for r in results)
            / tokens
        )
        out[GAP_MAX] = max(r.metrics.get(GAP_MAX, 0.0) for r in results)
        out[GAP_TOKENS] = tokens
    return out
