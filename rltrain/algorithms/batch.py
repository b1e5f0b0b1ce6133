"""The rollout batch: what generation hands to reward, reference, critic and actor.

Shapes: ``B`` sequences (prompts repeated ``n`` times, the ``n`` samples of a prompt adjacent),
``P`` prompt tokens (left-padded), ``R`` response tokens (right-padded after EOS).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from rltrain.wire import TensorRecord


@dataclass(frozen=True)
class RolloutBatch(TensorRecord):
    """Token ids and per-token statistics of one rollout batch.

    Attributes:
        prompt_ids: ``[B, P]`` long, left-padded prompts.
        prompt_mask: ``[B, P]`` long, 1 on real prompt tokens.
        response_ids: ``[B, R]`` long, generated tokens; pad after the first EOS.
        response_mask: ``[B, R]`` float, 1 on generated tokens up to and including the first EOS.
        group_size: samples per prompt (``n``); groups are consecutive rows.
        rewards: ``[B]`` float outcome rewards, once scored.
        old_logprobs: ``[B, R]`` log-probs under the policy that generated the batch.
        ref_logprobs: ``[B, R]`` log-probs under the reference policy (KL).
        values: ``[B, R]`` critic values of the state before each response token (PPO).
        advantages: ``[B, R]`` per-token advantages.
        returns: ``[B, R]`` value targets (PPO).
        rollout_logprobs: ``[B, R]`` log-probs the rollout engine recorded while sampling (of
            the distribution sampled: temperature and top-p applied); ``old_logprobs`` is
            pi_old, which ``algorithm.old_logprobs`` takes from these or from a recompute.
        truncated: ``[B]`` bool, True where the response reached ``rollout.max_new_tokens``
            without an EOS (the token budget cut it), for a truncation mask or an overlong
            penalty; set by both generation engines, None for batches not generated.
        token_versions: ``[B, R]`` long, the weight version that sampled each response token
            (meaningful where ``response_mask`` is 1). One version per row unless a partial
            rollout continued the row under newer weights (``trainer.partial_rollout=continue``);
            set by the rollout worker, None for batches not generated.
        discarded_tokens: response tokens the rollout sampled for this shard's step and threw
            away (``trainer.partial_rollout=restart``: the cancelled passes); set by the rollout
            when ``trainer.max_staleness >= 1``, else None.
        loss_mask: ``[B, R]`` float, 1 on the response tokens the policy is trained on; None:
            the response mask. A multi-turn rollout's observation tokens (tool results) are in
            the response (attended to, ``response_mask`` 1) but not trained on (0 here); an
            infra-failed episode is 0 throughout.
        env_rewards: ``[B]`` float rewards an environment gave its episodes (multi-turn
            rollouts); the rule reward takes them instead of scoring the text.
        infra_failed: ``[B]`` bool, True where a tool raised or timed out: the row is left out
            of the group statistics and the loss (not scored 0).
        turns: ``[B]`` long, model turns each episode took (multi-turn rollouts).
        tool_calls: ``[B]`` long, tool calls each episode made (multi-turn rollouts).
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    group_size: int = 1
    rewards: Tensor | None = None
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    truncated: Tensor | None = None
    token_versions: Tensor | None = None
    discarded_tokens: int | None = None
    loss_mask: Tensor | None = None
    env_rewards: Tensor | None = None
    infra_failed: Tensor | None = None
    turns: Tensor | None = None
    tool_calls: Tensor | None = None

    @property
    def size(self) -> int:
        """Number of sequences ``B``."""
        return int(self.response_ids.shape[0])

    @property
    def token_mask(self) -> Tensor:
        """``[B, R]`` the tokens every loss and advantage averages over: ``loss_mask`` when
        set, else ``response_mask``."""
        return self.response_mask if self.loss_mask is None else self.loss_mask

    @property
    def input_ids(self) -> Tensor:
        """``[B, P + R]`` prompt followed by response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """``[B, P + R]`` long, 1 on real tokens."""
        return torch.cat([self.prompt_mask, self.response_mask.long()], dim=1)

    def replace(self, **fields: Tensor | None) -> RolloutBatch:
        """A copy with some fields set (records are frozen)."""
        return dataclasses.replace(self, **fields)

    def select(self, index: Tensor) -> RolloutBatch:
        """The rows ``index`` of every tensor field (a minibatch).

        Args:
            index: ``[b]`` long row indices.

        Returns:
            A batch of ``b`` rows; ``group_size`` is kept but groups may be split.
        """
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v[index] if isinstance(v, Tensor) else v
        return RolloutBatch(**out)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on ``device``."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to(device) if isinstance(v, Tensor) else v
        return RolloutBatch(**out)
