"""Partial rollouts that continue (``trainer.partial_rollout=continue``): the pure tensor work.

A generation paused at a weight swap keeps what it sampled: a :class:`Parked` record holds the
rows as far as they got (tokens, the behaviour log-probs they were sampled with, and the weight
version of every token). When the generation resumes under newer weights, the rows still
decoding go back to the engine as longer prompts (prompt followed by the response so far,
:func:`continuation_prompts`); the engine recomputes their prefix under the new weights and
samples the rest of the token budget (``max_new_tokens`` minus the columns parked). :func:`stitch`
lays the continuation after the parked columns, so each row reads as one response whose tokens
carry the versions that sampled them.

``trainer.partial_rollout=carry`` on the torch engine uses the same records one row at a time:
a row starts as an empty :class:`Parked` (:func:`start`), each decoding segment continues the
rows holding slots together (:func:`joined_prompts`), and :func:`stitch` appends each row's
segment (cut to its token budget, :func:`first_columns`).

Nothing here runs a model: the engines (``continue_rows``) do; the rollout worker parks and
resumes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.sampling import left_padded


@dataclass(frozen=True)
class Parked:
    """A generation paused at a weight swap, as far as it got.

    Attributes:
        batch: ``B`` rows of ``t`` response columns; ``truncated`` marks the rows still decoding
            (no EOS yet); ``old_logprobs`` the behaviour log-probs when they were recorded.
        versions: ``[B, t]`` long, the weight version that sampled each column.
        started: the weight version the generation started with (its staleness counts from it).
    """

    batch: RolloutBatch
    versions: Tensor
    started: int

    @property
    def columns(self) -> int:
        """Response tokens sampled so far per decoding row (``t``)."""
        return int(self.batch.response_ids.shape[1])

    def live_rows(self) -> Tensor:
        """``[b]`` indices of the rows still decoding."""
        assert self.batch.truncated is not None  # the sampler sets it on every partial batch
        return self.batch.truncated.nonzero().squeeze(-1)


def park(partial: RolloutBatch, version: int, started: int) -> Parked:
    """A first pause: every column so far was sampled with ``version``.

    Args:
        partial: the sampler's rows at the pause (``GenerationStopped.partial``).
        version: the weights they were sampled with.
        started: the version the generation started with (``version`` at a first pause).
    """
    versions = torch.full(partial.response_ids.shape, version, dtype=torch.long)
    return Parked(partial, versions, started)


def start(prompt_ids: Tensor, prompt_mask: Tensor, version: int, with_logprobs: bool) -> Parked:
    """A row no token of which is sampled yet: ``[1, P]`` prompt, no response column, still
    decoding (``carry`` admits each new row as one).

    Args:
        prompt_ids: ``[1, P]`` the row's prompt (left padding allowed).
        prompt_mask: ``[1, P]``.
        version: the weights the row's group was admitted with (its staleness counts from it).
        with_logprobs: keep behaviour log-probs (an empty ``old_logprobs`` column block).
    """
    empty = torch.zeros((1, 0))
    batch = RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=empty.long(),
        response_mask=empty,
        old_logprobs=empty.clone() if with_logprobs else None,
        truncated=torch.ones(1, dtype=torch.bool),
    )
    return Parked(batch, empty.long(), version)


def joined_prompts(rows: list[Parked], pad_token_id: int) -> tuple[Tensor, Tensor]:
    """One continuation prompt per 1-row record (prompt, then its response so far), left-padded
    to a common length, so that rows of different groups and lengths decode together.

    Args:
        rows: 1-row records still decoding.
        pad_token_id: fills the left padding.

    Returns:
        ``(ids [b, L], mask [b, L])``, one row per record, in order.
    """
    seqs = []
    for parked in rows:
        ids, mask = continuation_prompts(parked)
        seqs.append(ids[0][mask[0].bool()])
    return left_padded(seqs, pad_token_id)


def first_columns(batch: RolloutBatch, columns: int) -> RolloutBatch:
    """``batch`` (an engine's continuation) cut to its first ``columns`` response columns: a row
    whose budget ends inside the segment; a row that loses tokens had no EOS in time
    (``truncated``)."""
    if batch.response_ids.shape[1] <= columns:
        return batch
    cut = batch.response_mask[:, columns:].sum(dim=1) > 0
    truncated = cut if batch.truncated is None else batch.truncated | cut
    logps = None if batch.old_logprobs is None else batch.old_logprobs[:, :columns]
    return batch.replace(
        response_ids=batch.response_ids[:, :columns],
        response_mask=batch.response_mask[:, :columns],
        old_logprobs=logps,
        truncated=truncated,
    )


def continuation_prompts(parked: Parked) -> tuple[Tensor, Tensor]:
    """The rows still decoding as prompts: each prompt followed by its response so far.

    A row still decoding has a token in every parked column (rows stop only at EOS), so the
    prompts keep the left padding of the original ones.

    Returns:
        ``(ids [b, P + t], mask [b, P + t])`` of the :meth:`Parked.live_rows`.
    """
    b = parked.batch
    rows = parked.live_rows()
    ids = torch.cat([b.prompt_ids, b.response_ids], dim=1)[rows]
    mask = torch.cat([b.prompt_mask, b.response_mask.long()], dim=1)[rows]
    return ids, mask


def stitch(parked: Parked, more: RolloutBatch, version: int, pad_token_id: int) -> Parked:
    """The parked rows with the continuation of their live rows appended.

    Args:
        parked: the generation as it was paused.
        more: the engine's continuation of :meth:`Parked.live_rows` (one row each, in that
            order, ``group_size`` 1), itself complete or paused again.
        version: the weights ``more`` was sampled with.
        pad_token_id: fills the columns of rows that had already ended.

    Returns:
        The rows with ``t + r`` columns (``truncated``: still no EOS); a completed generation
        when ``more`` was.
    """
    b, rows = parked.batch, parked.live_rows()
    t, r = parked.columns, int(more.response_ids.shape[1])

    def widen(x: Tensor, value: float, tail: Tensor | None) -> Tensor:
        out = F.pad(x, (0, r), value=value)
        if tail is not None:
            out[rows, t:] = tail.to(out.dtype)
        return out

    truncated = b.truncated.clone() if b.truncated is not None else None
    if truncated is not None and more.truncated is not None:
        truncated[rows] = more.truncated
    logps = None
    if b.old_logprobs is not None and more.old_logprobs is not None:
        logps = widen(b.old_logprobs, 0.0, more.old_logprobs)
    batch = b.replace(
        response_ids=widen(b.response_ids, pad_token_id, more.response_ids),
        response_mask=widen(b.response_mask, 0.0, more.response_mask),
        old_logprobs=logps,
        truncated=truncated,
    )
    versions = widen(parked.versions, -1, torch.full_like(more.response_ids, version))
    return Parked(batch, versions, parked.started)


def finished(parked: Parked) -> RolloutBatch:
    """The completed generation as the rollout hands it on: ``token_versions`` set (-1 where
    no token was sampled) and ``truncated`` where the token budget cut a response."""
    b = parked.batch
    versions = parked.versions.masked_fill(b.response_mask == 0, -1)
    return b.replace(token_versions=versions)


def sampled_tokens(batch: RolloutBatch) -> int:
    """Response tokens the engine sampled in ``batch`` (its response mask's sum)."""
    return int(batch.response_mask.sum())
