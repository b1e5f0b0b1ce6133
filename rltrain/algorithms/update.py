"""One RL update over a rollout batch: advantages, then epochs of minibatch steps.

:func:`actor_loss` is the per-minibatch objective (what a distributed actor calls between its
own backward and optimizer steps); :func:`ppo_update` is the single-process loop around it and
:func:`value_update` the critic's. A minibatch may be split into micro-batches whose gradients
are accumulated (:func:`accumulate_step`), weighted so that the optimizer step equals the
one-shot step on the whole minibatch: either ``micro_batch`` rows at a time
(:func:`micro_slices`), or rows grouped under a token budget (:func:`token_micro_batches`,
``actor.max_tokens_per_micro_batch``). Every micro-batch's forward sees only its own padded
width (:func:`trim_padding`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.advantages import compute_advantages
from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.critic import ValueModel, compute_values
from rltrain.algorithms.logprobs import LogprobGap, compute_logprobs
from rltrain.algorithms.losses import aggregate, kl_penalty, value_loss
from rltrain.algorithms.registry import PolicyLossInputs, get_policy_loss
from rltrain.algorithms.shaping import overlong_penalties, without_truncated
from rltrain.config.schema import AlgorithmConfig
from rltrain.errors import ConfigError


@dataclass(frozen=True)
class UpdateSettings:
    """What an update reads, fixed once per run: the run's algorithm config itself, and the
    few settings of other sections the update needs.

    Attributes:
        algorithm: the run's :class:`~rltrain.config.schema.AlgorithmConfig` (``algorithm.*``),
            read as it is: a new algorithm key reaches every update without being copied here.
        grad_clip: ``optimizer.grad_clip``.
        temperature: ``rollout.temperature`` (log-probs are taken at the sampling temperature).
        max_new_tokens: ``rollout.max_new_tokens`` (the constant length normaliser, the
            overlong budget).
        old_logprobs: ``algorithm.old_logprobs`` with ``auto`` decided
            (:func:`~rltrain.config.numerics.resolve_old_logprobs`): ``recompute`` | ``rollout``.
    """

    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    grad_clip: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = 4
    old_logprobs: str = "recompute"

    @classmethod
    def from_config(cls, run_cfg: Any) -> UpdateSettings:
        """The settings of a :class:`rltrain.config.schema.RunConfig`."""
        from rltrain.config.numerics import resolve_old_logprobs

        return cls(
            algorithm=run_cfg.algorithm,
            grad_clip=run_cfg.optimizer.grad_clip,
            temperature=run_cfg.rollout.temperature,
            max_new_tokens=run_cfg.rollout.max_new_tokens,
            old_logprobs=resolve_old_logprobs(run_cfg),
        )

    @classmethod
    def of(cls, **fields: Any) -> UpdateSettings:
        """Settings from keyword fields of either this record or ``AlgorithmConfig`` (scripts
        and tests: ``UpdateSettings.of(clip_high=0.28, grad_clip=0.0)``).

        Raises:
            TypeError: a name that is neither.
        """
        own = {f.name for f in dataclasses.fields(cls)} - {"algorithm"}
        mine = {k: v for k, v in fields.items() if k in own}
        algorithm = AlgorithmConfig(**{k: v for k, v in fields.items() if k not in own})
        return cls(algorithm=algorithm, **mine)

    @property
    def uses_reference(self) -> bool:
        """True when a KL to the reference policy enters the reward or the loss."""
        return self.algorithm.kl_coef > 0

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps an update takes on one batch (epochs x minibatches)."""
        return self.algorithm.ppo_epochs * self.algorithm.num_minibatches


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


