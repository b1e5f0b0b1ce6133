"""Per-token log-probabilities (and entropies) of responses under a causal LM."""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor

from rltrain.algorithms.losses import entropy_from_logits


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: 0 at each row's first real token.

    Args:
        attention_mask: ``[B, T]``, 1 on real tokens.

    Returns:
        ``[B, T]`` long positions (0 on the padding before the first real token).
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def response_logits(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_len: int
) -> Tensor:
    """Logits that predict the last ``response_len`` tokens of ``input_ids``.

    Args:
        model: a Hugging Face causal LM.
        input_ids: ``[B, P + R]`` prompt then response.
        attention_mask: ``[B, P + R]``.
        response_len: ``R``.

    Returns:
        ``[B, R, V]`` float logits; row ``t`` predicts response token ``t``.
    """
    keep = {"logits_to_keep": response_len + 1} if keeps_logits(model) else {}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        # the LM head runs on the positions that predict the response only: the prompt's
        # vocabulary-wide logits were the largest tensor of a long-prompt micro-batch
        **keep,
    )
    return out.logits[:, -response_len - 1 : -1].float()


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model`` (through DDP/DeepSpeed's ``.module``) takes Hugging Face's
    ``logits_to_keep`` (every causal LM of transformers 5, and PEFT's wrappers, which pass
    keyword arguments on)."""
    inner = model
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module
    return _forward_keeps_logits(type(inner))


@functools.cache
def _forward_keeps_logits(cls: type) -> bool:
    """Read once per model class: the log-prob pass asks on every micro-batch."""
    params = inspect.signature(cls.forward).parameters
    return "logits_to_keep" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def compute_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probabilities of the response tokens under ``model``.

    The logits are divided by the sampling ``temperature`` so the log-probs are those of the
    distribution the tokens were sampled from.

    Args:
        model: a Hugging Face causal LM.
        input_ids: ``[B, P + R]`` left-padded prompt followed by the response.
        attention_mask: ``[B, P + R]``.
        response_mask: ``[B, R]``, 1 on response tokens; ``R`` is read from its width.
        temperature: the sampling temperature.
        with_entropy: also return per-token entropies.
        entropy_grad: the entropies carry gradients (an entropy bonus); False computes them
            as a metric, without autograd and a slice of rows at a time, so they add no
            vocabulary-wide tensors to the micro-batch's peak.

    Returns:
        ``[B, R]`` log-probs, zero outside the mask; with ``with_entropy`` a pair
        ``(logprobs, entropy)`` of that shape.
    """
    r = response_mask.shape[1]
    logits = response_logits(model, input_ids, attention_mask, r) / temperature
    targets = input_ids[:, -r:]
    mask = response_mask.float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1) * mask
    if not with_entropy:
        return logp
    if entropy_grad:
        return logp, entropy_from_logits(logits) * mask
    return logp, entropy_metric(logits) * mask


#: Elements of one slice of :func:`entropy_metric` (64 MiB of fp32 logits).
ENTROPY_SLICE_ELEMENTS = 2**24


@torch.no_grad()
def entropy_metric(logits: Tensor) -> Tensor:
    """Per-position entropies of ``[..., V]`` logits without autograd, a slice of rows at a time.

    Returns:
        ``[...]`` float32 entropies in nats, equal to :func:`entropy_from_logits`'s.
    """
    flat = logits.detach().reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    rows = max(1, ENTROPY_SLICE_ELEMENTS // max(1, flat.shape[1]))
    for start in range(0, flat.shape[0], rows):
        out[start : start + rows] = entropy_from_logits(flat[start : start + rows])
    return out.reshape(logits.shape[:-1])


class LogprobGap:
    """The rollout/trainer log-prob gap: ``|log pi_trainer - log pi_rollout|`` over sampled
    response tokens, accumulated over micro-batches (mean and max).

    The parity check of ``rollout/logprob_gap_mean`` and ``rollout/logprob_gap_max``: both log
    the same policy's probability of the same tokens, so with the same weights the gap is float
    rounding, and anything larger is a numerics mismatch (or, with stale batches, the policy's
    drift since sampling).
    """

    def __init__(self) -> None:
        self.total = 0.0
        self.tokens = 0
        self.max = 0.0

    def add(self, trainer: Tensor, rollout: Tensor, response_mask: Tensor) -> None:
        """Count one micro-batch: ``[b, R]`` trainer and rollout log-probs and the mask."""
        keep = response_mask != 0
        if not bool(keep.any()):
            return
        diff = (trainer.detach().float() - rollout.float()).abs()[keep]
        self.total += float(diff.sum())
        self.tokens += int(diff.numel())
        self.max = max(self.max, float(diff.max()))

    def metrics(self) -> dict[str, float]:
        """``rollout/logprob_gap_mean``, ``_max`` and ``_tokens`` (empty before any token)."""
        if not self.tokens:
            return {}
        return {
            "rollout/logprob_gap_mean": self.total / self.tokens,
            "rollout/logprob_gap_max": self.max,
            "rollout/logprob_gap_tokens": float(self.tokens),
        }
