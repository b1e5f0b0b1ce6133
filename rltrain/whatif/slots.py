"""Decoding slots across generate calls: the buffer of ``trainer.partial_rollout=carry``
(pure logic, no torch).

A static batch decodes until its longest row ends, so with heavy-tailed lengths most of its
slots idle behind a few long rows. With ``carry`` a rollout rank keeps a buffer of prompt groups
across its calls and decodes them the way partial-rollout systems do:

- the device has ``slots`` decoding slots (the rows one call is given); a row waits for a free
  slot, then decodes in *segments* of at most ``segment`` tokens; at a segment's end the rows
  that finished leave and waiting rows take their slots (continuous batching at segment
  boundaries: a slot whose row ends mid-segment idles until the boundary);
- a call admits its new prompt groups behind the rows already waiting or decoding; free slots
  go to the rows of the oldest groups first (by the version they started with), so carried
  rows never wait behind new prompts;
- a call ends once ``want`` groups are complete (every one of a group's ``n`` rows ended: GRPO
  needs them all) *and* every group the next call would drop is complete (its *deadline*:
  groups started before the next call's oldest version, ``due``); it hands on the ``want``
  oldest complete groups, and the rest stays for later calls. The deadline turns what the bound
  would throw away into a longer call: a long row is finished rather than dropped and sampled
  again (which would also bias the trained responses towards short ones);
- the strict per-sample bound: a call for step ``s`` first drops every group started with a
  version older than ``s - max_staleness`` (waiting, decoding or complete): it could never
  train within the bound. With the deadline this only happens to a complete group that more
  than ``want`` due groups crowded out. Its rows' tokens count as discarded, and the rollout
  samples its prompt again with the newest weights (so the buffer keeps its surplus of groups).

The buffer schedules slots and segments; it sees lengths only. On the modelled device
(``simulate.response_length_median``) a row's length is drawn in advance and the buffer decodes
it by arithmetic; on the torch engine a row's budget is ``rollout.max_new_tokens`` and a
*decoder* (:data:`Decoder`) decodes each segment for real and says which rows sampled their EOS.
The rollout keeps each group's rows under the group's key. The what-if simulator's carry
schedule (:class:`rltrain.whatif.events.CarryPipeline`) runs the very same buffer by arithmetic,
so a plan's prediction of ``carry`` decodes the segments a modelled run decodes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: ``decode(rows, seg)``: decodes the ``(key, row)`` pairs holding slots for at most ``seg``
#: steps and returns the rows that ended before their budget (an EOS), each with the steps it
#: decoded; the other rows decoded ``seg`` steps (or to their budget, if less).
Decoder = Callable[[list[tuple[int, int]], int], dict[tuple[int, int], int]]
#: ``trainer.carry_segment`` unset: decoding steps between two re-packings of the slots.
DEFAULT_SEGMENT = 4


@dataclass(frozen=True)
class Segmented:
    """What one call's decoding did.

    Attributes:
        ready: keys of the groups handed on (``want`` of them, oldest version first).
        dropped: keys of the groups dropped for the bound.
        steps: decoding steps the call took (the device time is ``steps`` x token latency).
        busy: row-steps decoded (a row decoding one token for one step is one row-step).
        slot_steps: ``slots x steps``: the call's slot capacity; ``1 - busy / slot_steps`` is
            the share of slots idle while it decoded.
    """

    ready: tuple[int, ...]
    dropped: tuple[int, ...]
    steps: int
    busy: int
    slot_steps: int


@dataclass
class _Group:
    key: int
    version: int
    left: list[int]  # decoding steps each row still needs, in row order
    decoding: set[int] = field(default_factory=set)  # rows holding a slot

    @property
    def complete(self) -> bool:
        return not any(self.left)


class CarryBuffer:
    """Prompt groups in flight on one rollout rank, across its generate calls.

    Args:
        slots: rows the device decodes at once (the rows of one call).
        segment: the most decoding steps between two re-packings of the slots (``>= 1``).

    Raises:
        ValueError: ``slots`` or ``segment`` below 1.
    """

    def __init__(self, slots: int, segment: int) -> None:
        if slots < 1 or segment < 1:
            raise ValueError(f"slots={slots} and segment={segment} must be at least 1")
        self.slots, self.segment = slots, segment
        self.groups: dict[int, _Group] = {}  # admission order

    def admit(self, key: int, version: int, lengths: Sequence[int]) -> None:
        """Queue a new prompt group: ``lengths`` are its rows' decoding steps (0 ends at once).

        Raises:
            ValueError: the key is held already.
        """
        if key in self.groups:
            raise ValueError(f"group {key} is already in the buffer")
        self.groups[key] = _Group(key, version, [max(int(n), 0) for n in lengths])

    def stamp(self, key: int, version: int) -> None:
        """Set the version group ``key`` counts its staleness from: on the torch engine a group
        waits without a token until its rows decode, so it takes the weights held until its
        first token is sampled."""
        self.groups[key].version = version

    def held(self) -> list[int]:
        """Keys of the groups held (any state), in admission order."""
        return list(self.groups)

    def carried_rows(self) -> int:
        """Rows still to decode (waiting or decoding)."""
        return sum(1 for g in self.groups.values() for n in g.left if n)

    def run(
        self, want: int, oldest: int, decode: Decoder | None = None, due: int | None = None
    ) -> Segmented:
        """Decode until ``want`` groups are complete and no group past its deadline is left;
        hand ``want`` of them on.

        Args:
            want: groups the call hands on.
            oldest: the oldest version a group may have started with (``step - k``); older
                groups are dropped first.
            decode: decodes each segment for real (rows end at their EOS); None: rows end
                after the steps they were admitted with.
            due: groups started before this version complete in this call, however long
                their rows (the next call's ``oldest``: it would drop them); None: ``oldest + 1``,
                or ``oldest`` with ``want=0`` (a call that hands nothing on only drops).

        Returns:
            The :class:`Segmented` record; ``ready`` holds fewer than ``want`` keys only when
            the buffer ran out of groups.
        """
        dropped = tuple(k for k, g in self.groups.items() if g.version < oldest)
        for k in dropped:
            del self.groups[k]
        due = (oldest + 1 if want else oldest) if due is None else due
        steps = busy = 0
        while (self._complete_count() < want or self._open_before(due)) and self._fill():
            seg = min(self.segment, max(self._decoding_left()))
            rows = [(g.key, r) for g in self.groups.values() for r in sorted(g.decoding)]
            ended = decode(rows, seg) if decode is not None else {}
            steps += seg
            for key, row in rows:
                g = self.groups[key]
                busy += ended.get((key, row), min(g.left[row], seg))
                g.left[row] = 0 if (key, row) in ended else max(g.left[row] - seg, 0)
                if not g.left[row]:
                    g.decoding.discard(row)
        ready = sorted(
            (g for g in self.groups.values() if g.complete), key=lambda g: (g.version, g.key)
        )[:want]
        for g in ready:
            del self.groups[g.key]
        return Segmented(tuple(g.key for g in ready), dropped, steps, busy, steps * self.slots)

    def _complete_count(self) -> int:
        return sum(g.complete for g in self.groups.values())

    def _open_before(self, due: int) -> bool:
        return any(g.version < due and not g.complete for g in self.groups.values())

    def _decoding_left(self) -> list[int]:
        return [g.left[r] for g in self.groups.values() for r in g.decoding]

    def _fill(self) -> bool:
        """Give free slots to waiting rows, the oldest groups' first (version, then admission
        order); whether any row is decoding."""
        free = self.slots - sum(len(g.decoding) for g in self.groups.values())
        for g in sorted(self.groups.values(), key=lambda g: (g.version, g.key)):
            for row, n in enumerate(g.left):
                if free and n and row not in g.decoding:
                    g.decoding.add(row)
                    free -= 1
        return any(g.decoding for g in self.groups.values())


def call_steps(
    lengths: Any,
    slots: int,
    n: int,
    bound: int,
    surplus: int = 1,
    segment: int = DEFAULT_SEGMENT,
    calls: int = 400,
    seed: int = 0,
) -> float:
    """The mean decoding steps of a ``carry`` call over a long run, by the pipeline's own rule
    on one rollout rank: the buffer is primed with ``surplus`` steps' groups; the call for
    step ``s`` (holding version ``s - 1``) drops the groups older than ``s - bound`` and
    samples them again, samples one step's groups, and decodes until a step's groups are
    complete and none the next call would drop is open (the deadline). The cost model of
    ``placement=auto`` compares it with a static batch's longest row (:func:`carry_share`).

    Args:
        lengths: the response-length model (``sample(rng, n) -> list[int]``).
        slots: rows one call decodes at once (the rank's rows per step).
        n: rows per group (``rollout.n_samples_per_prompt``).
        bound: ``trainer.max_staleness``.
        surplus: ``trainer.carry_surplus``.
        segment: ``trainer.carry_segment``.
        calls: calls run (the first ``bound`` are left out of the mean: the buffer fills).
        seed: the lengths' seed.

    Returns:
        Decoding steps per call.
    """
    rng, want = random.Random(seed), max(slots // max(n, 1), 1)
    buf, keys = CarryBuffer(slots, segment), itertools.count()

    def admit(groups: int, version: int) -> None:
        for _ in range(groups):
            buf.admit(next(keys), version, lengths.sample(rng, n))

    admit(want * surplus, 0)
    steps = 0
    for s in range(calls):
        oldest = max(s - bound, 0)
        admit(len(buf.run(0, oldest).dropped) + want, max(s - 1, 0))
        done = buf.run(want, oldest, due=max(s + 1 - bound, 0))
        steps += done.steps if s >= bound else 0
    return steps / max(calls - bound, 1)


def carry_share(
    lengths: Any, slots: int, n: int, bound: int, surplus: int = 1, segment: int = DEFAULT_SEGMENT
) -> float:
    """A ``carry`` call's decoding steps over a static batch's (its longest row, on average):
    the share of a static batch's generation time a ``carry`` call takes (:func:`call_steps`
    over :func:`rltrain.whatif.lengths.expected_max`; 1 with one slot or no tail)."""
    from rltrain.whatif.lengths import expected_max

    longest = expected_max(lengths, slots)
    if slots <= 1 or longest <= 0:
        return 1.0
    return min(call_steps(lengths, slots, n, bound, surplus, segment) / longest, 1.0)