def update_minibatches(
    batch: RolloutBatch,
    s: UpdateSettings,
    generator: torch.Generator | None,
    loss_agg: str,
    ranks: Ranks | None,
) -> list[tuple[Tensor, float]]:
    """Every minibatch an update steps through, in order (``ppo_epochs`` shuffles of
    :func:`minibatch_indices`), each with this rank's share of it over the data-parallel ranks
    (:func:`rank_token_shares`: known before the first step, so the ranks agree on all of
    them in one collective).

    Args:
        batch: this rank's rows.
        s: the settings (epochs, minibatches).
        generator: shuffles the minibatches.
        loss_agg: the loss's aggregation (the critic's is ``token_mean``).
        ranks: the data-parallel ranks, or None for one.

    Returns:
        ``(row indices, share)`` per optimizer step.
    """
    a = s.algorithm
    plan = [
        idx
        for _ in range(a.ppo_epochs)
        for idx in minibatch_indices(batch.size, a.num_minibatches, generator)
    ]
    shares = rank_token_shares([batch.token_mask[i] for i in plan], loss_agg, ranks)
    return list(zip(plan, shares, strict=True))


@dataclass(frozen=True)
class Ranks:
    """The data-parallel ranks an update's gradients are averaged over.

    Attributes:
        size: the number of ranks.
        sum: sums a small float64 tensor over the ranks (a collective: every rank calls it,
            in the same order, with the same shape) and returns it on the host.
    """

    size: int
    sum: Callable[[Tensor], Tensor]


def rank_token_shares(masks: Sequence[Tensor], loss_agg: str, ranks: Ranks | None) -> list[float]:
    """The factor this rank's loss of each minibatch is scaled by so that, once the ranks
    average their gradients, a ``token_mean`` loss is the mean over every rank's tokens (each
    token weighs the same, as DAPO's token-level loss defines it) rather than the mean of the
    ranks' own means, which weighs a token on a rank of short responses more.

    ``size x (this rank's tokens / every rank's tokens)`` per minibatch, from one reduction
    for all of an update's minibatches. Other aggregations average over rows (or divide by a
    constant), and every rank holds as many rows: 1.

    Args:
        masks: this rank's token mask of each minibatch, in the order the update steps.
        loss_agg: the loss's aggregation (``algorithm.loss_agg``; the critic's is
            ``token_mean``).
        ranks: the data-parallel ranks, or None for one.

    Returns:
        One factor per minibatch (0 where no rank has a token: the loss is 0 there).
    """
    if loss_agg != "token_mean" or ranks is None or ranks.size <= 1:
        return [1.0] * len(masks)
    local = torch.tensor([float(m.float().sum()) for m in masks], dtype=torch.float64)
    total = ranks.sum(local.clone())
    return [
        ranks.size * float(n) / float(t) if t > 0 else 0.0
        for n, t in zip(local.tolist(), total.tolist(), strict=True)
    ]


def add_advantages(batch: RolloutBatch, s: UpdateSettings) -> RolloutBatch:
    """Fill ``advantages`` (and ``returns`` for GAE) from rewards, reference and values.

    DAPO's overlong shaping (``algorithm.overlong_buffer``) adds its penalty to the rewards
    first; ``algorithm.mask_truncated`` then drops the responses the budget cut from the loss
    (:mod:`rltrain.algorithms.shaping`): they count in their group's statistics, not in the
    update.

    Args:
        batch: needs ``rewards``; ``ref_logprobs`` and ``old_logprobs`` when the KL is in the
            reward; ``values`` for GAE; ``truncated`` for ``mask_truncated``.
        s: the settings.

    Returns:
        The batch with ``advantages`` (and ``returns``) set.

    Raises:
        ConfigError: a field the settings need is missing.
    """
    a = s.algorithm
    if batch.rewards is None:
        raise ConfigError("the rollout batch has no rewards: score it before the update")
    token_kl = None
    if a.kl_in == "reward" and a.kl_coef > 0:
        # The sampled tokens' log-probs known before the update: pi_old when it was computed
        # (an inference component, LoRA's own pass), else the rollout's.
        behaviour = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
        if batch.ref_logprobs is None or behaviour is None:
            raise ConfigError("algorithm.kl_in='reward' needs old and reference log-probs")
        token_kl = a.kl_coef * kl_penalty(behaviour, batch.ref_logprobs, a.kl_estimator)
    rewards = batch.rewards + overlong_penalties(
        batch.response_mask, s.max_new_tokens, a.overlong_buffer, a.overlong_penalty
    )
    adv, returns = compute_advantages(
        a.advantage_estimator,
        rewards,
        batch.token_mask,
        group_size=batch.group_size,
        norm_by_std=a.norm_adv_by_std,
        token_kl=token_kl,
        values=batch.values,
        gamma=a.gamma,
        lam=a.lam,
        valid=None if batch.infra_failed is None else ~batch.infra_failed,
    )
    out = batch.replace(advantages=adv, returns=returns)
    return without_truncated(out) if a.mask_truncated else out


