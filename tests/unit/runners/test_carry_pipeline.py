"""The pipeline with ``trainer.partial_rollout=carry`` (pure logic, a stand-in runner): it
primes the rollout's buffer once, runs one generation ahead, samples the next step's prompts
and sends the bound the rollout drops carried groups by."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

from rltrain.runners.pipeline import GenerationPipeline


class _Done:
    refs: list = []

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        pass


class _Runner:
    def __init__(self) -> None:
        self.version = 0
        self.job = self
        self.sizes = SimpleNamespace(samples_per_step=8)
        self.sent: list[tuple] = []  # (step, expect, version, oldest, due, data step, hand on)
        self.primes: list[tuple] = []  # a prime call's (extend, segment)

    def stage(self, component: str):
        return nullcontext()

    def submit_generation(
        self,
        step: int,
        expect: int,
        resume: bool = False,
        policy: str | None = None,
        oldest_version: int | None = None,
        data_step: int | None = None,
        hand_on: bool = True,
        due_version: int | None = None,
        extend: bool = False,
        segment: int | None = None,
    ) -> _Done:
        assert policy == "carry" and not resume
        if not hand_on:
            self.primes.append((extend, segment))
        self.sent.append(
            (step, expect, self.version, oldest_version, due_version, data_step, hand_on)
        )
        return _Done()


def _steps(pipe: GenerationPipeline, runner: _Runner, steps: int) -> None:
    """Run ``steps`` steps from a fresh buffer: fill, take the step's rows, new weights."""
    pipe.reset(0, horizon=steps)
    for step in range(steps):
        pipe.fill(step)
        assert pipe.take(step).step == step
        runner.version = step + 1


def test_carry_primes_once_runs_one_ahead_and_sends_the_bound():
    runner = _Runner()
    pipe = GenerationPipeline(runner, 2, "carry")  # type: ignore[arg-type]
    _steps(pipe, runner, 4)
    assert runner.sent == [
        (-1, 0, 0, None, None, 0, False),  # primes the buffer with step 0's prompts
        (0, 0, 0, 0, 0, 1, True),
        (1, 0, 0, 0, 0, 2, True),
        # one ahead: expect step - 1; carried groups from version 0 on, those of version 0
        # finished in this call (the next one keeps version 1 on)
        (2, 1, 1, 0, 1, 3, True),
        (3, 2, 2, 1, 2, 4, True),
    ]
    pipe.reset(4)
    pipe.fill(4)
    # a reset primes a new buffer (with the weights held now), then two steps go out again
    assert runner.sent[-3:] == [
        (3, 3, 4, None, None, 4, False),
        (4, 3, 4, 2, 3, 5, True),
        (5, 4, 4, 3, 4, 6, True),
    ]


def test_a_deeper_surplus_primes_one_call_per_step_and_samples_as_far_ahead():
    runner = _Runner()
    pipe = GenerationPipeline(runner, 4, "carry", carry_surplus=3, carry_segment=1)  # type: ignore[arg-type]
    _steps(pipe, runner, 2)
    assert runner.sent == [
        # three prime calls, each its own step (seed), sampling steps 0, 1 and 2's prompts
        (-3, 0, 0, None, None, 0, False),
        (-2, 0, 0, None, None, 1, False),
        (-1, 0, 0, None, None, 2, False),
        # then each call samples 3 steps ahead of the one it hands on
        (0, 0, 0, 0, 0, 3, True),
        (1, 0, 0, 0, 0, 4, True),
    ]
    # the first starts a new buffer with the segment, the others add to it
    assert runner.primes == [(False, 1), (True, 1), (True, 1)]


def test_other_policies_keep_k_ahead_and_send_no_carry_arguments():
    pipe = GenerationPipeline(_Runner(), 2, "finish")  # type: ignore[arg-type]
    assert pipe.ahead == 2 and pipe._carry_args(5) == {
        "oldest_version": 3,
        "due_version": 4,
        "data_step": 6,
    }


class _Shards(_Done):
    def __init__(self, shards: list) -> None:
        self.shards = shards

    def wait(self) -> list:  # type: ignore[override]
        return self.shards


def test_an_early_stop_counts_the_groups_ahead_and_those_still_buffered():
    import torch

    from rltrain.algorithms.batch import RolloutBatch
    from rltrain.runners.pipeline import InFlight
    from rltrain.runners.schedules import PipelinedSchedule

    runner, asked = _Runner(), []
    runner.run = SimpleNamespace(
        trainer=SimpleNamespace(sampler="in_order", carry_surplus=None, carry_segment=None)
    )
    runner.finish_weight_sync = lambda: asked.append("sync")
    lefts = [{"groups": 2, "tokens": 5}, {"groups": 1, "tokens": 0}]  # two rollout ranks
    runner.g = SimpleNamespace(
        need=lambda name: SimpleNamespace(
            call=lambda method: asked.append(method.__name__) or SimpleNamespace(wait=lambda: lefts)
        )
    )
    schedule = PipelinedSchedule(runner, 2, "carry")  # type: ignore[arg-type]
    ones = torch.ones(4, 3)  # a shard of 2 groups of 2 rows, 12 tokens
    shard = RolloutBatch(ones.long(), ones.long(), ones.long(), ones, group_size=2)
    # the generation of the step after the last trained one, already handed on: never read
    schedule.pipeline.queue.append(InFlight(7, 6, _Shards([shard, None]), 0))
    schedule.end(7, clean=True)
    assert asked == ["carry_left", "sync"]
    assert schedule.left_at_end == {"groups": 2 + 3, "tokens": 12 + 5}
    assert not schedule.pipeline.queue
