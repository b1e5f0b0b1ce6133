"""The reward: scores responses with the task's rule (no accelerator needed), or with a reward
model (``reward.kind=model``: a local Hugging Face sequence-classification checkpoint).

- :class:`RewardWorker`: the task's rule (:class:`RuleReward`).
- :class:`RewardModelWorker`: ``AutoModelForSequenceClassification`` and its tokenizer from
  ``reward.model_path`` score the text of prompt + response, ``reward.micro_batch_size``
  sequences per forward pass, on the reward's placed devices (CPU when it is placed on a node
  only); the model is resident state, moved off its devices by ``placement.offload.reward``
  like any other component's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import decode_responses
from rltrain.backends.offload import StateMover
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError
from rltrain.scheduler import Worker
from rltrain.tasks import build_task, build_tokenizer
from rltrain.telemetry import trace
from rltrain.wire import TensorRecord
from rltrain.workers.common import ResidentState, compute_device, fetch


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


def batch_texts(tokenizer: Any, batch: RolloutBatch) -> list[str]:
    """Prompt + response text of every row (the response cut before its EOS), as a reward
    model reads them.

    Args:
        tokenizer: the policy's tokenizer.
        batch: a generated batch.
    """
    prompts = tokenizer.batch_decode(batch.prompt_ids.tolist(), skip_special_tokens=True)
    texts = decode_responses(tokenizer, batch, tokenizer.eos_token_id)
    return [p + t for p, t in zip(prompts, texts, strict=True)]


class ModelReward:
    """A sequence-classification reward model: one score per text.

    Args:
        path: the checkpoint directory (``reward.model_path``): model and tokenizer.
        device: where the model computes.
        micro_batch: texts per forward pass (``reward.micro_batch_size``).

    Raises:
        ConfigError: the checkpoint does not load as a sequence classifier, or has more than
            one output (a reward model gives one score per sequence).
    """

    def __init__(self, path: str, device: torch.device, micro_batch: int) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"reward.model_path={path!r} does not load as a sequence-classification "
                f"checkpoint with its tokenizer ({exc}): save both with save_pretrained(dir)"
            ) from None
        if model.config.num_labels != 1:
            raise ConfigError(
                f"reward.model_path={path!r} has num_labels={model.config.num_labels}, but a "
                f"reward model gives one score per sequence: save it with num_labels=1"
            )
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # The classifier reads the last token that is not padding: pad on the right.
        self.tokenizer.padding_side = "right"
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.to(device).eval()
        self.model.requires_grad_(False)
        self.device = device
        self.micro_batch = max(1, micro_batch)

    @torch.no_grad()
    def score_texts(self, texts: list[str]) -> torch.Tensor:
        """``[len(texts)]`` float scores, ``micro_batch`` texts per forward pass."""
        out = []
        for i in range(0, len(texts), self.micro_batch):
            enc = self.tokenizer(
                texts[i : i + self.micro_batch], padding=True, return_tensors="pt"
            ).to(self.device)
            out.append(self.model(**enc).logits[:, 0].float().cpu())
        return torch.cat(out) if out else torch.zeros(0)


class RewardModelWorker(Worker, ResidentState):
    """Scores rollout shards with a reward model (``reward.kind=model``).

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.device = compute_device(self)
        self.policy_tokenizer = build_tokenizer(run.model)
        self.scorer = ModelReward(
            str(run.reward.model_path), self.device, run.reward.micro_batch_size
        )
        self.mover = StateMover(self.scorer.model, None, device=self.device)

    def score(self, *shards: Any) -> list[Scores]:
        """Scores of every shard (see :meth:`RewardWorker.score`)."""
        with trace.span("reward", "reward", self.device_labels):
            out = []
            for b in fetch(shards):
                rewards = self.scorer.score_texts(batch_texts(self.policy_tokenizer, b))
                out.append(Scores(rewards, b.response_mask.sum(dim=1)))
            return out
