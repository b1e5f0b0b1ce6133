"""Joining rollout shards: each rollout rank returns a batch with its own prompt and response
lengths, so shards are padded (prompts on the left, responses on the right) before joining; and
attaching what other workers computed for them (rewards, reference log-probs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rltrain.algorithms.batch import RolloutBatch

_PER_TOKEN = (
    "loss_mask",
    "old_logprobs",
    "ref_logprobs",
    "values",
    "advantages",
    "returns",
    "rollout_logprobs",
    "token_versions",
)
_PER_ROW = ("rewards", "truncated", "env_rewards", "infra_failed", "turns", "tool_calls")


def pad_tokens(x: torch.Tensor, length: int, value: float = 0, left: bool = False) -> torch.Tensor:
    """Pad the last dimension of ``x`` to ``length`` with ``value``."""
    extra = length - x.shape[-1]
    if extra <= 0:
        return x
    return F.pad(x, (extra, 0) if left else (0, extra), value=value)


def concat_batches(shards: Sequence[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Join rollout shards into one batch, keeping row order (shard 0's rows first).

    Args:
        shards: batches from the rollout ranks, all with the same ``group_size``.
        pad_token_id: fills padded token positions (their masks are 0).

    Returns:
        One batch; per-token fields are zero where padded.
    """
    if len(shards) == 1:
        return shards[0]
    p_len = max(s.prompt_ids.shape[1] for s in shards)
    r_len = max(s.response_ids.shape[1] for s in shards)
    fields: dict[str, object] = {
        "prompt_ids": torch.cat(
            [pad_tokens(s.prompt_ids, p_len, pad_token_id, True) for s in shards]
        ),
        "prompt_mask": torch.cat([pad_tokens(s.prompt_mask, p_len, 0, True) for s in shards]),
        "response_ids": torch.cat(
            [pad_tokens(s.response_ids, r_len, pad_token_id) for s in shards]
        ),
        "response_mask": torch.cat([pad_tokens(s.response_mask, r_len) for s in shards]),
        "group_size": shards[0].group_size,
    }
    for name in _PER_ROW:
        values = [getattr(s, name) for s in shards]
        if all(v is not None for v in values):
            fields[name] = torch.cat(values)
    for name in _PER_TOKEN:
        values = [getattr(s, name) for s in shards]
        if all(v is not None for v in values):
            fields[name] = torch.cat([pad_tokens(v, r_len) for v in values])
    return RolloutBatch(**fields)


def with_scores(
    shards: Sequence[RolloutBatch],
    rewards: Sequence[Any],
    ref_logprobs: Sequence[torch.Tensor] | None = None,
    old_logprobs: Sequence[torch.Tensor] | None = None,
) -> list[RolloutBatch]:
    """The shards with their rewards (and reference / behaviour log-probs) set, shard by shard.

    Args:
        shards: the step's rollout shards, shard order.
        rewards: one ``[b]`` reward tensor per shard, or the reward worker's ``Scores``.
        ref_logprobs: ``[b, R]`` reference log-probs per shard, or None.
        old_logprobs: ``[b, R]`` behaviour log-probs per shard (the inference component's),
            or None to keep what the shards carry.
    """
    out = [
        s.replace(rewards=getattr(r, "rewards", r)) for s, r in zip(shards, rewards, strict=True)
    ]
    if ref_logprobs is not None:
        out = [s.replace(ref_logprobs=r) for s, r in zip(out, ref_logprobs, strict=True)]
    if old_logprobs is not None:
        out = [s.replace(old_logprobs=r) for s, r in zip(out, old_logprobs, strict=True)]
    return out
