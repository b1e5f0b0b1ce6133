"""The pipelined schedule with a sampler (``trainer.sampler=fifo|windowed``).

Generation is decoupled from the steps: the rollout always has ``k + 1`` generations queued
(``trainer.max_staleness = k``), each with the newest weights when it is submitted and the
prompts of its own data index (generations are numbered in submission order, from the step the
schedule starts at). A completed generation's rank shards go into a pool; each step trains the
pool's freshest shards young enough for the sampler (:mod:`rltrain.whatif.samplers`) and drops
those too old, counted in ``rollout/dropped_samples``. When the pool holds too few, the step
waits for the oldest generation in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rltrain.runners.pipeline import GenerationPipeline, Generator
from rltrain.whatif.samplers import Pooled, age_limit, choose


@dataclass(frozen=True)
class Ready:
    """The chosen shards as a finished group future (``wait()``, ``refs``)."""

    shard_refs: tuple[Any, ...]

    @property
    def refs(self) -> list[Any]:
        return list(self.shard_refs)

    def wait(self) -> None:
        """The shards are complete: nothing to wait for."""

    def done(self) -> bool:
        return True


@dataclass(frozen=True)
class Drawn:
    """A step's training shards, drawn from the pool.

    Attributes:
        step: the step that trains them.
        future: their refs (:class:`Ready`).
        shards: what the pool knew of each (versions).
        dropped: samples dropped at this step (too old).
        pooled: samples left in the pool for later steps.
    """

    step: int
    future: Ready
    shards: tuple[Pooled, ...]
    dropped: int
    pooled: int


class PooledPipeline(GenerationPipeline):
    """Bounded-staleness schedule whose steps train the freshest completed shards.

    Args:
        stages: the step's stages (as for :class:`GenerationPipeline`; also ``sizes.rollout_dp``).
        max_staleness: ``k >= 1``.
        partial_rollout: ``trainer.partial_rollout``.
        sampler: ``fifo`` or ``windowed`` (``trainer.sampler``).
        window: ``trainer.sampler_window`` (windowed).
    """

    def __init__(
        self,
        stages: Generator,
        max_staleness: int,
        partial_rollout: str,
        sampler: str,
        window: int | None = None,
    ) -> None:
        super().__init__(stages, max_staleness, partial_rollout)
        self.sampler, self.limit = sampler, age_limit(sampler, max_staleness, window)
        self.want = stages.sizes.rollout_dp
        self.per_shard = stages.sizes.samples_per_step // self.want
        self.pool: dict[Pooled, Any] = {}  # shard -> its object ref

    def reset(self, step: int, horizon: int | None = None) -> None:
        super().reset(step, horizon)
        self.pool.clear()

    def fill(self, step: int) -> None:
        """Swap stale generations (``restart``/``continue``), pool the completed ones and
        keep ``k + 1`` in flight while the steps left need more."""
        self._restarts_at_fill = self._swap_stale() if self.restart or self.resume else 0
        self._harvest()
        while len(self.queue) < self.k + 1 and self._short(step):
            self._submit_next()

    def take(self, step: int) -> Drawn:  # type: ignore[override]
        """The freshest young enough shards for ``step``; waits for generations until the
        pool holds enough, dropping the ones too old on the way."""
        dropped = 0
        while True:
            self._harvest()
            choice = choose(list(self.pool), step, self.want, self.limit)
            for p in choice.drop:
                del self.pool[p]
            dropped += len(choice.drop) * self.per_shard
            if choice.train:
                break
            if not self.queue:  # every generation in flight was too old: generate afresh
                self._submit_next()
            self.queue[0].future.wait()
        refs = tuple(self.pool.pop(p) for p in choice.train)
        self.dropped_total += dropped
        return Drawn(step, Ready(refs), choice.train, dropped, len(self.pool) * self.per_shard)

    def metrics(self, gen: Drawn) -> dict[str, Any]:  # type: ignore[override]
        """The step record's ``rollout/*`` entries (as :meth:`GenerationPipeline.metrics`),
        over the shards trained, plus ``rollout/pooled_samples``."""
        first = min(p.version for p in gen.shards)
        out: dict[str, Any] = {
            "rollout/weight_version": first,
            "rollout/staleness": gen.step - first,
            "rollout/staleness_max": gen.step - first,  # the oldest shard trained
            "rollout/dropped_samples": gen.dropped,
            "rollout/pooled_samples": gen.pooled,
        }
        if self.restart:
            out["rollout/restarts"] = self._restarts_at_fill
        if self.resume:
            out["rollout/continued"] = self._restarts_at_fill
            out["rollout/newest_version"] = max(p.newest for p in gen.shards)
        return out

    # ------------------------------------------------------------------------------ helpers
    def _expect(self, step: int) -> int:
        return self.stages.version  # a generation runs ahead of the steps: the newest weights

    def _short(self, step: int) -> bool:
        """Whether the pool and the generations in flight hold fewer shards than the steps
        left to the horizon train (always, without a horizon)."""
        if self.horizon is None:
            return True
        have = len(self.pool) + len(self.queue) * self.want
        return have < (self.horizon - step) * self.want

    def _submit_next(self) -> None:
        self.queue.append(self._submit(self.next_step))
        self.next_step += 1

    def _harvest(self) -> None:
        """Move completed generations' shards into the pool."""
        for g in [g for g in self.queue if g.future.done()]:
            self.queue.remove(g)
            for rank, ref in enumerate(g.future.refs):
                self.pool[Pooled(g.step, rank, g.first_version, g.version)] = ref
