"""Continuous batching of turns: a KV-cached decoding batch that rows join and leave.

:class:`TurnDecoder` holds up to ``slots`` rows, each one turn of one episode. A row leaves as
soon as its turn ends (a stop id, or its token budget); a new turn joins by prefilling its
whole prefix (prompt and trajectory so far) and its cache is merged into the running batch's,
left-padded to the longer of the two (padding columns are masked out of attention and dropped
again once no row needs them). So while one episode waits on its tool, the others decode, and
an episode whose tool reply arrived decodes again from the next step on.

Sampling draws per turn, not per batch position: each row holds its own generator, seeded by
the turn's seed (:func:`rltrain.config.seeds.episode_turn_seed`), and draws one exponential race
(``argmax(p / q)``, ``q ~ Exp(1)``, what ``torch.multinomial`` does) per token. A turn's tokens
therefore depend on its seed and its prefix only, never on which rows shared its batch or when
it joined.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.sampling import (
    SamplingParams,
    left_padded,
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


@dataclass
class _Row:
    request: TurnRequest
    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class TurnDecoder:
    """The decoding batch of turns (see the module docstring).

    Args:
        model: a Hugging Face causal LM whose KV cache is a ``DynamicCache`` (full attention);
            the caller puts it in eval mode.
        params: sampling parameters (``max_new_tokens`` and ``n`` are not read: a turn's
            budget is its request's).
        stop_ids: ids that end a turn (kept as its last token).
        pad_id: the id left padding is written with.
        device: where the model is.
        slots: the most rows decoded at once.
        with_logprobs: record each sampled token's log-prob under the distribution it was
            drawn from (:func:`~rltrain.algorithms.sampling.sampled_logprobs`).
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
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.pad_id, self.slots, self.with_logprobs = pad_id, slots, with_logprobs
        self.rows: list[_Row] = []
        self.cache: Any = None  # the held rows' KV cache, [rows, heads, columns, dim] per layer
        self.attn = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.pos = torch.zeros(0, dtype=torch.long, device=device)  # each row's next position
        self.last = torch.zeros(0, dtype=torch.long, device=device)  # sampled, not yet fed
        self.forwards = 0  # forward passes run (prefills and decode steps)

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
        ids, attn, pos, past = self._prefill_inputs(requests)
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            past_key_values=past,
            use_cache=True,
        )
        self.forwards += 1
        rows = [_Row(r, torch.Generator(device=self.device).manual_seed(r.seed)) for r in requests]
        lengths = torch.tensor([len(r.prefix) for r in requests], device=self.device)
        self._merge(rows, out.past_key_values, attn, lengths)
        return self._sample(out.logits[:, -1, :], first=len(self.rows) - len(rows))

    @torch.no_grad()
    def step(self) -> list[TurnResult]:
        """One decoding step of every held row.

        Returns:
            The turns that ended at this step (they left the batch).
        """
        if not self.rows:
            return []
        ones = torch.ones((len(self.rows), 1), dtype=torch.long, device=self.device)
        self.attn = torch.cat([self.attn, ones], dim=1)
        out = self.model(
            input_ids=self.last[:, None],
            attention_mask=self.attn,
            position_ids=self.pos[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.forwards += 1
        self.cache, self.pos = out.past_key_values, self.pos + 1
        return self._sample(out.logits[:, -1, :], first=0)

    # ------------------------------------------------------------------------------ inside
    def _prefill_inputs(
        self, requests: Sequence[TurnRequest]
    ) -> tuple[Tensor, Tensor, Tensor, Any]:
        """The joining rows' forward inputs: each row's held cache columns (left-padded to the
        longest), then the ids it still needs (left-padded to the longest); padding is masked
        out of attention."""
        held = [0 if r.past is None else int(r.past[0][0].shape[1]) for r in requests]
        new = [list(r.prefix[h:]) for r, h in zip(requests, held, strict=True)]
        if any(not n for n in new):
            raise WorkerError("a turn's prefix must extend its held cache by at least one id")
        ids, new_mask = left_padded(new, self.pad_id, self.device, min_width=1)
        width = max(held)
        past_mask = torch.zeros((len(requests), width), dtype=torch.long, device=self.device)
        for i, h in enumerate(held):
            past_mask[i, width - h :] = 1
        start = torch.tensor(held, dtype=torch.long, device=self.device)[:, None]
        pos = torch.where(new_mask.bool(), start + new_mask.cumsum(-1) - 1, 0)
        attn = torch.cat([past_mask, new_mask], dim=1)
        if not width:
            return ids, attn, pos, None
        some = next(r.past for r in requests if r.past is not None)
        layers = []
        for layer, (k0, v0) in enumerate(some):  # one buffer per tensor, each row copied in
            keys = k0.new_zeros((len(requests), k0.shape[0], width, k0.shape[2]))
            values = v0.new_zeros((len(requests), v0.shape[0], width, v0.shape[2]))
            for i, (r, h) in enumerate(zip(requests, held, strict=True)):
                if h:
                    keys[i, :, width - h :] = r.past[layer][0]
                    values[i, :, width - h :] = r.past[layer][1]
            layers.append((keys, values))
        return ids, attn, pos, _cache(layers)

    def _sample(self, logits: Tensor, first: int) -> list[TurnResult]:
        """Pick the next token of rows ``first..`` (whose logits these are); retire ended turns."""
        rows = self.rows[first:]
        if self.params.greedy:
            picked = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(sampling_logits(logits, self.params), -1)
            race = torch.stack(
                [
                    torch.empty(
                        probs.shape[-1], dtype=probs.dtype, device=self.device
                    ).exponential_(1, generator=row.generator)
                    for row in rows
                ]
            )
            picked = (probs / race).argmax(dim=-1)
        logp = sampled_logprobs(logits, picked, self.params) if self.with_logprobs else None
        ended = []
        for i, (row, token) in enumerate(zip(rows, picked.tolist(), strict=True)):
            row.ids.append(token)
            row.logprobs.append(float(logp[i]) if logp is not None else 0.0)
            if token in self.stop_ids or len(row.ids) >= row.request.budget:
                ended.append(first + i)
        self.last[first:] = picked
        return self._retire(ended)

    def _retire(self, ended: list[int]) -> list[TurnResult]:
        if not ended:
            return []
        layers = _layers(self.cache)
        out = []
        for i in ended:  # each leaving row keeps its own columns: its next turn starts there
            columns = self.attn[i].bool()
            past = [(k[i][:, columns], v[i][:, columns]) for k, v in layers]
            row = self.rows[i]
            out.append(TurnResult(row.request.key, row.ids, row.logprobs, past))
        gone = set(ended)
        keep_list = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep_list]
        if not self.rows:
            self.cache = None
            self.attn = self.attn[:0, :0]
            self.pos, self.last = self.pos[:0], self.last[:0]
            return out
        keep = torch.tensor(keep_list, dtype=torch.long, device=self.device)
        attn = self.attn[keep]
        used = attn.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else attn.shape[1]  # columns no row attends to
        layers = [(k[keep, :, start:], v[keep, :, start:]) for k, v in _layers(self.cache)]
        self.cache = _cache(layers)
        self.attn, self.pos, self.last = attn[:, start:], self.pos[keep], self.last[keep]
        return out

    def _merge(self, rows: list[_Row], cache: Any, attn: Tensor, pos: Tensor) -> None:
        """Append prefilled rows (their cache, mask and next positions) to the batch."""
        last = torch.zeros(len(rows), dtype=torch.long, device=self.device)
        if not self.rows:
            self.rows, self.cache, self.attn = rows, cache, attn
            self.pos, self.last = pos, last
            return
        width = max(self.attn.shape[1], attn.shape[1])
        layers = [
            (
                torch.cat([_pad(k0, width), _pad(k1, width)]),
                torch.cat([_pad(v0, width), _pad(v1, width)]),
            )
            for (k0, v0), (k1, v1) in zip(_layers(self.cache), _layers(cache), strict=True)
        ]
        self.cache = _cache(layers)
        self.attn = torch.cat([_pad_mask(self.attn, width), _pad_mask(attn, width)])
        self.pos, self.last = torch.cat([self.pos, pos]), torch.cat([self.last, last])
        self.rows = self.rows + rows


def _layers(cache: Any) -> list[tuple[Tensor, Tensor]]:
    """A ``DynamicCache``'s keys and values per layer, ``[rows, heads, columns, dim]``."""
    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        raise WorkerError(
            f"continuous batching of turns needs a DynamicCache of full-attention layers; "
            f"the model returned a {type(cache).__name__}"
        )
    return [(layer.keys, layer.values) for layer in layers]


def _cache(layers: list[tuple[Tensor, Tensor]]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=layers)


def _pad(t: Tensor, width: int) -> Tensor:
    """Left-pad a cache tensor's column dimension (2) with zeros to ``width``."""
    extra = width - t.shape[2]
    if not extra:
        return t
    zeros = torch.zeros((*t.shape[:2], extra, *t.shape[3:]), dtype=t.dtype, device=t.device)
    return torch.cat([zeros, t], dim=2)


def _pad_mask(mask: Tensor, width: int) -> Tensor:
    extra = width - mask.shape[1]
    if not extra:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1)
