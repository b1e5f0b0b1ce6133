"""The bounded-staleness generation schedule (``GenerationPipeline``), as pure logic.

A stand-in runner records what the pipeline submits; the test plays the actor by bumping the
runner's weight version after each step, and decides which generations are still running.
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from rltrain.errors import ConfigError, WorkerError
from rltrain.runners.pipeline import GenerationPipeline


class _Future:
    """A generation's future; ``running`` says whether it is still in flight."""

    def __init__(self) -> None:
        self.running = True
        self.refs: list = []  # no Ray refs: cancelling touches nothing

    def done(self) -> bool:
        return not self.running

    def wait(self) -> None:
        self.running = False


class _FakeRunner:
    """Records what the pipeline submits; ``version`` is bumped by the test like an update."""

    def __init__(self) -> None:
        self.version = 0
        self.submitted: list[tuple[int, int, int]] = []  # (step, expect, version sent)
        self.futures: list[_Future] = []
        self.resumed: list[int] = []  # steps submitted to continue a paused generation
        self.job = self
        self.sizes = SimpleNamespace(samples_per_step=8)

    def stage(self, component: str):
        return nullcontext()

    def submit_generation(
        self, step: int, expect: int, resume: bool = False, policy: str | None = None
    ) -> _Future:
        self.submitted.append((step, expect, self.version))
        if resume:
            self.resumed.append(step)
        self.futures.append(_Future())
        return self.futures[-1]


def _schedule(
    k: int, steps: int, start: int = 0, partial: str = "finish", finish_before_swap=()
) -> tuple[_FakeRunner, GenerationPipeline, list[dict]]:
    """Run ``steps`` steps; generations finish when taken, or before the swap of the steps in
    ``finish_before_swap`` (they end while the actor trains)."""
    runner = _FakeRunner()
    runner.version = start
    pipe = GenerationPipeline(runner, k, partial)  # type: ignore[arg-type]
    pipe.reset(start, horizon=start + steps)
    records = []
    for step in range(start, start + steps):
        pipe.fill(step)
        gen = pipe.take(step)
        gen.future.wait()
        records.append(pipe.metrics(gen))
        if step in finish_before_swap:
            for f in runner.futures:
                f.running = False
        runner.version = step + 1  # the update exports version step + 1
    assert not pipe.queue  # the horizon stops generation at the last step
    return runner, pipe, records


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (1, [0, 0, 1, 2, 3, 4]),
        (2, [0, 0, 0, 1, 2, 3]),
        (3, [0, 0, 0, 0, 1, 2]),
    ],
)
def test_finish_samples_with_versions_at_most_k_old(k, expected):
    runner, _, records = _schedule(k, 6)
    assert [r["rollout/weight_version"] for r in records] == expected
    assert [r["rollout/staleness"] for r in records] == [min(s, k) for s in range(6)]
    assert not any("rollout/restarts" in r for r in records)  # finish: nothing restarts
    # the rollout is told to refuse anything older than step - k
    assert [e for _, e, _ in runner.submitted] == [max(s - k, 0) for s in range(6)]


def test_schedule_resumes_from_a_later_step():
    runner, _, records = _schedule(1, 3, start=5)
    assert [r["rollout/weight_version"] for r in records] == [5, 5, 6]
    assert [s for s, _, _ in runner.submitted] == [5, 6, 7]


def test_schedule_refuses_a_skipped_step():
    pipe = GenerationPipeline(_FakeRunner(), 1)  # type: ignore[arg-type]
    pipe.fill(0)
    pipe.take(0)
    with pytest.raises(WorkerError, match="step 2 trains next"):
        pipe.take(2)


def test_restart_resubmits_running_generations_with_the_new_weights():
    # k=1, every generation still running at the swap: each step's batch is restarted once
    runner, pipe, records = _schedule(1, 4, partial="restart")
    assert [r["rollout/staleness"] for r in records] == [0, 0, 0, 0]
    assert [r["rollout/restarts"] for r in records] == [0, 1, 1, 1]
    assert pipe.restarts_total == 3
    # (step, expect, version): step t first goes out with version t-1, then again with t
    assert runner.submitted == [
        (0, 0, 0),
        (1, 0, 0),
        (1, 0, 1),
        (2, 1, 1),
        (2, 1, 2),
        (3, 2, 2),
        (3, 2, 3),
    ]


