"""Length-aware dispatch of a step's prompts over the rollout ranks (``rollout.dispatch``).

``in_order`` (the default) gives rank ``r`` the ``r``-th contiguous slice of the step's prompts,
in data order. ``length_aware`` keeps an expected response length per prompt and:

1. **Expects.** A prompt's expected length is a moving average of the mean response length of
   its past groups (:data:`DECAY`: the weight of the older average). A prompt never seen gets
   the moving average over every group seen so far; before any group was seen, nothing is
   expected and the dispatch is ``in_order``'s.
2. **Packs** (longest processing time first). The prompts, longest expected first (ties in data
   order), each go to the rank whose expected tokens so far are fewest among the ranks that still
   have room (ties: the lowest rank); every rank gets the same number of prompts.
3. **Orders.** Within a rank, prompts go to the engine longest expected first.

Pure logic: the runner owns one :class:`Dispatcher`, which splits every generation's prompts
and learns from its scores.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch

from rltrain.config.schema import DISPATCHES

__all__ = ["DECAY", "DISPATCHES", "Dispatcher", "LengthModel", "pack"]

#: Weight of the previous average in each moving-average update.
DECAY = 0.5


class LengthModel:
    """Expected response length per prompt: a moving average over its past groups."""

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self.per_prompt: dict[str, float] = {}
        self.overall: float | None = None  # over every group seen

    def expected(self, prompt: str) -> float | None:
        """The prompt's expected response length (tokens), the overall average for a prompt
        never seen, or None before any group was seen."""
        return self.per_prompt.get(prompt, self.overall)

    def observe(self, prompt: str, mean_length: float) -> None:
        """Fold in one group's mean response length (its first group sets the average)."""
        self.per_prompt[prompt] = self._folded(self.per_prompt.get(prompt), mean_length)
        self.overall = self._folded(self.overall, mean_length)

    def _folded(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new


def pack(expected: Sequence[float | None], ranks: int) -> list[list[int]]:
    """Prompt indices per rank (longest expected first), equal counts, by LPT.

    Args:
        expected: each prompt's expected length, in data order (None: nothing known).
        ranks: rollout ranks; ``len(expected)`` is a multiple of it.

    Returns:
        ``ranks`` lists of indices into ``expected``. With nothing expected, the contiguous
        data-order slices (``in_order``).

    Raises:
        ValueError: the prompts do not split evenly over the ranks.
    """
    if len(expected) % ranks:
        raise ValueError(f"{len(expected)} prompts do not split evenly over {ranks} ranks")
    per_rank = len(expected) // ranks
    if all(e is None for e in expected):
        return [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(ranks)]
    known = [e for e in expected if e is not None]
    fill = sum(known) / len(known)  # a prompt of unknown length counts as the average
    lengths = [fill if e is None else e for e in expected]
    out: list[list[int]] = [[] for _ in range(ranks)]
    load = [0.0] * ranks
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: data order ties
        r = min((r for r in range(ranks) if len(out[r]) < per_rank), key=lambda r: load[r])
        out[r].append(i)
        load[r] += lengths[i]
    return out


class Dispatcher:
    """``length_aware`` dispatch for one run: splits prompts, remembers what each rollout shard
    was sent, and learns the lengths from the shards' scores.

    Args:
        group_size: samples per prompt (a shard's rows are its prompts' groups, in order).
        remember: shards whose prompts are kept until scored (older ones are forgotten: a
            cancelled or dropped shard is never scored).
    """

    def __init__(self, group_size: int, remember: int = 256) -> None:
        self.lengths = LengthModel()
        self.group_size, self.remember = group_size, remember
        self._sent: OrderedDict[Hashable, list[str]] = OrderedDict()

    def split(self, prompts: Sequence[str], ranks: int) -> list[list[str]]:
        """The prompts of one generation per rank (:func:`pack`)."""
        plan = pack([self.lengths.expected(p) for p in prompts], ranks)
        return [[prompts[i] for i in rank] for rank in plan]

    def sent(self, keys: Sequence[Hashable], per_rank: Sequence[list[str]]) -> None:
        """Remember the prompts each shard (``keys``: its object refs) was sent."""
        for key, prompts in zip(keys, per_rank, strict=True):
            self._sent[key] = list(prompts)
        while len(self._sent) > self.remember:
            self._sent.popitem(last=False)

    def observe(self, keys: Sequence[Hashable], tokens: Sequence[torch.Tensor]) -> dict[str, float]:
        """Fold in the shards' response lengths (``tokens``: ``[b]`` per shard).

        Returns:
            ``rollout/length_groups``: the groups folded in; ``rollout/length_known``: the share
            of them whose prompt had its own expected length; ``rollout/length_error``: their
            mean ``|expected - observed|`` group mean length (tokens), absent when none had one.
        """
        errors: list[float] = []
        groups = 0
        for key, shard in zip(keys, tokens, strict=True):
            prompts = self._sent.pop(key, None)
            if prompts is None:  # not sent by this dispatcher (forgotten)
                continue
            means = shard.float().view(len(prompts), self.group_size).mean(dim=1).tolist()
            for prompt, mean in zip(prompts, means, strict=True):
                if prompt in self.lengths.per_prompt:
                    errors.append(abs(self.lengths.per_prompt[prompt] - mean))
                self.lengths.observe(prompt, mean)
                groups += 1
        out = {
            "rollout/length_groups": float(groups),
            "rollout/length_known": len(errors) / groups if groups else 0.0,
        }
        if errors:
            out["rollout/length_error"] = sum(errors) / len(errors)
        return out
