"""Sampling from a causal LM and greedy evaluation.

One loop with a KV cache serves rollouts (temperature, top-p, ``n`` samples per prompt) and greedy
evaluation. It stops per row on EOS and for the batch when every row has stopped or
``max_new_tokens`` is reached; rows that stopped leave the decoding batch and the KV cache
(:data:`COMPACT_SHARE`), so long responses do not pay for decoding padding. Dropping rows never
changes what is sampled (see :func:`_pick`). Works with any Hugging Face causal LM and left-padded
prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rltrain.algorithms.batch import RolloutBatch
from rltrain.algorithms.logprobs import position_ids_from_mask
from rltrain.errors import ConfigError
from rltrain.tasks.tokenizer import prompt_token_ids


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses (the ``rollout.*`` keys).

    Attributes:
        max_new_tokens: the most tokens generated per response.
        temperature: logits are divided by it before sampling.
        top_p: nucleus sampling: keep the smallest set of tokens whose probability reaches it.
        n: samples per prompt; a prompt's samples are consecutive rows.
        greedy: take the arg-max token (temperature and top-p ignored).
    """

    max_new_tokens: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    greedy: bool = False

    @classmethod
    def from_rollout(cls, rollout: Any) -> SamplingParams:
        """The parameters of a ``rollout`` config section (``RolloutConfig``)."""
        return cls(
            max_new_tokens=rollout.max_new_tokens,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            n=rollout.n_samples_per_prompt,
        )

    def __post_init__(self) -> None:
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"rollout.max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.temperature <= 0:
            problems.append(f"rollout.temperature={self.temperature} must be > 0 (or greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"rollout.top_p={self.top_p} must be in (0, 1]")
        if self.n < 1:
            problems.append(f"rollout.n_samples_per_prompt={self.n} must be >= 1")
        if problems:
            raise ConfigError(problems)


def encode_prompts(tokenizer: Any, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
    """Tokenise prompts (see :func:`prompt_token_ids`), padded on the left.

    Args:
        tokenizer: a Hugging Face tokenizer (its ``pad_token_id`` fills the padding).
        prompts: the prompt texts.

    Returns:
        ``(ids [B, P], mask [B, P])`` long tensors.
    """
    tokenizer.padding_side = "left"
    return left_padded(prompt_token_ids(tokenizer, prompts), tokenizer.pad_token_id)


def left_padded(
    rows: Sequence[Sequence[int]],
    pad: int,
    device: torch.device | str = "cpu",
    min_width: int = 0,
) -> tuple[Tensor, Tensor]:
    """Token id rows as one batch padded on the left.

    Args:
        rows: the id rows (any lengths).
        pad: fills the padding.
        device: where the tensors go.
        min_width: the least width (the longest row's length otherwise).

    Returns:
        ``(ids [b, L], mask [b, L])`` long tensors.
    """
    return padded_rows(rows, pad, left=True, device=device, min_width=min_width)


def padded_rows(
    rows: Sequence[Sequence[int]],
    pad: int,
    *,
    left: bool,
    device: torch.device | str = "cpu",
    min_width: int = 0,
) -> tuple[Tensor, Tensor]:
    """Token id rows as one batch padded on the left or the right (:func:`left_padded`'s
    arguments; ``left=False`` for a classifier that reads each row's last real token).

    Returns:
        ``(ids [b, L], mask [b, L])`` long tensors.
    """
    width = max([min_width, *(len(r) for r in rows)])
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            cols = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, cols] = torch.as_tensor(r, dtype=torch.long)
            mask[i, cols] = 1
    return ids.to(device), mask.to(device)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Set logits outside the nucleus to ``-inf``.

    A token is kept when the probability of the tokens ranked strictly above it is below
    ``top_p``; the most likely token is always kept.

    Args:
        logits: ``[B, V]``.
        top_p: in ``(0, 1]``; 1 keeps everything.

    Returns:
        ``[B, V]`` filtered logits.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    above = probs.cumsum(dim=-1) - probs
    drop_sorted = above >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sampling_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """The logits of the distribution :func:`next_tokens` samples from.

    Divided by the temperature, then cut to the top-p nucleus (``-inf`` outside it), so
    ``softmax`` of the result is exactly the sampled distribution.

    Args:
        logits: ``[B, V]`` raw last-position logits.
        params: sampling parameters (``greedy`` is not handled here).

    Returns:
        ``[B, V]`` float logits.
    """
    return top_p_filter(logits.float() / params.temperature, params.top_p)


def sampled_logprobs(logits: Tensor, tokens: Tensor, params: SamplingParams) -> Tensor:
    """Log-probabilities of ``tokens`` under the distribution they were sampled from.

    With ``top_p < 1`` that is the nucleus renormalised, not the full softmax: a token
    sampled from a nucleus holding mass ``m`` has probability ``p / m``. Greedy picks are
    certain (log-prob 0).

    Args:
        logits: ``[B, V]`` raw last-position logits.
        tokens: ``[B]`` the tokens picked from them.
        params: the sampling parameters used.

    Returns:
        ``[B]`` float log-probs (``-inf`` for a token outside the nucleus).
    """
    if params.greedy:
        return torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    logp = torch.log_softmax(sampling_logits(logits, params), dim=-1)
    return logp.gather(-1, tokens[:, None]).squeeze(-1)


def next_tokens(
    logits: Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Tensor:
    """Pick one token per row from last-position logits.

    Args:
        logits: ``[B, V]``.
        params: sampling parameters.
        generator: the random source (None: torch's global one).

    Returns:
        ``[B]`` long token ids.
    """
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(sampling_logits(logits, params), -1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class GenerationStopped(Exception):
    """Raised inside :func:`generate` when its ``should_stop`` callback says so.

    Args:
        partial: the rows as far as they were sampled (``truncated`` marks the rows still
            decoding), so a partial rollout can continue them; None when no token was sampled.
    """

    def __init__(self, partial: RolloutBatch | None = None) -> None:
        super().__init__("generation stopped")
        self.partial = partial


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    params: SamplingParams,
    eos_token_id: int | Collection[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    *,
    with_logprobs: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> RolloutBatch:
    """Sample ``params.n`` responses per prompt.

    Args:
        model: a Hugging Face causal LM (switched to eval mode for the call, then restored).
        prompt_ids: ``[b, P]`` left-padded prompt ids.
        prompt_mask: ``[b, P]``.
        params: sampling parameters.
        eos_token_id: the EOS id, or several (a generation config's): sampling one stops a
            row; it is part of the response (its mask is 1).
        pad_token_id: fills a row after its EOS.
        generator: the random source for sampling.
        with_logprobs: also record each response token's log-prob under the distribution it
            was sampled from (:func:`sampled_logprobs`: temperature and top-p applied) as
            ``old_logprobs``, zero outside the response mask.
        should_stop: asked before every decoding step; ``True`` stops the generation there
            (the rows sampled so far travel in the exception).

    Returns:
        A :class:`RolloutBatch` of ``B = b * n`` rows with ``group_size = n``; ``R`` is the
        number of steps run (at most ``max_new_tokens``); ``truncated`` marks the rows that
        sampled no EOS within ``max_new_tokens``.

    Raises:
        GenerationStopped: ``should_stop`` returned ``True`` (its ``partial`` holds the rows
            sampled so far).
    """
    was_training = model.training
    model.eval()
    try:
        return _generate(
            model,
            prompt_ids,
            prompt_mask,
            params,
            (eos_token_id, pad_token_id),
            generator,
            with_logprobs,
            should_stop,
        )
    finally:
        model.train(was_training)


#: Finished rows are dropped from the decoding batch (and its KV cache) once they are at least
#: this share of the rows still decoded: each drop copies the cache, so a few rows are let run
#: on as padding rather than copying the cache at every step.
COMPACT_SHARE = 0.25


def _pick(
    logits: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    batch: int,
    rows: Tensor,
) -> Tensor:
    """Next tokens of the rows still decoded, drawn as if every row of the batch were.

    ``torch.multinomial`` with one sample is an exponential race: ``argmax(p / q)`` with
    ``q ~ Exp(1)`` drawn for the whole ``[batch, V]`` matrix. Drawing ``q`` for all ``batch``
    rows and using the ones of ``rows`` keeps every row's draw what it would be without
    compaction, so dropping finished rows never changes what is sampled.

    Args:
        logits: ``[b, V]`` last-position logits of the rows held.
        params: sampling parameters.
        generator: the random source (None: torch's global one).
        batch: the full batch size ``B``.
        rows: ``[b]`` full-batch index of each row held.

    Returns:
        ``[b]`` long token ids.
    """
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(sampling_logits(logits, params), -1)
    race = torch.empty((batch, probs.shape[-1]), dtype=probs.dtype, device=probs.device)
    race.exponential_(1, generator=generator)
    return (probs / race[rows]).argmax(dim=-1)


def _select_rows(past: Any, keep: Tensor) -> Any:
    """The KV cache restricted to batch rows ``keep``; None when the cache type cannot."""
    if hasattr(past, "batch_select_indices"):  # transformers' Cache classes: in place
        past.batch_select_indices(keep)
        return past
    if isinstance(past, tuple) and all(isinstance(layer, tuple) for layer in past):
        return tuple(tuple(t.index_select(0, keep) for t in layer) for layer in past)
    return None


def _generate(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    params: SamplingParams,
    eos_pad: tuple[int | Collection[int], int],
    generator: torch.Generator | None,
    with_logprobs: bool,
    should_stop: Callable[[], bool] | None,
) -> RolloutBatch:
    eos_token_id, pad_token_id = eos_pad
    ids = prompt_ids.repeat_interleave(params.n, dim=0)
    mask = prompt_mask.repeat_interleave(params.n, dim=0)
    batch, device = ids.shape[0], ids.device
    eos = torch.tensor(sorted(eos_ids(eos_token_id)), dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)  # full-batch index of each row still decoded
    tokens: list[Tensor] = []
    live: list[Tensor] = []
    logps: list[Tensor] = []
    attn, step_ids, pos, past = mask, ids, position_ids_from_mask(mask), None
    for _ in range(params.max_new_tokens):
        if should_stop is not None and should_stop():
            partial = _batch(ids, mask, tokens, live, logps, params, done) if tokens else None
            raise GenerationStopped(partial)
        out = model(
            input_ids=step_ids,
            attention_mask=attn,
            position_ids=pos,
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        held_done = done[rows]
        held = _pick(logits, params, generator, batch, rows)
        if with_logprobs:  # from the very logits sampled from: exact, no second forward pass
            lp = torch.zeros(batch, dtype=torch.float32, device=device)
            lp[rows] = torch.where(held_done, 0.0, sampled_logprobs(logits, held, params))
            logps.append(lp)
        held = torch.where(held_done, torch.full_like(held, pad_token_id), held)
        tok = torch.full((batch,), pad_token_id, dtype=held.dtype, device=device)
        tok[rows] = held
        live.append(~done)
        tokens.append(tok)
        done = done | torch.isin(tok, eos)
        if bool(done.all()):
            break
        finished = done[rows]
        n_finished = int(finished.sum())
        if n_finished and n_finished >= COMPACT_SHARE * rows.numel():
            keep = (~finished).nonzero().squeeze(-1)
            selected = _select_rows(past, keep)
            if selected is not None:  # a cache we cannot slice: finished rows decode padding
                past, rows, attn, pos = selected, rows[keep], attn[keep], pos[keep]
                held, finished = held[keep], finished[keep]
        attn = torch.cat([attn, (~finished).long()[:, None]], dim=1)
        step_ids, pos = held[:, None], pos[:, -1:] + 1
    return _batch(ids, mask, tokens, live, logps, params, done)


def _batch(
    ids: Tensor,
    mask: Tensor,
    tokens: list[Tensor],
    live: list[Tensor],
    logps: list[Tensor],
    params: SamplingParams,
    done: Tensor,
) -> RolloutBatch:
    """The decoding loop's columns as a batch (``truncated``: rows without an EOS yet)."""
    return RolloutBatch(
        prompt_ids=ids,
        prompt_mask=mask,
        response_ids=torch.stack(tokens, dim=1),
        response_mask=torch.stack(live, dim=1).float(),
        group_size=params.n,
        old_logprobs=torch.stack(logps, dim=1) if logps else None,
        truncated=~done,
    )


def eos_ids(eos_token_id: int | Collection[int]) -> frozenset[int]:
    """One EOS id or several, as a set."""
    if isinstance(eos_token_id, int):
        return frozenset((eos_token_id,))
    return frozenset(int(t) for t in eos_token_id)


def decode_responses(
    tokenizer: Any, batch: RolloutBatch, eos_token_id: int | Collection[int]
) -> list[str]:
    """The response texts, each cut before its EOS.

    Special tokens sampled mid-response (say ``<pad>``) stay in the text, so they cannot pass
    an exact-match reward by vanishing.

    Args:
        tokenizer: the tokenizer that encoded the prompts.
        batch: a generated batch.
        eos_token_id: the end-of-sequence id, or every id that ends a response (a generation
            config's EOS ids beside the tokenizer's).

    Returns:
        ``B`` strings.
    """
    stops = eos_ids(eos_token_id)
    rows = []
    for ids, m in zip(batch.response_ids.tolist(), batch.response_mask.tolist(), strict=True):
        kept = [t for t, keep in zip(ids, m, strict=True) if keep]
        if kept and kept[-1] in stops:
            kept = kept[:-1]
        rows.append(kept)
    return tokenizer.batch_decode(rows, skip_special_tokens=False)


@torch.no_grad()
def greedy_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    max_new_tokens: int,
    batch_size: int = 256,
    examples: Sequence[Any] | None = None,
    eos_ids: Collection[int] | None = None,
) -> float:
    """Share of evaluation prompts whose greedy response earns the full reward (>= 1).

    Args:
        model: the policy.
        tokenizer: its tokenizer (``eos_token_id`` and ``pad_token_id`` are read).
        task: a :class:`rltrain.tasks.Task` (``eval`` examples, ``reward(prompt, response)``).
        max_new_tokens: the generation budget (``rollout.max_new_tokens``).
        batch_size: prompts per forward pass.
        examples: score these instead of ``task.eval``.
        eos_ids: the ids that end a response, the rollout's own
            (:func:`rltrain.backends.generation.eos_token_ids`: a checkpoint's generation
            config adds end-of-turn ids), so evaluation scores the text training rewards;
            None: the tokenizer's EOS alone (a built model has no generation config).

    Returns:
        Accuracy in ``[0, 1]``.
    """
    items = list(task.eval if examples is None else examples)
    if not items:
        return 0.0
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    # the tokenizer encodes on the host; a policy on a GPU needs its prompts there
    weight = next(model.parameters(), None)
    device = weight.device if weight is not None else torch.device("cpu")
    stops = tuple(eos_ids) if eos_ids is not None else (tokenizer.eos_token_id,)
    correct = 0
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, [ex.prompt for ex in chunk])
        batch = generate(
            model, ids.to(device), mask.to(device), params, stops, tokenizer.pad_token_id
        )
        texts = decode_responses(tokenizer, batch, stops)
        correct += sum(task.reward(ex.prompt, t) >= 1.0 for ex, t in zip(chunk, texts, strict=True))
    return correct / len(items)
