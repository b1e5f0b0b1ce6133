"""Continuous batching of turns: a KV-cached decoding batch that rows join and leave.

:class:`TurnDecoder` holds up to ``slots`` rows, each one turn of one episode. A row leaves as
soon as its turn ends (a stop id, or its token budget); a new turn joins by prefilling its
whole prefix (prompt and trajectory so far) and its cache is merged into the running batch's,
left-padded to the longer of the two (padding columns are masked out of attention and dropped
again once no row needs them). So while one episode waits on its tool, the others decode, and
an episode whose tool reply arrived decodes again from the next step on.

Sampling draws per turn, not per batch position: each row holds its own generator, seeded by
the turn's seed (:func:`rltrain.config.seeds.episode_turn_seed`), and draws one exponential race
(``argmax(p / q)``, ``q ~ Exp(1)``, what ``torch.multinomial`` does) per token, in its
generator's order. The races of several tokens are drawn at once, ahead (a small vocabulary's
whole turn at its join, :data:`RACE_VALUES`), so a decoding step makes no per-row generator call.
A turn's tokens therefore depend on its seed and its prefix only, never on which rows shared
its batch or when it joined.

The KV cache is held in buffers with spare columns (one write per step, not a copy of the
cache), and rows that left are dropped from it in bulk (see :class:`TurnDecoder`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.sampling import (
    COMPACT_SHARE,
    SamplingParams,
    sampled_logprobs,
    sampling_logits,
)
from rltrain.errors import WorkerError


@dataclass(frozen=True)
class TurnRequest:
    """One turn to decode.

    Attributes:
        key: the caller's name for it (handed back with the result).
        prefix: every id the turn is conditioned on (prompt and trajectory so far).
        budget: the most tokens the turn may sample (>= 1).
        seed: the turn's sampling seed.
        past: the episode's KV cache from its previous turn (:attr:`TurnResult.past`), which
            holds the first columns of ``prefix``: only the rest is prefilled. None: the
            whole prefix is.
    """

    key: Any
    prefix: Sequence[int]
    budget: int
    seed: int
    past: Any = None


@dataclass(frozen=True)
class TurnResult:
    """A finished turn: the sampled ids and their log-probs (0.0 each without log-probs).

    Attributes:
        past: the turn's KV cache, ``(keys, values)`` per layer ``[heads, columns, dim]``,
            covering its prefix and every sampled id but the last (never fed): handed back
            with the episode's next turn, it spares re-prefilling the whole trajectory.
    """

    key: Any
    ids: list[int]
    logprobs: list[float]
    past: Any = None


#: A row draws the races of ``min(max_new_tokens, RACE_VALUES // vocabulary)`` tokens at once
#: (at least one): a small vocabulary draws a whole turn's at its join (one generator call per
#: turn, not one per token). The count depends on the parameters only, never on the batch, so
#: a turn's draws are the same whenever it runs.
RACE_VALUES = 1 << 16


@dataclass
class _Row:
    request: TurnRequest
    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class TurnDecoder:
    """The decoding batch of turns (see the module docstring).

    The batch's KV cache lives in buffers with spare columns (:class:`_Columns`): a decoding
    step writes its column in place. A row that leaves stays in the buffers, decoded and
    ignored, until the leavers are :data:`~rltrain.algorithms.sampling.COMPACT_SHARE` of the
    rows or turns join (each copies the held rows once), so rows leaving one by one do not copy
    the cache each time.

    Args:
        model: a Hugging Face causal LM of full-attention layers (its KV cache a
            ``DynamicCache``); the caller puts it in eval mode.
        params: sampling parameters (``n`` is not read, and a turn's budget is its request's:
            ``max_new_tokens`` only sizes the races drawn ahead, :data:`RACE_VALUES`).
        stop_ids: ids that end a turn (kept as its last token).
        pad_id: the id left padding is written with.
        device: where the model is.
        slots: the most rows decoded at once.
        with_logprobs: record each sampled token's log-prob under the distribution it was
            drawn from (:func:`~rltrain.algorithms.sampling.sampled_logprobs`).

    Raises:
        WorkerError: no slot, or a model with other than full-attention layers.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        params: SamplingParams,
        stop_ids: Collection[int],
        pad_id: int,
        device: torch.device,
        slots: int,
        with_logprobs: bool,
    ) -> None:
        if slots < 1:
            raise WorkerError(f"a turn decoder needs at least one slot (got {slots})")
        self.model, self.params, self.device = model, params, device
        self.layer_count = _full_attention_layers(model)
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.pad_id, self.slots, self.with_logprobs = pad_id, slots, with_logprobs
        self.forwards = 0  # forward passes run (prefills and decode steps)
        self._reset()

    def _reset(self) -> None:
        self.held: list[_Row | None] = []  # the buffers' rows; None: left, not yet dropped
        self.layers: list[_Columns] = []
        self.attn = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)  # each row's next position
        self.last = torch.zeros(0, dtype=torch.long, device=self.device)  # sampled, not yet fed
        self.race: Tensor | None = None  # [rows, ahead, V] exponential draws, drawn ahead
        self.drawn = torch.zeros(0, dtype=torch.long, device=self.device)  # used of each row's

    @property
    def rows(self) -> list[_Row]:
        """The turns decoding."""
        return [r for r in self.held if r is not None]

    @property
    def free(self) -> int:
        """Slots a joining turn can take."""
        return self.slots - len(self.rows)

    @torch.no_grad()
    def join(self, requests: Sequence[TurnRequest]) -> list[TurnResult]:
        """Prefill turns into the batch and sample their first token.

        Args:
            requests: at most :attr:`free` turns.

        Returns:
            The turns that ended on their first token (they take no slot).

        Raises:
            WorkerError: more turns than free slots.
        """
        if len(requests) > self.free:
            raise WorkerError(f"{len(requests)} turns joined a decoder with {self.free} free slots")
        if not requests:
            return []
        ids, attn, pos, layers = self._prefill_inputs(requests)
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            past_key_values=_cache(layers),
            use_cache=True,
        )
        self.forwards += 1
        rows = [_Row(r, torch.Generator(device=self.device).manual_seed(r.seed)) for r in requests]
        lengths = torch.tensor([len(r.prefix) for r in requests], device=self.device)
        logits = out.logits[:, -1, :]
        self._merge(rows, layers, attn, lengths, logits.shape[-1])
        return self._sample(logits, first=len(self.held) - len(rows))

    @torch.no_grad()
    def step(self) -> list[TurnResult]:
        """One decoding step of every held row.

        Returns:
            The turns that ended at this step (they left the batch).
        """
        if not self.rows:
            return []
        ones = torch.ones((len(self.held), 1), dtype=torch.long, device=self.device)
        self.attn = torch.cat([self.attn, ones], dim=1)
        out = self.model(
            input_ids=self.last[:, None],
            attention_mask=self.attn,
            position_ids=self.pos[:, None],
            past_key_values=_cache(self.layers),
            use_cache=True,
        )
        self.forwards += 1
        self.pos = self.pos + 1
        return self._sample(out.logits[:, -1, :], first=0)

    # ------------------------------------------------------------------------------ inside
    def _prefill_inputs(
        self, requests: Sequence[TurnRequest]
    ) -> tuple[Tensor, Tensor, Tensor, list[_Columns]]:
        """The joining rows' forward inputs: each row's held cache columns (left-padded to the
        longest), then the ids it still needs (left-padded to the longest); padding is masked
        out of attention. The cache buffers have room for the ids prefilled, and, when no row
        is held, for the joining rows' budgets too (so the merge keeps them as they are)."""
        held = [0 if r.past is None else int(r.past[0][0].shape[1]) for r in requests]
        new = [list(r.prefix[h:]) for r, h in zip(requests, held, strict=True)]
        if any(not n for n in new):
            raise WorkerError("a turn's prefix must extend its held cache by at least one id")
        ids, new_mask = _left_padded(new, self.pad_id, self.device)
        width = max(held)
        lengths = torch.tensor(held, dtype=torch.long, device=self.device)
        columns = torch.arange(width, device=self.device)
        past_mask = (columns[None, :] >= width - lengths[:, None]).long()
        pos = torch.where(new_mask.bool(), lengths[:, None] + new_mask.cumsum(-1) - 1, 0)
        attn = torch.cat([past_mask, new_mask], dim=1)
        capacity = attn.shape[1] + (0 if self.rows else max(r.budget for r in requests))
        if not width:
            return ids, attn, pos, [_columns(None, None, capacity) for _ in range(self.layer_count)]
        # every held column lands at (its row, its column): one scatter per tensor, not per row
        rows = torch.arange(len(requests), device=self.device).repeat_interleave(lengths)
        starts = (lengths.cumsum(0) - lengths).repeat_interleave(lengths)
        at = (
            width
            - lengths.repeat_interleave(lengths)
            + torch.arange(rows.numel(), device=self.device)
            - starts
        )
        pasts = [r.past for r in requests if r.past is not None]
        layers = []
        for layer, (k0, v0) in enumerate(pasts[0]):
            keys = k0.new_zeros((len(requests), k0.shape[0], capacity, k0.shape[2]))
            values = v0.new_zeros((len(requests), v0.shape[0], capacity, v0.shape[2]))
            keys[rows, :, at] = torch.cat([p[layer][0] for p in pasts], dim=1).transpose(0, 1)
            values[rows, :, at] = torch.cat([p[layer][1] for p in pasts], dim=1).transpose(0, 1)
            layers.append(_columns(keys, values, width))
        return ids, attn, pos, layers

    def _sample(self, logits: Tensor, first: int) -> list[TurnResult]:
        """Pick the next token of rows ``first..`` (whose logits these are); retire ended turns."""
        if self.params.greedy:
            picked = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(sampling_logits(logits, self.params), -1)
            picked = (probs / self._races(first)).argmax(dim=-1)
        logp = sampled_logprobs(logits, picked, self.params) if self.with_logprobs else None
        logps = logp.tolist() if logp is not None else None
        ended = []
        for i, token in enumerate(picked.tolist()):
            row = self.held[first + i]
            if row is None:  # left the batch, still in its buffers
                continue
            row.ids.append(token)
            row.logprobs.append(logps[i] if logps is not None else 0.0)
            if token in self.stop_ids or len(row.ids) >= row.request.budget:
                ended.append(first + i)
        self.last[first:] = picked
        return self._retire(ended)

    def _races(self, first: int) -> Tensor:
        """Each row's exponential race for its next token (rows ``first..``), drawn from its
        own generator: a row whose drawn-ahead race is used up draws its next ones."""
        assert self.race is not None
        ahead = self.race.shape[1]
        for i in (self.drawn[first:] >= ahead).nonzero().flatten().tolist():
            row = self.held[first + i]
            if row is not None:
                self.race[first + i] = _draw(row.generator, ahead, self.race.shape[2], self.race)
            self.drawn[first + i] = 0
        index = torch.arange(first, len(self.held), device=self.device)
        race = self.race[index, self.drawn[first:]]
        self.drawn[first:] += 1
        return race

    def _retire(self, ended: list[int]) -> list[TurnResult]:
        out = []
        for i, past in zip(ended, self._pasts(ended), strict=True):
            row = self.held[i]
            assert row is not None
            out.append(TurnResult(row.request.key, row.ids, row.logprobs, past))
            self.held[i] = None
        live = len(self.rows)
        if not live:
            self._reset()
        elif len(self.held) - live >= COMPACT_SHARE * len(self.held):
            self._merge([], [], self.attn[:0, :0], self.pos[:0], 0)
        return out

    def _pasts(self, ended: list[int]) -> list[list[tuple[Tensor, Tensor]]]:
        """Each leaving row's own cache columns (its next turn starts there): copied out of the
        buffers in one gather per tensor; a row's columns are a slice of it unless a join with
        a held cache left padding between them."""
        if not ended:
            return []
        index = torch.tensor(ended, dtype=torch.long, device=self.device)
        mask = self.attn[index].bool()
        firsts = mask.long().argmax(dim=1).tolist()
        counts = mask.sum(dim=1).tolist()
        start, width = min(firsts), mask.shape[1]
        blocks = [(c.keys[index, :, start:], c.values[index, :, start:]) for c in self.layers]
        pasts = []
        for j, (first, count) in enumerate(zip(firsts, counts, strict=True)):
            if count == width - first:  # no gap: a view of the gathered block
                pasts.append(
                    [(k[j, :, first - start :], v[j, :, first - start :]) for k, v in blocks]
                )
            else:
                columns = mask[j, start:]
                pasts.append([(k[j][:, columns], v[j][:, columns]) for k, v in blocks])
        return pasts

    def _merge(
        self, rows: list[_Row], layers: list[_Columns], attn: Tensor, pos: Tensor, vocab: int
    ) -> None:
        """Drop the rows that left, and append prefilled rows (their cache, mask, next
        positions and races): the held rows' buffers are copied once, trimmed of the columns
        no row attends to, with room for the steps the rows' budgets allow."""
        keep = torch.tensor(
            [i for i, r in enumerate(self.held) if r is not None], dtype=torch.long
        ).to(self.device)
        old_attn = self.attn[keep]
        used = old_attn.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else old_attn.shape[1]
        old_attn = old_attn[:, start:]
        width = max(old_attn.shape[1], attn.shape[1])
        held = [*self.rows, *rows]
        self.held = list(held)
        room = max(r.request.budget for r in held)
        olds: list[_Columns | None] = list(self.layers) or [None] * len(layers)
        news: list[_Columns | None] = list(layers) or [None] * len(olds)
        self.layers = [
            _Columns.joined(a, keep, start, b, width, room) for a, b in zip(olds, news, strict=True)
        ]
        self.attn = torch.cat([_pad_mask(old_attn, width), _pad_mask(attn, width)])
        self.pos = torch.cat([self.pos[keep], pos])
        last = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        self.last = torch.cat([self.last[keep], last])
        self._merge_races(rows, keep, vocab)

    def _merge_races(self, rows: list[_Row], keep: Tensor, vocab: int) -> None:
        if self.params.greedy:
            return
        if self.race is None:
            ahead = max(1, min(self.params.max_new_tokens, RACE_VALUES // vocab))
            self.race = torch.empty((0, ahead, vocab), device=self.device)
        ahead = self.race.shape[1]
        new = [_draw(r.generator, ahead, self.race.shape[2], self.race) for r in rows]
        self.race = torch.cat([self.race[keep], *(n[None] for n in new)])
        zeros = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        self.drawn = torch.cat([self.drawn[keep], zeros])


class _Columns:
    """One layer's keys and values, ``[rows, heads, capacity, dim]`` buffers whose first columns
    are used: ``update`` writes the new columns in place, where transformers' ``DynamicLayer``
    (mixed in by :func:`_columns`) copies the whole cache into a new tensor at every step.

    Args:
        keys: the keys buffer (None: allocated at the first update).
        values: the values buffer, shaped as ``keys``.
        used: the columns of the buffers in use.
        capacity: the columns allocated at the first update (when ``keys`` is None).
    """

    keys: Tensor
    values: Tensor
    is_initialized: bool

    def __init__(self, keys: Tensor | None, values: Tensor | None, used: int, capacity: int = 0):
        super().__init__()  # DynamicLayer's
        self.capacity = capacity
        self.buffers = (keys, values)
        if keys is not None and values is not None:
            self.is_initialized, self.device = True, keys.device
            self.keys, self.values = keys[:, :, :used], values[:, :, :used]

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        shape = list(key_states.shape)
        shape[2] = max(self.capacity, shape[2])
        keys, values = key_states.new_zeros(shape), value_states.new_zeros(shape)
        self.__init__(keys, values, 0)  # type: ignore[misc]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.buffers
        assert keys is not None and values is not None
        start = self.keys.shape[2]
        end = start + key_states.shape[2]
        # the merge left room for every held row's budget: no step runs out of columns
        assert end <= keys.shape[2], f"cache buffer of {keys.shape[2]} columns, {end} needed"
        keys[:, :, start:end] = key_states
        values[:, :, start:end] = value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values

    @staticmethod
    def joined(
        held: _Columns | None,
        keep: Tensor,
        start: int,
        joining: _Columns | None,
        width: int,
        room: int,
    ) -> _Columns:
        """The rows ``keep`` of ``held`` from column ``start`` on, then ``joining``'s rows,
        right-aligned to ``width`` columns in new buffers with ``room`` spare columns."""
        if held is None and joining is not None:
            keys, values = joining.buffers
            assert keys is not None and values is not None
            if joining.keys.shape[2] == width and keys.shape[2] >= width + room:
                return joining  # the prefill allocated the room: nothing to copy
        parts = []
        if held is not None:
            k, v = held.keys[:, :, start:], held.values[:, :, start:]
            if keep.numel() < k.shape[0]:  # else every row stays: no gather
                k, v = k[keep], v[keep]
            parts.append((k, v))
        if joining is not None:
            parts.append((joining.keys, joining.values))
        k0, v0 = parts[0]
        rows = sum(k.shape[0] for k, _ in parts)
        keys = k0.new_empty((rows, k0.shape[1], width + room, k0.shape[3]))
        values = v0.new_empty((rows, v0.shape[1], width + room, v0.shape[3]))
        at = 0
        for k, v in parts:  # padding zeroed (masked, but 0 x NaN would not be 0); room is not read
            pad, end = width - k.shape[2], at + k.shape[0]
            keys[at:end, :, :pad], values[at:end, :, :pad] = 0, 0
            keys[at:end, :, pad:width], values[at:end, :, pad:width] = k, v
            at = end
        return _columns(keys, values, width)


def _columns(keys: Tensor | None, values: Tensor | None, used: int, capacity: int = 0) -> _Columns:
    """A :class:`_Columns` cache layer (transformers is imported on first use)."""
    return _columns_type()(keys, values, used, capacity)


@functools.cache
def _columns_type() -> type[_Columns]:
    from transformers.cache_utils import DynamicLayer

    return type("_Columns", (_Columns, DynamicLayer), {})


def _full_attention_layers(model: torch.nn.Module) -> int:
    """The model's layer count; refuses a model with other than full-attention layers."""
    config: Any = model.config
    config = config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise WorkerError(
            f"continuous batching of turns needs full-attention layers; the model has "
            f"{sorted(kinds)}"
        )
    return int(config.num_hidden_layers)


def _draw(generator: torch.Generator, ahead: int, vocab: int, like: Tensor) -> Tensor:
    """``ahead`` tokens' exponential races from a turn's generator (its sequence, in order)."""
    return like.new_empty((ahead, vocab)).exponential_(1, generator=generator)


def _cache(layers: list[_Columns]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = list(layers)  # type: ignore[arg-type]  # _Columns are DynamicLayers
    return cache


def _left_padded(
    rows: Sequence[Sequence[int]], pad: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """``(ids, mask)`` of id rows padded on the left, built in one tensor call each."""
    width = max(1, *(len(r) for r in rows))
    ids = [[pad] * (width - len(r)) + list(r) for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    return (
        torch.tensor(ids, dtype=torch.long, device=device),
        torch.tensor(mask, dtype=torch.long, device=device),
    )


def _pad_mask(mask: Tensor, width: int) -> Tensor:
    extra = width - mask.shape[1]
    if not extra:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1)
