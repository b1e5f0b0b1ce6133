"""Which completed rollout shards a pipelined step trains on (``trainer.sampler``; pure logic).

With asynchronous rollout (``trainer.max_staleness = k >= 1``) the default sampler ``in_order``
trains step ``s`` on the generation submitted for step ``s`` (:class:`GenerationPipeline`). The
other samplers decouple generation from training (:class:`~rltrain.runners.pool.PooledPipeline`):
the rollout always has ``k + 1`` generations queued, every completed generation's rank shards go
into a pool, and each step takes the freshest shards of the pool:

- ``fifo``: a shard may train while its staleness (the step minus the version that sampled its
  first token) is at most ``k``; older shards are dropped.
- ``windowed``: only shards of the last ``W`` versions train (``trainer.sampler_window``, staleness
  at most ``W - 1``, ``1 <= W <= k``); older shards are dropped.

A shard is the unit: the complete prompt groups one rollout rank generated in one call (all of
its rows share their first version). Freshest first means the highest first version; shards of
one version go in generation order, then rank order.

Two users run this very choice: the runtime's pool and the what-if simulator's
(:class:`rltrain.whatif.events.PoolPipeline`), so ``mode=plan`` predicts the batches a run trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rltrain.config.schema import SAMPLERS

__all__ = ["SAMPLERS", "Choice", "Pooled", "age_limit", "choose"]


@dataclass(frozen=True)
class Pooled:
    """A completed rank shard waiting in the pool.

    Attributes:
        generation: the generation's submission index (its data index).
        shard: the rollout rank that generated it.
        version: the weight version of its first tokens.
        newest: the newest weight version that sampled any of its tokens
            (``partial_rollout=continue``; else ``version``).
    """

    generation: int
    shard: int
    version: int
    newest: int


@dataclass(frozen=True)
class Choice:
    """What one step does with the pool.

    Attributes:
        train: the shards the step trains (``want`` of them), or empty when the pool holds too
            few young enough: the step waits for another generation.
        drop: shards too old to train at this step or any later one.
        keep: young enough shards left in the pool for later steps.
    """

    train: tuple[Pooled, ...]
    drop: tuple[Pooled, ...]
    keep: tuple[Pooled, ...]


def age_limit(sampler: str, max_staleness: int, window: int | None) -> int:
    """The largest staleness a shard may train with.

    Args:
        sampler: ``fifo`` or ``windowed``.
        max_staleness: ``trainer.max_staleness`` (``k``).
        window: ``trainer.sampler_window`` (``W``, windowed only).

    Returns:
        ``k`` for ``fifo``, ``W - 1`` for ``windowed``.

    Raises:
        ValueError: another sampler, or ``windowed`` without a window in ``[1, k]`` (the config
            check refuses these before Ray starts).
    """
    if sampler == "fifo":
        return max_staleness
    if sampler == "windowed" and window is not None and 1 <= window <= max_staleness:
        return window - 1
    raise ValueError(f"no age limit for sampler {sampler!r} with window {window!r}")


def choose(pool: Sequence[Pooled], step: int, want: int, limit: int) -> Choice:
    """The freshest ``want`` shards of the pool young enough to train at ``step``.

    Args:
        pool: the completed shards not trained yet.
        step: the training step (the actor holds version ``step``).
        want: shards a step trains (the rollout's data-parallel size).
        limit: the largest staleness allowed (:func:`age_limit`).

    Returns:
        The :class:`Choice`; its ``train`` is empty when fewer than ``want`` shards qualify.
    """
    drop = tuple(p for p in pool if step - p.version > limit)
    young = sorted(
        (p for p in pool if step - p.version <= limit),
        key=lambda p: (-p.version, p.generation, p.shard),
    )
    if len(young) < want:
        return Choice((), drop, tuple(young))
    return Choice(tuple(young[:want]), drop, tuple(young[want:]))
