"""``trainer.sampler=fifo|windowed``: the pure choice and the pooled pipeline, by hand."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from rltrain.runners.pipeline import GenerationPipeline
from rltrain.runners.pool import PooledPipeline
from rltrain.whatif.samplers import Pooled, age_limit, choose


def _p(generation: int, version: int, shard: int = 0) -> Pooled:
    return Pooled(generation, shard, version, version)


# ---------------------------------------------------------------------------- the choice
def test_age_limit_is_k_for_fifo_and_w_minus_one_for_windowed():
    assert age_limit("fifo", 3, None) == 3
    assert age_limit("windowed", 3, 1) == 0
    assert age_limit("windowed", 3, 3) == 2
    for sampler, window in [("in_order", None), ("windowed", None), ("windowed", 4)]:
        with pytest.raises(ValueError):
            age_limit(sampler, 3, window)


def test_choose_trains_the_freshest_and_drops_the_too_old():
    pool = [_p(0, 1), _p(1, 3), _p(2, 2), _p(3, 3), _p(4, 0)]
    c = choose(pool, step=4, want=2, limit=2)  # staleness 3, 1, 2, 1, 4
    assert c.train == (_p(1, 3), _p(3, 3))  # version 3, then generation order
    assert c.drop == (_p(0, 1), _p(4, 0))
    assert c.keep == (_p(2, 2),)


def test_choose_keeps_shards_of_one_version_in_generation_then_rank_order():
    pool = [_p(5, 1, shard=1), _p(4, 1, shard=1), _p(4, 1, shard=0), _p(5, 1, shard=0)]
    c = choose(pool, step=1, want=3, limit=0)
    assert c.train == (_p(4, 1, 0), _p(4, 1, 1), _p(5, 1, 0)) and c.keep == (_p(5, 1, 1),)


def test_choose_trains_nothing_when_too_few_are_young_enough():
    c = choose([_p(0, 0), _p(1, 1)], step=2, want=2, limit=1)
    assert c.train == () and c.drop == (_p(0, 0),) and c.keep == (_p(1, 1),)


# ---------------------------------------------------------------------- the pooled pipeline
class _Future:
    def __init__(self, refs: list[str]) -> None:
        self.running, self.refs = True, refs

    def done(self) -> bool:
        return not self.running

    def wait(self) -> None:
        self.running = False


class _Runner:
    """Records submissions; ``version`` is bumped by the test like an update."""

    def __init__(self, dp: int = 1) -> None:
        self.version, self.job = 0, self
        self.sizes = SimpleNamespace(samples_per_step=8 * dp, rollout_dp=dp)
        self.submitted: list[tuple[int, int, int]] = []  # (generation, expect, version)
        self.futures: list[_Future] = []

    def stage(self, component: str):
        return nullcontext()

    def submit_generation(self, step, expect, resume=False, policy=None) -> _Future:
        self.submitted.append((step, expect, self.version))
        dp = self.sizes.rollout_dp
        self.futures.append(_Future([f"g{step}r{r}" for r in range(dp)]))
        return self.futures[-1]


def _run(pipe, runner, steps: int, fast: bool) -> list[tuple[dict, list]]:
    """``fast``: every generation in flight completes while the actor trains."""
    out = []
    for step in range(steps):
        pipe.fill(step)
        if fast:
            for f in runner.futures:
                f.running = False
        gen = pipe.take(step)
        gen.future.wait()
        out.append((pipe.metrics(gen), gen.future.refs))
        runner.version = step + 1
    return out


def test_fifo_trains_the_freshest_generation_and_drops_the_aged():
    # k=2, generation outpaces training: three generations complete before every take
    runner = _Runner()
    pipe = PooledPipeline(runner, 2, "finish", "fifo")
    pipe.reset(0)
    out = _run(pipe, runner, 4, fast=True)
    metrics = [m for m, _ in out]
    assert [refs for _, refs in out] == [["g0r0"], ["g3r0"], ["g6r0"], ["g9r0"]]
    assert [m["rollout/staleness_max"] for m in metrics] == [0, 0, 0, 0]
    # step 3: g1 and g2 (version 0) are 3 versions old, past k=2: 2 shards x 8 samples
    assert [m["rollout/dropped_samples"] for m in metrics] == [0, 0, 0, 16]
    assert [m["rollout/pooled_samples"] for m in metrics] == [16, 32, 48, 48]
    assert pipe.dropped_total == 16
    # generations run ahead of the steps: each samples with (and expects) the newest weights
    assert runner.submitted[3:6] == [(3, 1, 1), (4, 1, 1), (5, 1, 1)]


def test_in_order_on_the_same_timeline_trains_older_batches():
    runner = _Runner()
    pipe = GenerationPipeline(runner, 2)  # type: ignore[arg-type]
    pipe.reset(0)
    out = _run(pipe, runner, 4, fast=True)
    assert [m["rollout/staleness_max"] for m, _ in out] == [0, 1, 2, 2]
    assert [m["rollout/dropped_samples"] for m, _ in out] == [0, 0, 0, 0]


def test_windowed_keeps_only_the_last_w_versions():
    runner = _Runner()
    pipe = PooledPipeline(runner, 2, "finish", "windowed", window=1)  # staleness 0 only
    pipe.reset(0)
    out = _run(pipe, runner, 3, fast=True)
    assert [refs for _, refs in out] == [["g0r0"], ["g3r0"], ["g6r0"]]
    # every version-older shard is dropped at the next step: g1, g2, then g4, g5
    assert [m["rollout/dropped_samples"] for m, _ in out] == [0, 16, 16]


def test_fifo_waits_for_the_oldest_generation_when_the_pool_is_short():
    # generation slower than training: nothing completes until it is waited for, so fifo
    # trains the generations in order, like in_order
    runner = _Runner()
    pipe = PooledPipeline(runner, 2, "finish", "fifo")
    pipe.reset(0)
    out = _run(pipe, runner, 4, fast=False)
    assert [refs for _, refs in out] == [["g0r0"], ["g1r0"], ["g2r0"], ["g3r0"]]
    assert [m["rollout/staleness_max"] for m, _ in out] == [0, 1, 2, 2]
    assert sum(m["rollout/dropped_samples"] for m, _ in out) == 0


def test_windowed_generates_afresh_when_everything_in_flight_is_too_old():
    runner = _Runner()
    pipe = PooledPipeline(runner, 2, "finish", "windowed", window=1)
    pipe.reset(0)
    out = _run(pipe, runner, 2, fast=False)
    # step 1: g1, g2 (version 0) complete one version old and are dropped; g3 (version 1,
    # submitted at the fill) trains
    assert [refs for _, refs in out] == [["g0r0"], ["g3r0"]]
    assert out[1][0]["rollout/dropped_samples"] == 16


def test_shards_of_two_ranks_and_the_horizon():
    runner = _Runner(dp=2)
    pipe = PooledPipeline(runner, 1, "finish", "fifo")
    pipe.reset(0, horizon=2)
    out = _run(pipe, runner, 2, fast=True)
    assert [refs for _, refs in out] == [["g0r0", "g0r1"], ["g1r0", "g1r1"]]
    # two steps need two generations: nothing is submitted past what the horizon trains
    assert [g for g, _, _ in runner.submitted] == [0, 1]
    assert out[1][0]["rollout/staleness_max"] == 1
