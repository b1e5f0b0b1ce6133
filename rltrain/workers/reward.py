"""The reward: scores responses with the task's rule (no accelerator needed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import decode_responses
from rltrain.config.schema import RunConfig
from rltrain.scheduler import Worker
from rltrain.scheduler.wire import TensorRecord
from rltrain.tasks import build_task, build_tokenizer
from rltrain.telemetry import trace
from rltrain.workers.common import fetch


@dataclass(frozen=True)
class Scores(TensorRecord):
    """The reward worker's answer for one rollout shard.

    Attributes:
        rewards: ``[b]`` float rewards.
        response_tokens: ``[b]`` generated tokens per row (EOS included).
    """

    rewards: torch.Tensor
    response_tokens: torch.Tensor


class RuleReward:
    """The task's rule reward as a plain object (the reward worker's, and a fused rank's).

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.tokenizer = build_tokenizer(run.model)
        self.task = build_task(run.task, self.tokenizer)

    def score_batch(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B]`` rewards of one batch."""
        prompts = self.tokenizer.batch_decode(batch.prompt_ids.tolist(), skip_special_tokens=True)
        texts = decode_responses(self.tokenizer, batch, self.tokenizer.eos_token_id)
        return torch.tensor([self.task.reward(p, t) for p, t in zip(prompts, texts, strict=True)])

    def scores(self, batch: RolloutBatch) -> Scores:
        """The rewards and response lengths of one batch."""
        return Scores(self.score_batch(batch), batch.response_mask.sum(dim=1))


class RewardWorker(Worker):
    """Scores rollout shards with the task's reward function.

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.rule = RuleReward(run)

    def score(self, *shards: Any) -> list[Scores]:
        """Scores of every shard.

        Args:
            shards: the rollout shards, each an object ref passed as its own argument (Ray
                resolves it before the call starts, not the driver) or a batch.
        """
        with trace.span("reward", "reward", self.device_labels):
            return [self.rule.scores(b) for b in fetch(shards)]