def test_restart_keeps_generations_that_finished_before_the_swap():
    # step 1's generation ends while step 0 trains: it is stale but kept; the others restart
    _, pipe, records = _schedule(1, 4, partial="restart", finish_before_swap={0})
    assert [r["rollout/staleness"] for r in records] == [0, 1, 0, 0]
    assert [r["rollout/restarts"] for r in records] == [0, 0, 1, 1]
    assert pipe.restarts_total == 2


def test_restart_with_k_2_resubmits_in_step_order_and_bounds_staleness():
    runner, _, records = _schedule(2, 5, partial="restart")
    # at every swap both queued generations restart; the step's own one carries the newest
    assert [r["rollout/staleness"] for r in records] == [0, 0, 0, 0, 0]
    assert [r["rollout/restarts"] for r in records] == [0, 2, 2, 2, 1]
    steps = [s for s, _, _ in runner.submitted]
    assert steps == [0, 1, 2, 1, 2, 3, 2, 3, 4, 3, 4, 4]
    assert all(v >= s - 2 for s, _, v in runner.submitted)


def test_continue_resubmits_paused_generations_and_counts_staleness_from_the_first_version():
    # k=1, every generation still running at the swap: each is paused and continued once with
    # the new weights; its staleness still counts from the version that started it
    runner, pipe, records = _schedule(1, 4, partial="continue")
    assert runner.submitted == [
        (0, 0, 0),
        (1, 0, 0),
        (1, 0, 1),
        (2, 1, 1),
        (2, 1, 2),
        (3, 2, 2),
        (3, 2, 3),
    ]
    assert runner.resumed == [1, 2, 3]  # the second submissions continue, none restarts
    assert [r["rollout/continued"] for r in records] == [0, 1, 1, 1]
    assert [r["rollout/weight_version"] for r in records] == [0, 0, 1, 2]
    assert [r["rollout/newest_version"] for r in records] == [0, 1, 2, 3]
    assert [r["rollout/staleness"] for r in records] == [0, 1, 1, 1]
    assert [r["rollout/staleness_max"] for r in records] == [0, 1, 1, 1]
    assert [r["rollout/dropped_samples"] for r in records] == [0, 0, 0, 0]
    assert not any("rollout/restarts" in r for r in records)


def test_continue_with_k_2_keeps_every_sample_within_the_bound():
    runner, _, records = _schedule(2, 5, partial="continue")
    # step t starts at fill(t - 2) with version t - 2 and is continued at each later swap
    assert [r["rollout/weight_version"] for r in records] == [0, 0, 0, 1, 2]
    assert [r["rollout/staleness"] for r in records] == [0, 1, 2, 2, 2]
    assert [r["rollout/continued"] for r in records] == [0, 2, 2, 2, 1]
    assert runner.resumed == [1, 2, 2, 3, 3, 4, 4]


def test_a_batch_past_the_bound_is_dropped_and_generated_again():
    runner = _FakeRunner()
    runner.version = 2
    pipe = GenerationPipeline(runner, 1, "finish")  # type: ignore[arg-type]
    pipe.reset(3)
    pipe.fill(3)  # steps 3 and 4 with version 2
    pipe.take(3).future.wait()
    runner.version = 4  # two updates landed without a fill between (nothing in the loop does)
    gen = pipe.take(4)  # 4 - 2 = 2 > k: dropped, generated again with version 4
    record = pipe.metrics(gen)
    assert record["rollout/dropped_samples"] == 8 and pipe.dropped_total == 8
    assert record["rollout/staleness_max"] == 0 and runner.submitted[-1] == (4, 3, 4)


def test_reset_cancels_what_is_still_running():
    runner = _FakeRunner()
    pipe = GenerationPipeline(runner, 2)  # type: ignore[arg-type]
    pipe.fill(0)
    assert len(pipe.queue) == 3
    pipe.reset(7)
    assert not pipe.queue and pipe.next_step == 7


def test_unknown_partial_rollout_is_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"trainer.partial_rollout='sometimes'.*'restart'"):
        GenerationPipeline(_FakeRunner(), 1, "sometimes")  # type: ignore[arg-type]