def actor_loss(
    model: torch.nn.Module,
    mb: RolloutBatch,
    s: UpdateSettings,
    gap: LogprobGap | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The policy objective of one minibatch: the policy loss ``algorithm.policy_loss`` names
    (:func:`~rltrain.algorithms.registry.get_policy_loss`) + KL loss - entropy bonus.

    With ``old_logprobs=recompute`` and the rollout's log-probs present, the policy loss gets
    them for the truncated importance correction (``algorithm.tis_cap``; not the KL or entropy
    terms): per token for ``ppo_clip``, per response for ``gspo``.

    Args:
        model: the policy being trained.
        mb: a minibatch with ``advantages``; ``old_logprobs`` (if missing, the current
            log-probs, detached, stand in: exact for one on-policy step); ``ref_logprobs`` when
            the KL is in the loss; ``rollout_logprobs`` when the rollout recorded them.
        s: the settings.
        gap: counts this forward pass's log-probs against the rollout's (the first optimizer
            step of an update, whose weights are the ones before it), or None.

    Returns:
        ``(loss, metrics)``; call ``loss.backward()``.
    """
    a = s.algorithm
    logp, ent = compute_logprobs(
        model,
        mb.input_ids,
        mb.attention_mask,
        mb.response_mask,
        temperature=s.temperature,
        with_entropy=True,
        entropy_grad=a.entropy_coef != 0,  # a metric only: no vocabulary-wide autograd state
    )
    old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
    mask = mb.token_mask  # observation tokens and infra-failed rows are not trained on
    if gap is not None and mb.rollout_logprobs is not None:
        gap.add(logp, mb.rollout_logprobs, mask)
    corrected = s.old_logprobs == "recompute" and a.tis_cap is not None
    inputs = PolicyLossInputs(
        logp,
        old,
        mb.advantages,
        mask,
        rollout_logprobs=mb.rollout_logprobs if corrected else None,
        norm_len=s.max_new_tokens,
    )
    pg = get_policy_loss(a.policy_loss)(inputs, a)
    entropy = aggregate(ent, mask, a.loss_agg, s.max_new_tokens)
    loss = pg.loss - a.entropy_coef * entropy
    metrics = {
        "actor/pg_loss": pg.loss.item(),
        "actor/clip_frac": pg.clip_frac.item(),
        "actor/approx_kl": pg.approx_kl.item(),
        "actor/entropy": entropy.item(),
    }
    if pg.is_weights is not None:
        metrics.update(_tis_metrics(pg.is_weights, mask, a.tis_cap))
    if a.kl_in == "loss" and a.kl_coef > 0:
        if mb.ref_logprobs is None:
            raise ConfigError("algorithm.kl_in='loss' with kl_coef > 0 needs reference log-probs")
        kl_tokens = kl_penalty(logp, mb.ref_logprobs, a.kl_estimator)
        # The constant normaliser (seq_mean_token_sum_norm) is the response budget, as for the
        # other terms, not the batch's padded width, which micro-batches trim.
        kl = aggregate(kl_tokens, mask, a.loss_agg, s.max_new_tokens)
        loss = loss + a.kl_coef * kl
        metrics["actor/kl_loss"] = kl.item()
    return loss, metrics


@torch.no_grad()
def _tis_metrics(weights: Tensor, mask: Tensor, cap: float) -> dict[str, float]:
    m = mask.to(weights.dtype)
    n = m.sum().clamp(min=1.0)
    return {
        "actor/tis_weight_mean": float((weights * m).sum() / n),
        "actor/tis_clip_frac": float(((weights >= cap) * m).sum() / n),
    }


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
    a = s.algorithm
    vl = value_loss(v, mb.values, mb.returns, mb.token_mask, a.value_clip, "token_mean")
    return a.value_coef * vl, {"critic/value_loss": vl.item()}


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


def row_lengths(batch: RolloutBatch) -> tuple[Tensor, Tensor]:
    """Each row's prompt and response length as the padding lays them out.

    A left-padded prompt runs from its first real token to the last prompt column; a
    right-padded response runs from the first response column to its last masked-in token.

    Args:
        batch: the rows.

    Returns:
        ``(prompt_lengths, response_lengths)``, ``[B]`` long each.
    """
    prompt = batch.prompt_mask != 0
    first = prompt.float().argmax(dim=1)  # the first real token (argmax takes the first max)
    p = torch.where(prompt.any(dim=1), prompt.shape[1] - first, 0)
    response = batch.response_mask != 0
    after_last = response.shape[1] - response.flip(1).float().argmax(dim=1)
    r = torch.where(response.any(dim=1), after_last, 0)
    return p, r


def padded_width(prompt_length: int, response_length: int) -> int:
    """Columns a micro-batch keeps (:func:`trim_padding`) when its longest prompt and longest
    response have these lengths: their sum, each side at least one column."""
    return max(prompt_length, 1) + max(response_length, 1)


def token_micro_batches(
    prompt_lengths: Sequence[int] | Tensor,
    response_lengths: Sequence[int] | Tensor,
    max_tokens: int,
    min_parts: int = 1,
) -> list[Tensor]:
    """Group rows into as few micro-batches as a token budget allows, balanced.

    A micro-batch's cost is the tokens its forward sees: ``rows x padded width``, the width
    being its longest prompt plus its longest response (:func:`padded_width`; prompts are
    left-padded and responses right-padded separately, and each micro-batch is cut to its own
    width). Rows are sorted longest first so that similar lengths share a micro-batch (little
    padding), and cut into consecutive groups: the fewest the budget allows (at least
    ``min_parts``), with the smallest largest cost among such cuts (balanced). Gradients do not
    depend on the grouping: :func:`micro_weights` weighs any partition.

    Args:
        prompt_lengths: ``[B]`` prompt tokens per row (:func:`row_lengths`).
        response_lengths: ``[B]`` response tokens per row.
        max_tokens: the budget (``actor.max_tokens_per_micro_batch``).
        min_parts: at least this many micro-batches (data-parallel ranks whose engines need
            the same number of forward passes agree on the largest count), at most ``B``.

    Returns:
        Row indices of each micro-batch (ascending within one), costliest first; together a
        partition of ``0..B-1``.

    Raises:
        ConfigError: a single row is wider than the budget.
        ValueError: ``min_parts`` exceeds the rows.
    """
    p = [int(x) for x in prompt_lengths]
    r = [int(x) for x in response_lengths]
    n = len(p)
    if n == 0:
        return [torch.arange(0)]
    if min_parts > n:
        raise ValueError(f"{min_parts} micro-batches asked of {n} rows")
    widths = [padded_width(a, b) for a, b in zip(p, r, strict=True)]
    widest = max(range(n), key=lambda i: (widths[i], -i))
    if widths[widest] > max_tokens:
        raise ConfigError(
            f"actor.max_tokens_per_micro_batch={max_tokens} is smaller than row {widest} alone "
            f"({p[widest]} prompt + {r[widest]} response tokens = {widths[widest]}): set it to "
            f"at least task.max_prompt_length + rollout.max_new_tokens"
        )
    order = sorted(range(n), key=lambda i: (-widths[i], i))

    def cut(cap: int) -> list[list[int]]:
        groups: list[list[int]] = [[]]
        pmax = rmax = 0
        for i in order:
            wp, wr = max(pmax, p[i]), max(rmax, r[i])
            if groups[-1] and (len(groups[-1]) + 1) * padded_width(wp, wr) > cap:
                groups.append([])
                wp, wr = p[i], r[i]
            groups[-1].append(i)
            pmax, rmax = wp, wr
        return groups

    def cost(group: list[int]) -> int:
        return len(group) * padded_width(max(p[i] for i in group), max(r[i] for i in group))

    # Greedy cuts of a sorted order are the fewest for a cap, and fewer as the cap grows:
    # bisect for the smallest cap that needs no more micro-batches than the budget does.
    parts = max(len(cut(max_tokens)), min_parts)
    low, high = widths[widest], max_tokens
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if len(cut(mid)) <= parts else (mid + 1, high)
    groups = cut(low)
    while len(groups) < parts:  # only under min_parts: halve the costliest divisible group
        big = max((g for g in groups if len(g) > 1), key=cost)
        at = groups.index(big)
        groups[at : at + 1] = [big[: len(big) // 2], big[len(big) // 2 :]]
    groups.sort(key=cost, reverse=True)
    return [torch.tensor(sorted(g), dtype=torch.long) for g in groups]


def split_rows(
    batch: RolloutBatch, micro_batch: int = 0, max_tokens: int | None = None, min_parts: int = 1
) -> list[Tensor]:
    """The micro-batches of a minibatch: by token budget when ``max_tokens`` is set
    (:func:`token_micro_batches`), else ``micro_batch`` rows at a time (:func:`micro_slices`,
    ``min_parts`` unused)."""
    if max_tokens is None:
        return micro_slices(batch.size, micro_batch)
    return token_micro_batches(*row_lengths(batch), max_tokens, min_parts)


#: The rollout batch's ``[B, P]`` fields; every other 2-D tensor field is ``[B, R]``.
_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")


def trim_padding(batch: RolloutBatch) -> RolloutBatch:
    """The rows cut to their own padded width: prompt columns that are padding in every row
    (on the left) and response columns past every row's last token (on the right) dropped.

    Exact: the dropped columns are masked out of attention and out of every loss, positions
    count real tokens only, and a causal model's outputs at the kept columns do not depend on
    later ones. At least one column of each side is kept.

    Args:
        batch: the rows (a micro-batch).

    Returns:
        The batch with ``[b, P']`` prompt and ``[b, R']`` per-token fields, or ``batch`` itself
        when nothing is padding in every row.
    """
    big_p, big_r = batch.prompt_mask.shape[1], batch.response_mask.shape[1]
    p, r = row_lengths(batch)
    keep_p = min(max(int(p.max()) if batch.size else 0, 1), big_p)
    keep_r = min(max(int(r.max()) if batch.size else 0, 1), big_r)
    if (keep_p, keep_r) == (big_p, big_r):
        return batch
    cut: dict[str, Tensor] = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if f.name in _PROMPT_FIELDS:
            cut[f.name] = v[:, big_p - keep_p :]
        elif isinstance(v, Tensor) and v.dim() == 2 and v.shape[1] == big_r:
            cut[f.name] = v[:, :keep_r]
    return batch.replace(**cut)


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


def _backward(optimizer: Any, loss: Tensor) -> None:
    """``loss.backward()``, through the optimizer's loss scale when it has one (fp16 masters:
    :class:`~rltrain.backends.precision.MasterWeightOptimizer`)."""
    scale = getattr(optimizer, "scale_loss", None)
    (loss if scale is None else scale(loss)).backward()


def _clipped_step(params: Iterable[Tensor], optimizer: Any, grad_clip: float) -> float:
    """Clip the global gradient norm and step; returns the norm before clipping.

    An optimizer over fp32 masters clips and steps itself (``clip_and_step``): it takes the
    norm in fp32 and the loss scale out of it.
    """
    own = getattr(optimizer, "clip_and_step", None)
    if own is not None:
        return float(own(grad_clip))
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
    max_tokens: int | None = None,
    rank_share: float = 1.0,
) -> dict[str, float]:
    """One optimizer step on a minibatch, its gradient accumulated over micro-batches.

    Each micro-batch's loss is scaled by :func:`micro_weights`, so the accumulated gradient
    (and, after clipping the global norm, the step) equals the one-shot step on the whole
    minibatch. A DistributedDataParallel ``module`` all-reduces only on the last micro-batch
    (``no_sync`` on the others), so ranks may run different numbers of micro-batches. Each
    micro-batch is cut to its own padded width (:func:`trim_padding`).

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
        max_tokens: a token budget per micro-batch (:func:`token_micro_batches`) instead of
            ``micro_batch`` rows; None: rows.
        rank_share: scales the gradient (not the metrics) by this rank's share of the
            minibatch over the data-parallel ranks (:func:`rank_token_shares`); 1: one rank.

    Returns:
        The micro-batches' metrics combined with the same weights (this rank's own), plus
        ``grad_norm`` (the norm before clipping).

    Raises:
        ConfigError: a row is wider than ``max_tokens``.
    """
    parts = split_rows(mb, micro_batch, max_tokens)
    weights = micro_weights(mb.token_mask, parts, loss_agg)
    no_sync = getattr(module, "no_sync", None)
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = defaultdict(float)
    for i, (part, w) in enumerate(zip(parts, weights, strict=True)):
        last = i == len(parts) - 1
        with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
            micro = trim_padding(mb if len(parts) == 1 else mb.select(part))
            loss, metrics = loss_fn(module, micro)
            _backward(optimizer, loss * (w * rank_share))
        for k, v in metrics.items():
            sums[k] += w * v
    out = dict(sums)
    out["grad_norm"] = _clipped_step(module.parameters(), optimizer, grad_clip)
    if scheduler is not None:
        scheduler.step()
    return out


def _step(params: Any, optimizer: torch.optim.Optimizer, loss: Tensor, grad_clip: float) -> float:
    optimizer.zero_grad(set_to_none=True)
    _backward(optimizer, loss)
    return _clipped_step(params, optimizer, grad_clip)


@torch.no_grad()
def behaviour_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    s: UpdateSettings,
    micro_batch: int = 0,
    max_tokens: int | None = None,
    min_parts: int = 1,
) -> Tensor:
    """``[B, R]`` log-probs of the batch under ``model`` as it is now (the ``old_logprobs`` of a
    synchronous step), in eval mode: a policy's log-probs, not a draw of its (LoRA adapter)
    dropout. The model's mode is restored after.

    Args:
        model: the policy.
        batch: the rows.
        s: the settings (the sampling temperature).
        micro_batch: rows per forward pass; ``<= 0``: all at once.
        max_tokens: a token budget per forward pass instead (:func:`token_micro_batches`).
        min_parts: at least this many forward passes under ``max_tokens``.

    Returns:
        ``[B, R]`` log-probs in the batch's row order, zero outside the response mask.
    """
    parts = split_rows(batch, micro_batch, max_tokens, min_parts)
    out = torch.zeros(batch.response_mask.shape, device=batch.response_mask.device)
    training = model.training
    model.eval()
    try:
        for p in parts:
            b = trim_padding(batch if len(parts) == 1 else batch.select(p))
            logp = compute_logprobs(
                model, b.input_ids, b.attention_mask, b.response_mask, temperature=s.temperature
            )
            out[p.to(out.device), : logp.shape[1]] = logp
    finally:
        model.train(training)
    return out


def with_old_logprobs(
    batch: RolloutBatch, s: UpdateSettings, recompute: Callable[[RolloutBatch], Tensor]
) -> tuple[RolloutBatch, dict[str, float], LogprobGap | None]:
    """pi_old for an update (``s.old_logprobs``), and the rollout/trainer log-prob gap.

    - ``rollout``: the rollout's log-probs are pi_old.
    - ``recompute``: pi_old given with the batch (the inference component's) is kept; else,
      when the update takes more than one optimizer step, ``recompute`` computes it with the
      weights before the update (its seconds are ``actor/old_logprobs_s``); else it stays
      missing and the first step's forward pass, detached, is pi_old (same weights, no cost).

    The gap compares the rollout's log-probs with the trainer's for the weights before the
    update: pi_old itself when recomputed or given, otherwise the first optimizer step's
    forward pass, which the returned :class:`LogprobGap` is for (its minibatch's tokens).

    Args:
        batch: the rows, with ``rollout_logprobs`` when the rollout recorded them.
        s: the settings.
        recompute: ``batch -> [B, R]`` log-probs under the model as it is now.

    Returns:
        ``(batch with old_logprobs set or left missing as above, metrics known now, the gap
        counter for the first step or None)``.

    Raises:
        ConfigError: ``rollout`` without the rollout's log-probs.
    """
    metrics: dict[str, float] = {}
    if s.old_logprobs == "rollout":
        if batch.rollout_logprobs is None:
            raise ConfigError(
                "algorithm.old_logprobs='rollout' but the batch carries no rollout log-probs: "
                "the rollout records them in every reasoning run; batches built by hand need "
                "rollout_logprobs (or use algorithm.old_logprobs=recompute)"
            )
        batch = batch.replace(old_logprobs=batch.rollout_logprobs)
    elif batch.old_logprobs is None and s.steps_per_batch > 1:
        # Later steps must compare against the policy that sampled, not the updated one.
        start = time.perf_counter()
        batch = batch.replace(old_logprobs=recompute(batch))
        metrics["actor/old_logprobs_s"] = time.perf_counter() - start
    if batch.rollout_logprobs is None:
        return batch, metrics, None
    if s.old_logprobs == "recompute" and batch.old_logprobs is not None:
        gap = LogprobGap()
        gap.add(batch.old_logprobs, batch.rollout_logprobs, batch.token_mask)
        return batch, {**metrics, **gap.metrics()}, None
    return batch, metrics, LogprobGap()


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
    max_tokens: int | None = None,
    ranks: Ranks | None = None,
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
        max_tokens: padded tokens per forward/backward (``actor.max_tokens_per_micro_batch``,
            :func:`token_micro_batches`) instead of ``micro_batch`` rows; None: rows.
        ranks: the data-parallel ranks ``model`` averages gradients over (a ``token_mean``
            loss then weighs every rank's tokens alike: :func:`rank_token_shares`), or None.

    Returns:
        Metrics averaged over the minibatch steps (this rank's).

    Raises:
        ConfigError: a row is wider than ``max_tokens``.
    """
    batch, known, gap = with_old_logprobs(
        batch, s, lambda b: behaviour_logprobs(model, b, s, micro_batch, max_tokens)
    )
    model.train()
    sums: dict[str, float] = defaultdict(float)
    plan = update_minibatches(batch, s, generator, s.algorithm.loss_agg, ranks)
    for steps, (idx, share) in enumerate(plan):
        mb = batch.select(idx)
        # the first step's forward pass is at the weights before the update: the gap's
        loss_fn = functools.partial(actor_loss, s=s, gap=gap if steps == 0 else None)
        metrics = accumulate_step(
            model,
            optimizer,
            mb,
            loss_fn,
            micro_batch=micro_batch,
            loss_agg=s.algorithm.loss_agg,
            grad_clip=s.grad_clip,
            scheduler=scheduler,
            max_tokens=max_tokens,
            rank_share=share,
        )
        metrics["actor/grad_norm"] = metrics.pop("grad_norm")
        if critic is not None and critic_optimizer is not None:
            closs, cm = critic_loss(critic, mb, s)
            _step(critic.parameters(), critic_optimizer, closs, s.grad_clip)
            metrics.update(cm)
        for k, v in metrics.items():
            sums[k] += v
    out = {k: v / len(plan) for k, v in sums.items()}
    out.update(known)
    if gap is not None:
        out.update(gap.metrics())
    return out


def value_update(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    s: UpdateSettings,
    *,
    generator: torch.Generator | None = None,
    micro_batch: int = 0,
    scheduler: Any = None,
    max_tokens: int | None = None,
    ranks: Ranks | None = None,
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
        max_tokens: padded tokens per forward/backward instead of ``micro_batch`` rows (the
            critic has no such key yet: its engine passes None).
        ranks: the data-parallel ranks ``critic`` averages gradients over (the token-mean
            value loss then weighs every rank's tokens alike), or None.

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
    plan = update_minibatches(batch, s, generator, "token_mean", ranks)
    for idx, share in plan:
        metrics = accumulate_step(
            critic,
            optimizer,
            batch.select(idx),
            lambda m, micro: critic_loss(m, micro, s),
            micro_batch=micro_batch,
            loss_agg="token_mean",
            grad_clip=s.grad_clip,
            scheduler=scheduler,
            max_tokens=max_tokens,
            rank_share=share,
        )
        metrics["critic/grad_norm"] = metrics.pop("grad_norm")
        for k, v in metrics.items():
            sums[k] += v
    return {k: v / len(plan) for k, v in sums.items()}
