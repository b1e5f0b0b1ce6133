"""One process per device for the actor, the rollout and the rule reward (``placement.fuse``).

A fused rank samples its own prompts with the policy it trains (the rollout is the actor's own
parameters: no second copy, no weight sync), scores them with the task's rule, forms the group
advantages of its own prompt groups and takes the data-parallel update, all in one call. The
rows and random streams are those of the separate workers (rollout rank ``r``'s prompts and
sampling seed, actor rank ``r``'s rows and shuffling seed), so a fused run learns what a turn-
taking run learns. When fusing is allowed is decided in :mod:`rltrain.runners.fusion`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rltrain.agents.interaction import Interaction, SingleTurn, attach_pool, tool_episodes
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import SamplingParams, greedy_accuracy
from rltrain.algorithms.update import add_advantages
from rltrain.backends.generation import sample_own, sampling_seed
from rltrain.backends.weight_sync.host import HostBuckets
from rltrain.config import seeds
from rltrain.config.schema import RunConfig
from rltrain.placement.sizes import BatchSizes
from rltrain.telemetry import trace
from rltrain.workers.actor import ActorWorker
from rltrain.workers.common import TrainResult, as_rollout_logprobs
from rltrain.workers.reward import RuleReward, Scores
from rltrain.workers.rollout import modelled_generate_s


class FusedWorker(ActorWorker):
    """One data-parallel rank of the fused actor, rollout and reward.

    Args:
        run: the checked run config.
        sizes: the derived batch sizes (actor and rollout have the same ranks).
    """

    def __init__(self, run: RunConfig, sizes: BatchSizes) -> None:
        super().__init__(run, sizes)
        self.params = SamplingParams.from_rollout(run.rollout)
        self.rule = RuleReward(run)
        self.updates = 0  # the policy updates made (as a rollout's weight version counts them)
        self.eos_ids = self.rule.eos_ids  # the rollout's stop ids (eos_token_ids)
        self.interaction: Interaction = (
            SingleTurn(self._sample, self._greedy)
            if run.task.env is None
            else tool_episodes(run, lambda: self.model, self.tokenizer, self.device, self.eos_ids)
        )

    def use_tools(self, actors: list[Any]) -> None:
        """Send this rank's episodes' tool calls to the tool pool's workers (launch)."""
        # imports Ray: the vLLM bundle's steps import this module without it
        from rltrain.workers.tools import RayToolPool

        attach_pool(self.interaction, RayToolPool(actors))

    def step(self, prompts: list[str], step: int) -> tuple[TrainResult, Scores]:
        """Generate, score and train on this rank's prompts.

        Args:
            prompts: this rank's prompts (rollout rank ``rank``'s share of the step).
            step: the policy-update index (seeds sampling and minibatch shuffling).

        Returns:
            The rank's update (its metrics, ``time/<stage>_s`` included, and state sizes) and
            the scores of its rows.
        """
        times: dict[str, float] = {}
        t = time.perf_counter()
        with trace.span("generate", "rollout", self.device_labels):
            # the sampler's log-probs too: the parity check, and pi_old or the TIS weights
            seed = sampling_seed(self.run, step, self.rank)  # rollout rank ``rank``'s stream
            batch = as_rollout_logprobs(
                self.interaction.generate(prompts, seed, True, None).to("cpu")
            )
            wait = modelled_generate_s(self.run, batch, step, self.rank)  # a slower device
            if wait:
                time.sleep(wait)
        times["generate"], t = time.perf_counter() - t, time.perf_counter()
        with trace.span("reward", "reward", self.device_labels):
            scores = self.rule.scores(batch)
        times["reward"], t = time.perf_counter() - t, time.perf_counter()
        with trace.span("train", "actor", self.device_labels):
            # Under LoRA with the KL the reference is this policy with its adapters disabled.
            mine = self.own_reference(batch.replace(rewards=scores.rewards))
            mine = add_advantages(mine, self.settings)
            result = self.update(mine, step)
        times["train"] = time.perf_counter() - t
        self.updates = step + 1
        result.metrics.update({f"time/{k}_s": v for k, v in times.items()})
        return result, scores

    def evaluate(self, weights: HostBuckets | None = None) -> float | None:
        """Greedy accuracy on the task's evaluation prompts with the current weights (None: no
        episode was scored, every one infra-failed).

        Args:
            weights: ignored: a fused rank evaluates the parameters it trains.

        The evaluation's seed follows the updates made (as a rollout's follows its weight
        version): each evaluation draws its own ``simulate.tool_failure_rate`` failures.
        """
        seed = seeds.eval_episode_seed(self.run.seed, self.updates, 0)
        with trace.span("evaluate", "rollout", self.device_labels):
            return self.interaction.evaluate(self.rule.task, seed)

    def _sample(
        self,
        prompts: Sequence[str],
        seed: int,
        with_logprobs: bool,
        should_stop: Callable[[], bool] | None,
    ) -> RolloutBatch:
        """Single-turn sampling with the trained parameters (:class:`SingleTurn`'s call)."""
        return sample_own(self, prompts, seed, with_logprobs, should_stop)

    def _greedy(self, task: object) -> float:
        return greedy_accuracy(
            self.model, self.tokenizer, task, self.run.rollout.max_new_tokens, eos_ids=self.eos_ids
        )
