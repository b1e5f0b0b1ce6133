"""One RL update over a rollout batch: advantages, then epochs of minibatch steps.

:func:`actor_loss` is the per-minibatch objective (what a distributed actor calls between its
own backward and optimizer steps); :func:`ppo_update` is the single-process loop around it and
:func:`value_update` the critic's. A minibatch may be split into micro-batches whose gradients
are accumulated (:func:`accumulate_step`), weighted so that the optimizer step equals the
one-shot step on the whole minibatch.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.advantages import compute_advantages
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.critic import ValueModel, compute_values
from rltrain.algorithms.logprobs import compute_logprobs
from rltrain.algorithms.losses import aggregate, kl_penalty, policy_loss, value_loss
from rltrain.errors import ConfigError


@dataclass(frozen=True)
class UpdateSettings:
    """Everything an update needs from the config, fixed once per run.

    Field meanings are those of ``algorithm.*``; ``grad_clip`` is ``optimizer.grad_clip``,
    ``temperature`` and ``max_new_tokens`` are ``rollout.*``.
    """

    advantage_estimator: str = "grpo"
    norm_adv_by_std: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token_mean"
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    ppo_epochs: int = 1
    num_minibatches: int = 1
    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.2
    value_coef: float = 0.5
    grad_clip: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = 4

    @classmethod
    def from_config(cls, run_cfg: Any) -> UpdateSettings:
        """Collect the settings from a :class:`rltrain.config.schema.RunConfig`."""
        a, o, r = run_cfg.algorithm, run_cfg.optimizer, run_cfg.rollout
        names = (
            "advantage_estimator norm_adv_by_std clip_low clip_high loss_agg entropy_coef kl_coef "
            "kl_estimator kl_in ppo_epochs num_minibatches gamma lam value_clip value_coef"
        ).split()
        return cls(
            **{n: getattr(a, n) for n in names},
            grad_clip=o.grad_clip,
            temperature=r.temperature,
            max_new_tokens=r.max_new_tokens,
        )

    @property
    def uses_reference(self) -> bool:
        """True when a KL to the reference policy enters the reward or the loss."""
        return self.kl_coef > 0


def minibatch_indices(
    batch_size: int, num_minibatches: int, generator: torch.Generator | None = None
) -> list[Tensor]:
    """Split a shuffled ``0..batch_size-1`` into ``num_minibatches`` near-equal index sets.

    Raises:
        ConfigError: more minibatches than sequences.
    """
    if not 1 <= num_minibatches <= batch_size:
        raise ConfigError(
            f"algorithm.num_minibatches={num_minibatches} must be between 1 and the "
            f"{batch_size} sequences of a step (train_batch_size * n_samples_per_prompt)"
        )
    perm = torch.randperm(batch_size, generator=generator)
    return list(torch.tensor_split(perm, num_minibatches))


def add_advantages(batch: RolloutBatch, s: UpdateSettings) -> RolloutBatch:
    """Fill ``advantages`` (and ``returns`` for GAE) from rewards, reference and values.

    Args:
        batch: needs ``rewards``; ``ref_logprobs`` and ``old_logprobs`` when the KL is in the
            reward; ``values`` for GAE.
        s: the settings.

    Returns:
        The batch with ``advantages`` (and ``returns``) set.

    Raises:
        ConfigError: a field the settings need is missing.
    """
    if batch.rewards is None:
        raise ConfigError("the rollout batch has no rewards: score it before the update")
    token_kl = None
    if s.kl_in == "reward" and s.kl_coef > 0:
        if batch.ref_logprobs is None or batch.old_logprobs is None:
            raise ConfigError("algorithm.kl_in='reward' needs old and reference log-probs")
        token_kl = s.kl_coef * kl_penalty(batch.old_logprobs, batch.ref_logprobs, s.kl_estimator)
    adv, returns = compute_advantages(
        s.advantage_estimator,
        batch.rewards,
        batch.response_mask,
        group_size=batch.group_size,
        norm_by_std=s.norm_adv_by_std,
        token_kl=token_kl,
        values=batch.values,
        gamma=s.gamma,
        lam=s.lam,
    )
    return batch.replace(advantages=adv, returns=returns)


def actor_loss(
    model: torch.nn.Module, mb: RolloutBatch, s: UpdateSettings
) -> tuple[Tensor, dict[str, float]]:
    """The policy objective of one minibatch: clipped surrogate + KL loss - entropy bonus.

    Args:
        model: the policy being trained.
        mb: a minibatch with ``advantages``; ``old_logprobs`` (if missing, the current
            log-probs, detached, stand in: exact for one on-policy step); ``ref_logprobs`` when
            the KL is in the loss.
        s: the settings.

    Returns:
        ``(loss, metrics)``; call ``loss.backward()``.
    """
    logp, ent = compute_logprobs(
        model,
        mb.input_ids,
        mb.attention_mask,
        mb.response_mask,
        temperature=s.temperature,
        with_entropy=True,
    )
    old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
    mask = mb.response_mask
    pg = policy_loss(
        logp, old, mb.advantages, mask, s.clip_low, s.clip_high, s.loss_agg, s.max_new_tokens
    )
    entropy = aggregate(ent, mask, s.loss_agg, s.max_new_tokens)
    loss = pg.loss - s.entropy_coef * entropy
    metrics = {
        "actor/pg_loss": pg.loss.item(),
        "actor/clip_frac": pg.clip_frac.item(),
        "actor/approx_kl": pg.approx_kl.item(),
        "actor/entropy": entropy.item(),
    }
    if s.kl_in == "loss" and s.kl_coef > 0:
        if mb.ref_logprobs is None:
            raise ConfigError("algorithm.kl_in='loss' with kl_coef > 0 needs reference log-probs")
        kl = aggregate(kl_penalty(logp, mb.ref_logprobs, s.kl_estimator), mask, s.loss_agg)
        loss = loss + s.kl_coef * kl
        metrics["actor/kl_loss"] = kl.item()
    return loss, metrics


def critic_loss(
    critic: torch.nn.Module, mb: RolloutBatch, s: UpdateSettings
) -> tuple[Tensor, dict[str, float]]:
    """The clipped value loss of one minibatch (scaled by ``value_coef``).

    Args:
        critic: the value model (:class:`ValueModel`, or its DDP wrapper).
        mb: a minibatch with ``values`` (at rollout time) and ``returns``.
        s: the settings.

    Returns:
        ``(loss, metrics)``.
    """
    v = compute_values(critic, mb.input_ids, mb.attention_mask, mb.response_mask)
    vl = value_loss(v, mb.values, mb.returns, mb.response_mask, s.value_clip, "token_mean")
    return s.value_coef * vl, {"critic/value_loss": vl.item()}


def micro_slices(size: int, micro_batch: int) -> list[Tensor]:
    """Consecutive row ranges of at most ``micro_batch`` rows covering ``0..size-1``.

    Args:
        size: rows in the minibatch.
        micro_batch: rows per forward/backward; ``<= 0`` (or ``>= size``) keeps one piece.

    Returns:
        ``ceil(size / micro_batch)`` index tensors, in order.
    """
    step = size if micro_batch <= 0 else min(micro_batch, size)
    return [torch.arange(i, min(i + step, size)) for i in range(0, max(size, 1), max(step, 1))]


def micro_weights(response_mask: Tensor, parts: list[Tensor], loss_agg: str) -> list[float]:
    """The factor each micro-batch's loss is scaled by, so their gradients add up to the
    gradient of the loss over the whole minibatch.

    Token-mean losses divide by the minibatch's response tokens, so a micro-batch weighs its
    share of them; every other aggregation averages over sequences (or divides by
    ``rows x constant``), so a micro-batch weighs its share of rows.

    Args:
        response_mask: ``[B, R]`` of the minibatch.
        parts: row indices of each micro-batch (a partition of ``0..B-1``).
        loss_agg: the aggregation of the loss (``algorithm.loss_agg``; the critic's value loss
            is ``token_mean``).

    Returns:
        One weight per part; they sum to 1 (0 each when the minibatch has no response token
        under ``token_mean``, where the whole loss is 0 too).
    """
    if loss_agg == "token_mean":
        tokens = response_mask.float().sum(dim=1)
        total = float(tokens.sum())
        return [float(tokens[p].sum()) / total if total > 0 else 0.0 for p in parts]
    rows = response_mask.shape[0]
    return [len(p) / rows for p in parts]


def _clipped_step(
    params: Iterable[Tensor], optimizer: torch.optim.Optimizer, grad_clip: float
) -> float:
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    return float(norm)


def accumulate_step(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mb: RolloutBatch,
    loss_fn: Callable[[torch.nn.Module, RolloutBatch], tuple[Tensor, dict[str, float]]],
    *,
    micro_batch: int = 0,
    loss_agg: str = "token_mean",
    grad_clip: float = 0.0,
    scheduler: Any = None,
) -> dict[str, float]:
    """One optimizer step on a minibatch, its gradient accumulated over micro-batches.

    Each micro-batch's loss is scaled by :func:`micro_weights`, so the accumulated gradient
    (and, after clipping the global norm, the step) equals the one-shot step on the whole
    minibatch. A DistributedDataParallel ``module`` all-reduces only on the last micro-batch
    (``no_sync`` on the others).

    Args:
        module: the model, or its DDP wrapper.
        optimizer: its optimizer.
        mb: the minibatch.
        loss_fn: ``(module, micro_batch) -> (loss, metrics)``, the loss aggregated by
            ``loss_agg`` over the micro-batch.
        micro_batch: rows per forward/backward; ``<= 0``: the whole minibatch at once.
        loss_agg: how ``loss_fn`` aggregates (decides the weights).
        grad_clip: max global gradient norm; ``<= 0`` disables clipping.
        scheduler: a learning-rate scheduler stepped after the optimizer step (the linear
            warmup of ``optimizer.warmup_steps``), or None.

    Returns:
        The micro-batches' metrics combined with the same weights, plus ``grad_norm`` (the
        norm before clipping).
    """
    parts = micro_slices(mb.size, micro_batch)
    weights = micro_weights(mb.response_mask, parts, loss_agg)
    no_sync = getattr(module, "no_sync", None)
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = defaultdict(float)
    for i, (part, w) in enumerate(zip(parts, weights, strict=True)):
        last = i == len(parts) - 1
        with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
            loss, metrics = loss_fn(module, mb if len(parts) == 1 else mb.select(part))
            (loss * w).backward()
        for k, v in metrics.items():
            sums[k] += w * v
    out = dict(sums)
    out["grad_norm"] = _clipped_step(module.parameters(), optimizer, grad_clip)
    if scheduler is not None:
        scheduler.step()
    return out


def _step(params: Any, optimizer: torch.optim.Optimizer, loss: Tensor, grad_clip: float) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return _clipped_step(params, optimizer, grad_clip)


@torch.no_grad()
def behaviour_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, s: UpdateSettings, micro_batch: int = 0
) -> Tensor:
    """``[B, R]`` log-probs of the batch under ``model`` as it is now, ``micro_batch`` rows at a
    time (the ``old_logprobs`` of a synchronous step)."""
    parts = micro_slices(batch.size, micro_batch)
    out = []
    for p in parts:
        b = batch if len(parts) == 1 else batch.select(p)
        out.append(
            compute_logprobs(
                model, b.input_ids, b.attention_mask, b.response_mask, temperature=s.temperature
            )
        )
    return torch.cat(out)


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    s: UpdateSettings,
    *,
    critic: ValueModel | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
    micro_batch: int = 0,
    scheduler: Any = None,
) -> dict[str, float]:
    """Train on one rollout batch: ``ppo_epochs`` passes of ``num_minibatches`` steps each.

    Args:
        model: the policy (put in train mode for the call).
        optimizer: its optimizer.
        batch: a batch with ``advantages`` (see :func:`add_advantages`).
        s: the settings.
        critic: the value model, trained alongside when given (needs ``returns`` and ``values``).
        critic_optimizer: its optimizer.
        generator: shuffles the minibatches.
        micro_batch: rows per forward/backward (gradients accumulated, see
            :func:`accumulate_step`); ``<= 0``: each minibatch at once.
        scheduler: stepped after every optimizer step of the policy (warmup), or None.

    Returns:
        Metrics averaged over the minibatch steps.
    """
    if batch.old_logprobs is None and (s.ppo_epochs > 1 or s.num_minibatches > 1):
        # Later steps must compare against the policy that sampled, not the updated one.
        batch = batch.replace(old_logprobs=behaviour_logprobs(model, batch, s, micro_batch))
    model.train()
    sums: dict[str, float] = defaultdict(float)
    steps = 0
    for _ in range(s.ppo_epochs):
        for idx in minibatch_indices(batch.size, s.num_minibatches, generator):
            mb = batch.select(idx)
            metrics = accumulate_step(
                model,
                optimizer,
                mb,
                lambda m, micro: actor_loss(m, micro, s),
                micro_batch=micro_batch,
                loss_agg=s.loss_agg,
                grad_clip=s.grad_clip,
                scheduler=scheduler,
            )
            metrics["actor/grad_norm"] = metrics.pop("grad_norm")
            if critic is not None and critic_optimizer is not None:
                closs, cm = critic_loss(critic, mb, s)
                _step(critic.parameters(), critic_optimizer, closs, s.grad_clip)
                metrics.update(cm)
            for k, v in metrics.items():
                sums[k] += v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


def value_update(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    s: UpdateSettings,
    *,
    generator: torch.Generator | None = None,
    micro_batch: int = 0,
    scheduler: Any = None,
) -> dict[str, float]:
    """Train the critic on one rollout batch: ``ppo_epochs`` x ``num_minibatches`` steps of the
    clipped value loss (:func:`critic_loss`), as :func:`ppo_update` does for the policy.

    Args:
        critic: the value model (or its DDP wrapper), put in train mode for the call.
        optimizer: its optimizer.
        batch: a batch with ``values`` (at rollout time) and ``returns``.
        s: the settings.
        generator: shuffles the minibatches.
        micro_batch: rows per forward/backward; ``<= 0``: each minibatch at once.
        scheduler: stepped after every optimizer step (warmup), or None.

    Returns:
        Metrics averaged over the minibatch steps: ``critic/value_loss``, ``critic/grad_norm``.

    Raises:
        ConfigError: the batch has no values or returns.
    """
    if batch.values is None or batch.returns is None:
        raise ConfigError(
            "the critic trains on value targets: algorithm.advantage_estimator must be 'gae' "
            "and the batch must carry the critic's rollout-time values"
        )
    critic.train()
    sums: dict[str, float] = defaultdict(float)
    steps = 0
    for _ in range(s.ppo_epochs):
        for idx in minibatch_indices(batch.size, s.num_minibatches, generator):
            metrics = accumulate_step(
                critic,
                optimizer,
                batch.select(idx),
                lambda m, micro: critic_loss(m, micro, s),
                micro_batch=micro_batch,
                loss_agg="token_mean",
                grad_clip=s.grad_clip,
                scheduler=scheduler,
            )
            metrics["critic/grad_norm"] = metrics.pop("grad_norm")
            for k, v in metrics.items():
                sums[k] += v
            steps += 1
    return {k: v / steps for k, v in sums.items()}
