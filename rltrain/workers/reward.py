"""The reward: scores responses with the task's rule (no accelerator needed), or with a reward
model (``reward.kind=model``: a local Hugging Face sequence-classification checkpoint).

- :class:`RewardWorker`: the task's rule (:class:`RuleReward`).
- :class:`RewardModelWorker`: ``AutoModelForSequenceClassification`` and its tokenizer from
  ``reward.model_path`` score each row's conversation, ``reward.micro_batch_size`` sequences
  per forward pass, on the reward's placed devices (CPU when it is placed on a node only); the
  model is resident state, moved off its devices by ``placement.offload.reward`` like any
  other component's.

What the reward model reads (:class:`ModelReward`): the conversation the row continues (the
prompt's messages: ``task.system_prompt`` and the user's turn, not the policy's chat markup)
with the response as the assistant's turn, rendered by the reward model's **own** tokenizer and
chat template (``apply_chat_template``, no generation prompt), as verl's reward-model worker does
when the two tokenizers differ. A reward model without a chat template reads the prompt as the
policy was given it followed by the response. The response is the text up to (not including)
the EOS the policy sampled. Sequences longer than the reward model's context (the smaller of its
``max_position_embeddings`` and its tokenizer's ``model_max_length``) are cut on the right, as
verl and OpenRLHF cut reward-model inputs by default, so the classifier reads the last token that
fits; every cut row is counted in the step's ``reward/truncated``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import decode_responses, padded_rows
from rltrain.backends.generation import eos_token_ids
from rltrain.backends.offload import StateMover
from rltrain.config.schema import RunConfig
from rltrain.errors import ConfigError, WorkerError
from rltrain.scheduler import Worker
from rltrain.tasks import build_task, build_tokenizer, tokenizer_source
from rltrain.tasks.build import prompt_conversations
from rltrain.telemetry import trace
from rltrain.wire import TensorRecord
from rltrain.workers.common import ResidentState, compute_device, fetch

#: A tokenizer's ``model_max_length`` at or above this is transformers' "no limit" sentinel.
NO_LIMIT = 10**9


@dataclass(frozen=True)
class Scores(TensorRecord):
    """The reward worker's answer for one rollout shard.

    Attributes:
        rewards: ``[b]`` float rewards.
        response_tokens: ``[b]`` generated tokens per row (EOS included).
        counts: per-shard counts the step sums into its metrics: ``response/truncated`` (rows
            the token budget cut, when the batch says) and, for a reward model,
            ``reward/truncated`` (rows cut to its context).
        scored: ``[b]`` bool, False on infra-failed episodes (a tool raised or timed out:
            their reward is no score, ``reward/mean`` leaves them out); None when every row
            is scored.
    """

    rewards: torch.Tensor
    response_tokens: torch.Tensor
    counts: dict[str, int] = field(default_factory=dict)
    scored: torch.Tensor | None = None


def batch_counts(batch: RolloutBatch) -> dict[str, int]:
    """The counts every scorer reports for a batch (see :attr:`Scores.counts`); with
    ``trainer.max_staleness >= 1`` also ``rollout/discarded_tokens`` and
    ``rollout/continued_tokens`` (tokens sampled with newer weights than their row's first)."""
    out = {} if batch.truncated is None else {"response/truncated": int(batch.truncated.sum())}
    if batch.discarded_tokens is not None:
        out["rollout/discarded_tokens"] = batch.discarded_tokens
        if batch.token_versions is not None:
            out["rollout/continued_tokens"] = continued_tokens(batch)
            oldest = oldest_version(batch)
            if oldest is not None:  # the step takes the least over its shards
                out["rollout/oldest_version"] = oldest
    # multi-turn episodes (rltrain.agents): summed over the step's shards
    for key, field_ in (
        ("rollout/turns", batch.turns),
        ("rollout/tool_calls", batch.tool_calls),
        ("rollout/infra_failed", batch.infra_failed),
    ):
        if field_ is not None:
            out[key] = int(field_.sum())
    return out


def scored_rows(batch: RolloutBatch) -> torch.Tensor | None:
    """``[b]`` True where a row has a score: every row but infra-failed episodes; None when
    the batch has none of those."""
    return None if batch.infra_failed is None else ~batch.infra_failed


def oldest_version(batch: RolloutBatch) -> int | None:
    """The oldest weight version that sampled any response token of the batch (None: no
    response token)."""
    versions, live = batch.token_versions, batch.response_mask.bool()
    assert versions is not None
    return int(versions[live].min()) if bool(live.any()) else None


def continued_tokens(batch: RolloutBatch) -> int:
    """Response tokens sampled with a newer weight version than their row's first token."""
    versions, live = batch.token_versions, batch.response_mask.bool()
    assert versions is not None
    first = versions.masked_fill(~live, torch.iinfo(versions.dtype).max).min(dim=1).values
    return int((live & (versions > first[:, None])).sum())


class RuleReward:
    """The task's rule reward as a plain object (the reward worker's, and a fused rank's).

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.tokenizer = build_tokenizer(run.model)
        self.task = build_task(run.task, self.tokenizer)
        self.eos_ids = eos_token_ids(self.tokenizer, run.model.path)

    def score_batch(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B]`` rewards of one batch: its environment's where a multi-turn rollout ran one
        (``env_rewards``), else the task's rule on the decoded text."""
        if batch.env_rewards is not None:
            return batch.env_rewards.float()
        prompts = self.tokenizer.batch_decode(batch.prompt_ids.tolist(), skip_special_tokens=True)
        texts = decode_responses(self.tokenizer, batch, self.eos_ids)
        return torch.tensor([self.task.reward(p, t) for p, t in zip(prompts, texts, strict=True)])

    def scores(self, batch: RolloutBatch) -> Scores:
        """The rewards and response lengths of one batch."""
        return Scores(
            self.score_batch(batch),
            batch.response_mask.sum(dim=1),
            batch_counts(batch),
            scored_rows(batch),
        )


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


@dataclass(frozen=True)
class Turns:
    """What a reward model scores for one row.

    Attributes:
        messages: the prompt's conversation with the response as the assistant's last turn.
        text: the prompt as the policy was given it, followed by the response (what a reward
            model without a chat template reads).
    """

    messages: tuple[dict[str, str], ...]
    text: str


class PolicyRows:
    """Turns rollout rows back into conversations: the task's prompt messages and the decoded
    response.

    Args:
        run: the checked run config (the policy's tokenizer and task).
    """

    def __init__(self, run: RunConfig) -> None:
        self.tokenizer = build_tokenizer(run.model)
        key = tokenizer_source(run.model)
        self.task = build_task(run.task, self.tokenizer, key)
        self.conversations = prompt_conversations(run.task, self.tokenizer, key)
        self.eos_ids = eos_token_ids(self.tokenizer, run.model.path)

    def turns(self, batch: RolloutBatch) -> list[Turns]:
        """Every row's :class:`Turns`.

        Raises:
            WorkerError: a row's prompt is not one of the task's.
        """
        read = self.tokenizer.batch_decode(batch.prompt_ids.tolist(), skip_special_tokens=True)
        responses = decode_responses(self.tokenizer, batch, self.eos_ids)
        out = []
        for prompt, response in zip(read, responses, strict=True):
            try:
                held = self.task.canonical(prompt)
            except KeyError:
                raise WorkerError(
                    f"reward model: a rollout row's prompt {prompt!r:.80} is not one of the "
                    f"task's prompts"
                ) from None
            messages = (*self.conversations[held], {"role": "assistant", "content": response})
            out.append(Turns(messages, held + response))
        return out


def context_length(model: Any, tokenizer: Any) -> int | None:
    """The longest sequence a reward model reads: the smaller of its config's
    ``max_position_embeddings`` and its tokenizer's ``model_max_length`` (None: no limit
    known)."""
    limits = [getattr(model.config, "max_position_embeddings", None)]
    limits.append(getattr(tokenizer, "model_max_length", None))
    known = [int(n) for n in limits if isinstance(n, int) and 0 < n < NO_LIMIT]
    return min(known) if known else None


class ModelReward:
    """A sequence-classification reward model: one score per conversation, read with its own
    tokenizer and chat template, cut on the right to its context (see the module docstring).

    Args:
        path: the checkpoint directory (``reward.model_path``): model and tokenizer.
        device: where the model computes.
        micro_batch: sequences per forward pass (``reward.micro_batch_size``).

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
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        # The classifier reads each row's score at its last token that is not the config's
        # pad id: rows are padded on the right with that id (a tokenizer's own pad id may
        # differ, and its padding would be read as the row's last token).
        self.pad_id = int(model.config.pad_token_id)
        self.model = model.to(device).eval()
        self.model.requires_grad_(False)
        self.device = device
        self.micro_batch = max(1, micro_batch)
        self.context = context_length(model, self.tokenizer)
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, turns: Turns) -> str:
        """The text of one row as this reward model reads it (see the module docstring)."""
        if not self.chat:
            return turns.text
        return self.tokenizer.apply_chat_template(
            list(turns.messages), tokenize=False, add_generation_prompt=False
        )

    def encode(self, rows: list[Turns]) -> tuple[list[list[int]], int]:
        """Token ids of every row, cut on the right to :attr:`context`, and how many were cut.

        A rendered chat template holds its own special tokens (no second BOS is added); plain
        text gets the tokenizer's.
        """
        ids = self.tokenizer([self.render(t) for t in rows], add_special_tokens=not self.chat)[
            "input_ids"
        ]
        cut = 0
        if self.context is not None:
            cut = sum(len(r) > self.context for r in ids)
            ids = [r[: self.context] for r in ids]
        return [list(r) for r in ids], cut

    @torch.no_grad()
    def score(self, rows: list[Turns]) -> tuple[torch.Tensor, int]:
        """``[len(rows)]`` float scores, ``micro_batch`` rows per forward pass, and the number
        of rows cut to the context."""
        ids, cut = self.encode(rows)
        out = []
        for i in range(0, len(ids), self.micro_batch):
            chunk = ids[i : i + self.micro_batch]
            input_ids, mask = padded_rows(chunk, self.pad_id, left=False, device=self.device)
            logits = self.model(input_ids=input_ids, attention_mask=mask).logits
            out.append(logits[:, 0].float().cpu())
        return (torch.cat(out) if out else torch.zeros(0)), cut


class RewardModelWorker(Worker, ResidentState):
    """Scores rollout shards with a reward model (``reward.kind=model``).

    Args:
        run: the checked run config.
    """

    def __init__(self, run: RunConfig) -> None:
        self.device = compute_device(self)
        self.rows = PolicyRows(run)
        self.scorer = ModelReward(
            str(run.reward.model_path), self.device, run.reward.micro_batch_size
        )
        self.mover = StateMover(self.scorer.model, None, device=self.device)

    def score(self, *shards: Any) -> list[Scores]:
        """Scores of every shard (see :meth:`RewardWorker.score`)."""
        with trace.span("reward", "reward", self.device_labels):
            out = []
            for b in fetch(shards):
                rewards, cut = self.scorer.score(self.rows.turns(b))
                counts = {**batch_counts(b), "reward/truncated": cut}
                out.append(Scores(rewards, b.response_mask.sum(dim=1), counts, scored_rows(b)))
            return out
